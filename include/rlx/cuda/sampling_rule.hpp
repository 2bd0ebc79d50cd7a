// The sampling rule, written once for the CPU sampler (rollout/sampling.cpp) and the GPU
// sampler kernel (src/cuda/sampling.cu). For one row of logits x[0..V):
//
//   greedy (T = 0): the first index of the maximum; log-prob log_softmax(x)[token].
//   otherwise (T >= kMinTemperature; SamplingParams::validate refuses anything between):
//     z_i = x_i / T (fp32), m = max z, w_i = exp(z_i - m) in (0, 1] (fp32).
//     Each token's mass is an integer, q_i = floor(w_i * 2^40) (mass_units), so every sum
//     below is exact and its order does not matter: the CPU's sequential loop and the
//     kernel's parallel one give the same numbers for the same w.
//     log-prob of the drawn token = z_tok - m - log(sum_i q_i / 2^40)   (before truncation;
//     log_total_of_units: within vocab x 2^-40 of log(sum_i w_i), and the same in any order).
//     Truncation keeps the tokens with z_i >= t_k, z_i >= t_p and w_i >= min_p, where
//       t_k = the largest value with at least top_k tokens at or above it (the k-th
//             largest z, ties at the boundary kept);          top_k = 0: no bound
//       t_p = the largest value v with sum of q over {z >= max(v, t_k)} >= need, need =
//             floor(top_p * sum of q over {z >= t_k}) (top_p_need): the smallest set of most
//             likely tokens that holds top_p of the top-k mass, ties kept; top_p = 1: none
//       min_p keeps the tokens at least min_p times as likely as the most likely one.
//     The most likely token is always kept. Thresholds are found by a radix select over
//     order_key(z) (four 8-bit levels, radix_pick), never by sorting.
//     The draw is an inverse CDF in vocabulary order: with S the kept mass and
//     t = floor(u * S) (draw_target), the token is the first kept i whose running sum of
//     kept q exceeds t. A row with no mass at all (S = 0: logits that are not finite, or a
//     T outside the rule) draws its first maximum, as greedy does, rather than failing.
//
// The same u gives the same token on CPU and GPU unless a w_i differs between the two
// exp implementations (an ulp) right at a boundary: "up to ties".
//
//   uint32_t key = rlx::hd::order_key(z);         // a < b  <=>  order_key(a) < order_key(b)
//   uint64_t need = rlx::hd::top_p_need(0.9, mass_of_top_k);
#pragma once

#include <cmath>
#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

#include "rlx/core/hd.hpp"

namespace rlx::hd {

// The smallest temperature other than 0 (greedy). z = x / T must stay finite in fp32 for any
// logit a model gives, and an fp64 T must not round to 0 (or a subnormal) in fp32: at
// T = 1e-39 every x / T overflows, at 1e-300 T becomes 0. At T = 0.01, |z| = 100 |x| is far
// from fp32's 3.4e38, and sampling is already greedy up to near-ties: a token whose logit is
// 40 ln 2 * T = 0.28 below the maximum has a mass under one unit (2^-40, mass_units). vLLM
// raises temperatures below 0.01 to 0.01 for the same reason; here they are refused.
inline constexpr double kMinTemperature = 1e-2;

// Keys that order floats as unsigned integers (-0 sorts just below +0; no NaN in logits).
RLX_HD uint32_t order_key(float x) {
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A token's mass in units of 2^-40 of the most likely token's (whose w is exactly 1).
constexpr float kMassScale = 1099511627776.0f;  // 2^40: a vocabulary of 2^23 tokens sums below 2^64
// A NaN w (a row outside the rule: inf - inf) has no mass, rather than an undefined conversion.
RLX_HD uint64_t mass_units(float w) { return w > 0.0f ? static_cast<uint64_t>(w * kMassScale) : 0; }

// log of the softmax's sum (over exp(z - max)) from the tokens' summed mass units: exact in
// any order, so a row's log-probs do not depend on how a kernel splits it. Masses under one
// unit (2^-40 of the maximum's) are dropped: at most vocab x 2^-40 of a sum >= 1.
RLX_HD float log_total_of_units(uint64_t units) {
  return static_cast<float>(::log(static_cast<double>(units) / static_cast<double>(kMassScale)));
}

// The mass the top-p set must reach out of `total`; at least 1, so the top token is kept.
RLX_HD uint64_t top_p_need(double top_p, uint64_t total) {
  const auto need = static_cast<uint64_t>(top_p * static_cast<double>(total));
  return need < 1 ? 1 : need;
}

// The inverse CDF's target for a uniform u in [0, 1): below `total` (> 0).
RLX_HD uint64_t draw_target(double u, uint64_t total) {
  const auto t = static_cast<uint64_t>(u * static_cast<double>(total));
  return t < total ? t : total - 1;
}

// Radix select, most significant 8 bits first: at `level` (0..3) a key's digit is
// radix_digit(key, level); the keys still in the race share the digits chosen above.
constexpr int kRadixLevels = 4, kRadixBins = 256;
RLX_HD uint32_t radix_digit(uint32_t key, int level) { return (key >> (24 - 8 * level)) & 0xFFu; }
RLX_HD bool radix_in_prefix(uint32_t key, uint32_t prefix, int level) {
  return level == 0 || (key >> (32 - 8 * level)) == (prefix >> (32 - 8 * level));
}
RLX_HD uint32_t radix_with_digit(uint32_t prefix, uint32_t digit, int level) {
  return prefix | (digit << (24 - 8 * level));
}

// One level: `hist[d]` is the amount (count or mass) of the racing keys with digit d and
// `above` the amount of all keys above the prefix. Returns the largest digit d with
// above + sum(hist[d..255]) >= need, and adds hist[d+1..255] to `above` (0 when even the
// whole histogram falls short: every racing key is then kept).
template <class T>
RLX_HD uint32_t radix_pick(const T* hist, T& above, T need) {
  for (int d = kRadixBins - 1; d > 0; --d) {
    if (above + hist[d] >= need) return static_cast<uint32_t>(d);
    above += hist[d];
  }
  return 0;
}

#if !defined(__CUDA_ARCH__)
// The whole select on the host: the largest key v such that the amount of candidates with
// key >= v reaches `need`. `key(i, k)` returns whether i is a candidate and sets its key;
// `amount(i)` is what i counts for.
template <class T, class KeyOf, class AmountOf>
uint32_t radix_select(int64_t n, T need, KeyOf key, AmountOf amount) {
  uint32_t prefix = 0;
  T above = 0;
  for (int level = 0; level < kRadixLevels; ++level) {
    T hist[kRadixBins] = {};
    for (int64_t i = 0; i < n; ++i) {
      uint32_t k;
      if (key(i, k) && radix_in_prefix(k, prefix, level)) hist[radix_digit(k, level)] += amount(i);
    }
    prefix = radix_with_digit(prefix, radix_pick(hist, above, need), level);
  }
  return prefix;
}
#endif

}  // namespace rlx::hd
