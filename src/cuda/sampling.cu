// The GPU sampler: one thread block per row, the rule of sampling_rule.hpp with no sort
// and no fp64 pass over the vocabulary. Passes over the row: the maximum (and first
// argmax), the softmax sum, then only what the row asks for: a 4-level radix select on
// counts for top-k, one on integer masses for top-p, and the inverse-CDF draw in
// vocabulary order (a scan of integer masses over contiguous chunks, one per thread).
// Masses are integers, so the sums are exact and the draw equals the CPU sampler's.
#include "common.cuh"
#include "rlx/cuda/sampling_rule.hpp"

namespace rlx::cuda {
namespace {

constexpr int kThreads = 1024;

// Radix select over the row (see hd::radix_select, its sequential twin): the largest key v
// with amount(candidates with key >= v) >= need.
template <class A, class KeyOf, class AmountOf>
__device__ uint32_t block_radix_select(int n, A need, KeyOf key_of, AmountOf amount_of, A* hist, uint32_t* s_prefix) {
  uint32_t prefix = 0;
  A above = 0;  // thread 0's
  for (int level = 0; level < hd::kRadixLevels; ++level) {
    for (int i = threadIdx.x; i < hd::kRadixBins; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      uint32_t k;
      if (key_of(i, k) && hd::radix_in_prefix(k, prefix, level)) atomicAdd(&hist[hd::radix_digit(k, level)], amount_of(i));
    }
    __syncthreads();
    if (threadIdx.x == 0) *s_prefix = hd::radix_with_digit(prefix, hd::radix_pick(hist, above, need), level);
    __syncthreads();
    prefix = *s_prefix;
  }
  return prefix;
}

template <class T>
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  __shared__ float s_float[32];
  __shared__ int s_int[32];
  __shared__ unsigned long long s_u64[32];
  __shared__ unsigned int s_count[hd::kRadixBins];
  __shared__ unsigned long long s_mass[hd::kRadixBins];
  __shared__ uint32_t s_prefix;
  __shared__ int s_token;

  const int row = blockIdx.x, n = a.vocab;
  const T* x = static_cast<const T*>(a.logits) + static_cast<int64_t>(row) * a.row_stride;
  const float temperature = a.temperature[row];
  const bool greedy = temperature == 0.0f;
  const float t = greedy ? 1.0f : temperature;
  auto z = [&](int i) { return Num<T>::to(x[i]) / t; };

  // The maximum and its first index.
  float best = -__builtin_huge_valf();
  int best_i = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = z(i);
    if (v > best) best = v, best_i = i;  // i grows: the first of equal values stays
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (ov > best || (ov == best && oi < best_i)) best = ov, best_i = oi;
  }
  if (threadIdx.x % 32 == 0) s_float[threadIdx.x / 32] = best, s_int[threadIdx.x / 32] = best_i;
  __syncthreads();
  best = s_float[0], best_i = s_int[0];
  for (int w = 1; w < kThreads / 32; ++w)
    if (s_float[w] > best || (s_float[w] == best && s_int[w] < best_i)) best = s_float[w], best_i = s_int[w];
  __syncthreads();
  const float m = best;

  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += expf(z(i) - m);
  const float log_total = logf(block_reduce(sum, SumOp{}, s_float));

  if (greedy) {
    if (threadIdx.x == 0) a.tokens[row] = best_i, a.logprobs[row] = -log_total;
    return;
  }

  const int top_k = a.top_k[row];
  const double top_p = a.top_p[row];
  const float min_p = a.min_p[row];
  auto mass = [&](int i) { return static_cast<unsigned long long>(hd::mass_units(expf(z(i) - m))); };
  uint32_t key_k = 0, key_p = 0;
  if (top_k > 0 && top_k < n) {
    key_k = block_radix_select(
        n, static_cast<unsigned int>(top_k), [&](int i, uint32_t& k) { return k = hd::order_key(z(i)), true; },
        [](int) { return 1u; }, s_count, &s_prefix);
  }
  if (top_p < 1.0) {
    unsigned long long kept = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (hd::order_key(z(i)) >= key_k) kept += mass(i);
    const auto need = static_cast<unsigned long long>(hd::top_p_need(top_p, block_reduce(kept, SumOp{}, s_u64)));
    key_p = block_radix_select(
        n, need, [&](int i, uint32_t& k) { return (k = hd::order_key(z(i))) >= key_k; }, mass, s_mass, &s_prefix);
  }
  const uint32_t key_min = key_k > key_p ? key_k : key_p;
  auto kept_mass = [&](int i) -> unsigned long long {
    const float zi = z(i);
    const float w = expf(zi - m);
    return hd::order_key(zi) >= key_min && w >= min_p ? hd::mass_units(w) : 0ull;
  };

  // Inverse CDF in vocabulary order: thread j owns the contiguous chunk j. A row without
  // mass (total 0) keeps the first maximum (the scan's barrier orders this write first).
  if (threadIdx.x == 0) s_token = best_i < n ? best_i : 0;
  const int chunk = (n + kThreads - 1) / kThreads;
  const int lo = min(n, threadIdx.x * chunk), hi = min(n, lo + chunk);
  unsigned long long mine = 0;
  for (int i = lo; i < hi; ++i) mine += kept_mass(i);
  unsigned long long incl = mine;  // inclusive scan over the threads
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long o = __shfl_up_sync(0xffffffffu, incl, offset);
    if (lane >= offset) incl += o;
  }
  if (lane == 31) s_u64[warp] = incl;
  __syncthreads();
  unsigned long long before_warp = 0, total = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before_warp += s_u64[w];
    total += s_u64[w];
  }
  const unsigned long long excl = before_warp + incl - mine;
  const unsigned long long target = hd::draw_target(a.uniform[row], total);
  if (mine > 0 && excl <= target && target < excl + mine) {
    unsigned long long run = excl;
    for (int i = lo; i < hi; ++i) {
      run += kept_mass(i);
      if (run > target) {
        s_token = i;
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int token = s_token;
    a.tokens[row] = token;
    a.logprobs[row] = z(token) - m - log_total;
  }
}

}  // namespace

int sample(const SampleArgs& a, void* stream) {
  if (a.rows <= 0) return 0;
  if (a.vocab <= 0 || a.row_stride < a.vocab) return cudaErrorInvalidValue;
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    sample_kernel<T><<<a.rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_status();
  });
}

}  // namespace rlx::cuda
