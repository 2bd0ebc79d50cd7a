// Seeded, checkpointable random streams on a counter-based generator (Philox4x32-10).
//
// A stream is fully described by (seed, stream id, counter): saving and restoring
// those three numbers resumes it exactly, and `fork("name")` derives an
// independent stream without consuming anything, so adding a consumer does not
// shift anybody else's random numbers.
//
//   rlx::RngStream data(seed, 0);
//   auto shuffle = data.fork("shuffle");
//   double u = shuffle.uniform();         // [0, 1)
//   auto saved = shuffle.state();         // ... later: shuffle.restore(saved);
//
// `philox_uniform(key, a, b, c)` is the same generator addressed directly, for
// randomness that must not depend on call order (per request, per position).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rlx {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// One Philox4x32-10 block (Salmon et al., SC'11): 128 random bits per counter.
PhiloxCounter philox4x32(PhiloxCounter counter, PhiloxKey key);

// Uniform in [0, 1) with 53 random bits, addressed by a 64-bit key and three 64-bit words.
double philox_uniform(uint64_t key, uint64_t a, uint64_t b, uint64_t c);

// 64-bit hash of a name (xxh64), for deriving stream ids from strings.
uint64_t hash_name(std::string_view name, uint64_t seed = 0);

class RngStream {
 public:
  struct State {
    uint64_t seed = 0;
    uint64_t stream = 0;
    uint64_t counter = 0;  // 32-bit words consumed so far
    bool operator==(const State&) const = default;
  };

  explicit RngStream(uint64_t seed = 0, uint64_t stream = 0) : state_{seed, stream, 0} {}

  uint32_t next_u32();
  uint64_t next_u64();
  // Uniform in [0, 1).
  double uniform();
  // Uniform integer in [lo, hi] (inclusive), unbiased.
  int64_t uniform_int(int64_t lo, int64_t hi);
  // Standard normal (Box-Muller on two uniforms).
  double normal();
  // Fills `out` with N(mean, std^2) values; consumes 2 words per value.
  void fill_normal(float* out, size_t n, float mean, float std);

  // An independent stream derived from this one's seed and stream id and `name`.
  RngStream fork(std::string_view name) const;

  State state() const { return state_; }
  void restore(const State& s) { state_ = s; }
  // "seed stream counter" as text, for checkpoints and logs; parse throws rlx::Error.
  std::string serialize() const;
  static RngStream deserialize(std::string_view text);

 private:
  State state_;
};

}  // namespace rlx
