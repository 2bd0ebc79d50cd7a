// Philox4x32-10 (Salmon et al., SC'11) for host and device: the generator behind
// rlx::RngStream and the sampler's per-(seed, request, sample, position) uniform, callable
// from a kernel that must draw exactly the numbers the host draws.
//
//   double u = rlx::hd::philox_uniform(seed, request_hash, sample, position);  // [0, 1)
#pragma once

#include <cstdint>

#include "rlx/core/hd.hpp"

namespace rlx::hd {

struct Philox4 {
  uint32_t v[4];
};

// One block: 128 random bits for counter (c0..c3) under key (k0, k1).
RLX_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0, p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// 64 random bits to a uniform in [0, 1) with 53 of them.
RLX_HD double unit_double(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// Uniform in [0, 1) with 53 random bits, addressed by a 64-bit key and three 64-bit words:
// a and b fill the counter, c is folded into the key so all three words matter.
RLX_HD double philox_uniform(uint64_t key, uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t k = key ^ (c * 0x9E3779B97F4A7C15ull);
  const Philox4 out = philox4x32_10(static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32), static_cast<uint32_t>(b),
                                    static_cast<uint32_t>(b >> 32), static_cast<uint32_t>(k),
                                    static_cast<uint32_t>(k >> 32));
  return unit_double((static_cast<uint64_t>(out.v[0]) << 32) | out.v[1]);
}

}  // namespace rlx::hd
