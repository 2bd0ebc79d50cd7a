// Float math for rlx's CPU kernels that the compiler can vectorise: an exp without a
// library call, and a marker that builds a function twice (x86-64-v3: AVX2 and FMA; and
// baseline x86-64), the CPU picking one at load time by its features. (Not "arch=haswell":
// GCC's resolver tests that as a CPU model, so every other AVX2 CPU, Zen or Ice Lake, ran the
// baseline clone.) Sources using exp_approx are built with -fno-trapping-math, which lets GCC
// turn its clamp into vector min/max.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define RLX_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define RLX_CPU_CLONES
#endif
// For a loop body shared by a cloned function and the other dtypes' path: inlined into
// each clone, so that each is compiled (and vectorised) for its target.
#define RLX_CPU_INLINE inline __attribute__((always_inline))

namespace rlx::cpu {

// e^x for float x, within 2e-7 relative of std::exp over [-87, 88] (the argument is clamped
// there: below it the result is about 1.6e-38 rather than 0). Cody-Waite reduction to
// r in [-ln2/2, ln2/2], a degree-6 polynomial, and 2^n put into the exponent bits.
RLX_CPU_INLINE float exp_approx(float x) {
  // (ternaries, not std::min/max: those are calls a clone does not inline)
  const float lo = x < -87.0f ? -87.0f : x;
  const float xc = lo > 88.0f ? 88.0f : lo;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer kept in the low bits
  const float t = xc * 1.44269504088896341f + kShift;
  int32_t tb;
  std::memcpy(&tb, &t, sizeof tb);
  const float n = t - kShift;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (tb - 0x4B400000 + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace rlx::cpu
