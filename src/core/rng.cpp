#include "rlx/core/rng.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cmath>
#include <numbers>
#include <sstream>

#include "rlx/core/error.hpp"
#include "rlx/core/philox.hpp"

namespace rlx {

namespace {
// Block `block` of the counter space (block, stream): the stream's words 4 block .. 4 block + 3.
inline PhiloxCounter block_at(const RngStream::State& s, uint64_t block) {
  PhiloxCounter c = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                     static_cast<uint32_t>(s.stream), static_cast<uint32_t>(s.stream >> 32)};
  PhiloxKey k = {static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32)};
  return philox4x32(c, k);
}

// Word `i` of the stream.
inline uint32_t word_at(const RngStream::State& s, uint64_t i) { return block_at(s, i >> 2)[i & 3]; }
}  // namespace

// The generator itself is core/philox.hpp, which device code can call too.
PhiloxCounter philox4x32(PhiloxCounter c, PhiloxKey k) {
  const hd::Philox4 out = hd::philox4x32_10(c[0], c[1], c[2], c[3], k[0], k[1]);
  return {out.v[0], out.v[1], out.v[2], out.v[3]};
}

double philox_uniform(uint64_t key, uint64_t a, uint64_t b, uint64_t c) { return hd::philox_uniform(key, a, b, c); }

uint64_t hash_name(std::string_view name, uint64_t seed) { return XXH64(name.data(), name.size(), seed); }

uint32_t RngStream::next_u32() { return word_at(state_, state_.counter++); }

uint64_t RngStream::next_u64() {
  uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

double RngStream::uniform() { return hd::unit_double(next_u64()); }

int64_t RngStream::uniform_int(int64_t lo, int64_t hi) {
  RLX_CHECK(lo <= hi, "uniform_int: empty range [{}, {}]", lo, hi);
  uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;  // 0 means the full 2^64
  if (span == 0) return static_cast<int64_t>(next_u64());
  uint64_t limit = UINT64_MAX - (UINT64_MAX % span);  // reject the biased tail
  uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + x % span);
}

double RngStream::normal() {
  double u1 = uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void RngStream::fill_normal(float* out, size_t n, float mean, float std) {
  // The words next_u32() would give, each Philox block computed once for its four words.
  uint64_t cached = UINT64_MAX;
  PhiloxCounter block{};
  auto next = [&] {
    const uint64_t i = state_.counter++;
    if ((i >> 2) != cached) block = block_at(state_, cached = i >> 2);
    return block[i & 3];
  };
  for (size_t i = 0; i < n; ++i) {
    // 32-bit uniforms are plenty for weight initialisation and twice as cheap.
    double u1 = (static_cast<double>(next()) + 0.5) * 0x1.0p-32;
    double u2 = static_cast<double>(next()) * 0x1.0p-32;
    out[i] = mean + std * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }
}

RngStream RngStream::fork(std::string_view name) const {
  return RngStream(state_.seed, hash_name(name, state_.stream ^ 0x5DEECE66Dull));
}

std::string RngStream::serialize() const {
  return fmt::format("{} {} {}", state_.seed, state_.stream, state_.counter);
}

RngStream RngStream::deserialize(std::string_view text) {
  std::istringstream in{std::string(text)};
  State s;
  in >> s.seed >> s.stream >> s.counter;
  RLX_CHECK(!in.fail(), "invalid RNG state '{}': expected 'seed stream counter'", text);
  std::string rest;
  in >> rest;
  RLX_CHECK(rest.empty(), "invalid RNG state '{}': trailing text '{}'", text, rest);
  RngStream r;
  r.restore(s);
  return r;
}

}  // namespace rlx
