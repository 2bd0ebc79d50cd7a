// The GPU sampler: one thread block per row, the rule of sampling_rule.hpp with no sort
// and no fp64 pass over the vocabulary. Passes over the row (16-byte loads, several in
// flight: Row below): the maximum (and first argmax), the softmax sum, then only what the
// row asks for: a 4-level radix select on counts for top-k, one on integer masses for
// top-p, and the inverse-CDF draw in vocabulary order (a scan of integer masses over
// contiguous chunks, one per thread). Masses are integers, so the sums are exact and the
// draw equals the CPU sampler's.
#include "common.cuh"
#include "rlx/cuda/sampling_rule.hpp"

namespace rlx::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kBatch = 4;  // 16-byte loads a thread issues before using any

// A row of logits read as z = x / T. Its elements come in units: 16 bytes (one vector
// load) where the row starts 16-byte aligned, else single elements; a last unit shorter than
// a vector is read element by element. visit(first, step, end, f) calls f(i, z_i) for the
// elements of units first, first + step, ... < end, in that order, kBatch loads in flight:
// with step = blockDim.x a warp's loads are 512 contiguous bytes, with step 1 a thread walks
// its own chunk. One thread block on a row of 152k logits was latency-bound element by
// element (134 us a draw at batch 1, 2026-11-26); in vectors the passes are ~8x fewer loads.
template <class T>
struct Row {
  static constexpr int kVec = 16 / sizeof(T);
  const T* x;
  int n, width, units;
  float t;

  __device__ Row(const T* x_, int n_, float t_) : x(x_), n(n_), t(t_) {
    width = reinterpret_cast<uintptr_t>(x_) % 16 == 0 ? kVec : 1;
    units = (n + width - 1) / width;
  }
  __device__ float z(int i) const { return Num<T>::to(x[i]) / t; }
  __device__ bool vector(int u) const { return width == kVec && (u + 1) * kVec <= n; }

  template <class F>
  __device__ void visit(int first, int step, int end, F&& f) const {
    for (int u0 = first; u0 < end; u0 += kBatch * step) {
      uint4 raw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int u = u0 + b * step;
        raw[b] = u < end && vector(u) ? __ldg(reinterpret_cast<const uint4*>(x) + u) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int u = u0 + b * step;
        if (u >= end) break;
        if (vector(u)) {
          const T* e = reinterpret_cast<const T*>(&raw[b]);
#pragma unroll
          for (int j = 0; j < kVec; ++j) f(u * kVec + j, Num<T>::to(e[j]) / t);
        } else {
          for (int i = u * width; i < min(n, (u + 1) * width); ++i) f(i, z(i));
        }
      }
    }
  }
  // Every element, each thread its strided units (the order within a thread ascends).
  template <class F>
  __device__ void for_each(F&& f) const {
    visit(threadIdx.x, blockDim.x, units, f);
  }
};

// Radix select over the row (see hd::radix_select, its sequential twin): the largest key v
// with amount(candidates with key >= v) >= need. key_of(z, k) and amount_of(z) see z only.
template <class T, class A, class KeyOf, class AmountOf>
__device__ uint32_t block_radix_select(const Row<T>& row, A need, KeyOf key_of, AmountOf amount_of, A* hist,
                                       uint32_t* s_prefix) {
  uint32_t prefix = 0;
  A above = 0;  // thread 0's
  for (int level = 0; level < hd::kRadixLevels; ++level) {
    for (int i = threadIdx.x; i < hd::kRadixBins; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    row.for_each([&](int, float zi) {
      uint32_t k;
      if (key_of(zi, k) && hd::radix_in_prefix(k, prefix, level))
        atomicAdd(&hist[hd::radix_digit(k, level)], amount_of(zi));
    });
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

  const int row_index = blockIdx.x, n = a.vocab;
  const float temperature = a.temperature[row_index];
  const bool greedy = temperature == 0.0f;
  const Row<T> row(static_cast<const T*>(a.logits) + static_cast<int64_t>(row_index) * a.row_stride, n,
                   greedy ? 1.0f : temperature);

  // The maximum and its first index.
  float best = -__builtin_huge_valf();
  int best_i = n;
  row.for_each([&](int i, float v) {
    if (v > best) best = v, best_i = i;  // i grows within a thread: the first of equal values stays
  });
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

  // The softmax's sum in mass units: the same in any order, whichever units a row's
  // alignment gives (a float sum's order would tie a row's log-prob to its place in the batch).
  unsigned long long units = 0;
  row.for_each([&](int, float zi) { units += hd::mass_units(expf(zi - m)); });
  const float log_total = hd::log_total_of_units(block_reduce(units, SumOp{}, s_u64));

  if (greedy) {
    if (threadIdx.x == 0) a.tokens[row_index] = best_i, a.logprobs[row_index] = -log_total;
    return;
  }

  const int top_k = a.top_k[row_index];
  const double top_p = a.top_p[row_index];
  const float min_p = a.min_p[row_index];
  auto mass = [&](float zi) { return static_cast<unsigned long long>(hd::mass_units(expf(zi - m))); };
  uint32_t key_k = 0, key_p = 0;
  if (top_k > 0 && top_k < n) {
    key_k = block_radix_select(
        row, static_cast<unsigned int>(top_k), [](float zi, uint32_t& k) { return k = hd::order_key(zi), true; },
        [](float) { return 1u; }, s_count, &s_prefix);
  }
  if (top_p < 1.0) {
    unsigned long long kept = 0;
    row.for_each([&](int, float zi) {
      if (hd::order_key(zi) >= key_k) kept += mass(zi);
    });
    const auto need = static_cast<unsigned long long>(hd::top_p_need(top_p, block_reduce(kept, SumOp{}, s_u64)));
    key_p = block_radix_select(
        row, need, [&](float zi, uint32_t& k) { return (k = hd::order_key(zi)) >= key_k; }, mass, s_mass, &s_prefix);
  }
  const uint32_t key_min = key_k > key_p ? key_k : key_p;
  auto kept_mass = [&](float zi) -> unsigned long long {
    const float w = expf(zi - m);
    return hd::order_key(zi) >= key_min && w >= min_p ? hd::mass_units(w) : 0ull;
  };

  // Inverse CDF in vocabulary order: thread j owns the contiguous chunk j of units. A row
  // without mass (total 0) keeps the first maximum (the scan's barrier orders this write first).
  if (threadIdx.x == 0) s_token = best_i < n ? best_i : 0;
  const int chunk = (row.units + kThreads - 1) / kThreads;
  const int lo = min(row.units, static_cast<int>(threadIdx.x) * chunk), hi = min(row.units, lo + chunk);
  unsigned long long mine = 0;
  row.visit(lo, 1, hi, [&](int, float zi) { mine += kept_mass(zi); });
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
  const unsigned long long target = hd::draw_target(a.uniform[row_index], total);
  if (mine > 0 && excl <= target && target < excl + mine) {
    unsigned long long run = excl;
    row.visit(lo, 1, hi, [&](int i, float zi) {
      if (run > target) return;  // found at an earlier element
      run += kept_mass(zi);
      if (run > target) s_token = i;
    });
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int token = s_token;
    a.tokens[row_index] = token;
    a.logprobs[row_index] = row.z(token) - m - log_total;
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
