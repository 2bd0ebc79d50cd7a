// The GPU sampler: one thread block per row, the rule of sampling_rule.hpp with no sort
// and no fp64 pass over the vocabulary. Passes over the row (16-byte loads, several in
// flight: Row below): the maximum (and first argmax), the softmax sum, then only what the
// row asks for: a 4-level radix select on counts for top-k, one on integer masses for
// top-p, and the inverse-CDF draw in vocabulary order (a scan of integer masses over
// contiguous chunks, one per thread). Masses are integers, so the sums are exact and the
// draw equals the CPU sampler's.
// At small batch one block a row is one SM's work (108 us a draw at batch 1 on an H200): with
// a workspace, slices of each row take the maximum and the sum first, many blocks a row
// (slice_max_kernel, slice_mass_kernel), and the row's block reads them and scans only the
// slice that holds its draw. The sums are the same integers, so the draw is too.
#include <algorithm>

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
    // At temperature 1 (RL's usual) x / 1 is x: the pass skips the division, an IEEE divide
    // that is about half of a pass's instructions (the sampler is bound by them, not by memory).
    const bool divide = t != 1.0f;
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
          for (int j = 0; j < kVec; ++j) f(u * kVec + j, divide ? Num<T>::to(e[j]) / t : Num<T>::to(e[j]));
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

// The block's maximum of `best` and the first index of it; every thread gets both. `s_float`
// and `s_int` hold a value per warp.
__device__ void block_argmax(float& best, int& best_i, float* s_float, int* s_int) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (ov > best || (ov == best && oi < best_i)) best = ov, best_i = oi;
  }
  if (threadIdx.x % 32 == 0) s_float[threadIdx.x / 32] = best, s_int[threadIdx.x / 32] = best_i;
  __syncthreads();
  best = s_float[0], best_i = s_int[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
    if (s_float[w] > best || (s_float[w] == best && s_int[w] < best_i)) best = s_float[w], best_i = s_int[w];
  __syncthreads();
}

// Thread j's contiguous chunk [lo, hi) of the units [lo_u, hi_u): the inverse CDF's scan order.
__device__ __forceinline__ void thread_chunk(int lo_u, int hi_u, int& lo, int& hi) {
  const int threads = static_cast<int>(blockDim.x);
  const int chunk = (hi_u - lo_u + threads - 1) / threads;
  lo = min(hi_u, lo_u + static_cast<int>(threadIdx.x) * chunk);
  hi = min(hi_u, lo + chunk);
}

// Inverse CDF over the units [lo_u, hi_u) in vocabulary order: thread j owns contiguous chunk
// j. The token is the first whose running kept mass exceeds target_of(total kept mass in the
// range); `fallback` where nothing has mass. `known`: this thread's chunk's kept mass where the
// caller has it (the pass over the row is then skipped), else kUnknownMass.
constexpr unsigned long long kUnknownMass = ~0ull;  // above any row's sum (2^23 tokens x 2^40 units)
template <class T, class Kept, class TargetOf>
__device__ int inverse_cdf(const Row<T>& row, int lo_u, int hi_u, Kept kept_mass, TargetOf target_of, int fallback,
                           unsigned long long* s_u64, int* s_token, unsigned long long known = kUnknownMass) {
  __syncthreads();                            // s_u64 and s_token may still be read from before
  if (threadIdx.x == 0) *s_token = fallback;  // the scan's barrier orders this write first
  const int threads = static_cast<int>(blockDim.x);
  int lo, hi;
  thread_chunk(lo_u, hi_u, lo, hi);
  unsigned long long mine = known;
  if (known == kUnknownMass) {
    mine = 0;
    row.visit(lo, 1, hi, [&](int, float zi) { mine += kept_mass(zi); });
  }
  unsigned long long incl = mine;  // inclusive scan over the threads
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long o = __shfl_up_sync(0xffffffffu, incl, offset);
    if (lane >= offset) incl += o;
  }
  if (lane == 31) s_u64[warp] = incl;
  __syncthreads();
  unsigned long long before_warp = 0, total = 0;
  for (int w = 0; w < threads / 32; ++w) {
    if (w < warp) before_warp += s_u64[w];
    total += s_u64[w];
  }
  const unsigned long long excl = before_warp + incl - mine;
  const unsigned long long target = target_of(total);
  if (mine > 0 && excl <= target && target < excl + mine) {
    unsigned long long run = excl;
    row.visit(lo, 1, hi, [&](int i, float zi) {
      if (run > target) return;  // found at an earlier element
      run += kept_mass(zi);
      if (run > target) *s_token = i;
    });
  }
  __syncthreads();
  return *s_token;
}

// A logit's mass in units (sampling_rule.hpp), z relative to its row's maximum m.
__device__ __forceinline__ unsigned long long mass_of(float z, float m) { return hd::mass_units(expf(z - m)); }

// A row's slice: its maximum and first index of it, then its mass in units of that row's
// maximum (16 bytes a (row, slice) in the workspace).
struct SliceStats {
  float max;
  int arg;
  unsigned long long mass;
};

template <class T>
__device__ Row<T> row_of(const SampleArgs& a, int r) {
  const float temperature = a.temperature[r];
  return Row<T>(static_cast<const T*>(a.logits) + static_cast<int64_t>(r) * a.row_stride, a.vocab,
                temperature == 0.0f ? 1.0f : temperature);
}

// Units [lo, hi) of slice s of a row cut into `slices`.
__device__ void slice_range(int units, int slices, int s, int& lo, int& hi) {
  const int per = (units + slices - 1) / slices;
  lo = min(units, s * per);
  hi = min(units, lo + per);
}

constexpr int kSliceThreads = 256;

// grid (slices, rows): each slice's maximum and its first index.
template <class T>
__global__ void __launch_bounds__(kSliceThreads) slice_max_kernel(SampleArgs a, int slices) {
  __shared__ float s_float[kSliceThreads / 32];
  __shared__ int s_int[kSliceThreads / 32];
  pdl_begin();
  const int r = blockIdx.y, s = blockIdx.x;
  const Row<T> row = row_of<T>(a, r);
  int lo, hi;
  slice_range(row.units, slices, s, lo, hi);
  float best = -__builtin_huge_valf();
  int best_i = a.vocab;
  row.visit(lo + static_cast<int>(threadIdx.x), blockDim.x, hi, [&](int i, float v) {
    if (v > best) best = v, best_i = i;
  });
  block_argmax(best, best_i, s_float, s_int);
  if (threadIdx.x == 0) {
    auto& out = static_cast<SliceStats*>(a.workspace)[static_cast<int64_t>(r) * slices + s];
    out.max = best;
    out.arg = best_i;
  }
}

// grid (slices, rows): each slice's mass in units of the row's maximum (over every slice's).
template <class T>
__global__ void __launch_bounds__(kSliceThreads) slice_mass_kernel(SampleArgs a, int slices) {
  __shared__ unsigned long long s_u64[kSliceThreads / 32];
  pdl_begin();
  const int r = blockIdx.y, s = blockIdx.x;
  auto* stats = static_cast<SliceStats*>(a.workspace) + static_cast<int64_t>(r) * slices;
  float m = -__builtin_huge_valf();
  for (int j = 0; j < slices; ++j) m = stats[j].max > m ? stats[j].max : m;  // as the row's block combines them
  const Row<T> row = row_of<T>(a, r);
  int lo, hi;
  slice_range(row.units, slices, s, lo, hi);
  unsigned long long units = 0;
  row.visit(lo + static_cast<int>(threadIdx.x), blockDim.x, hi, [&](int, float zi) { units += mass_of(zi, m); });
  units = block_reduce(units, SumOp{}, s_u64);
  if (threadIdx.x == 0) stats[s].mass = units;
}

// One block a row. `slices` > 1: the workspace holds the row's slices (above), which a row
// without top-k, top-p or min-p uses instead of its own passes.
template <class T>
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a, int slices) {
  __shared__ float s_float[32];
  __shared__ int s_int[32];
  __shared__ unsigned long long s_u64[32];
  __shared__ unsigned int s_count[hd::kRadixBins];
  __shared__ unsigned long long s_mass[hd::kRadixBins];
  __shared__ uint32_t s_prefix;
  __shared__ int s_token;
  pdl_begin();

  const int row_index = blockIdx.x, n = a.vocab;
  const bool greedy = a.temperature[row_index] == 0.0f;
  const Row<T> row = row_of<T>(a, row_index);
  const int top_k = a.top_k[row_index];
  const double top_p = a.top_p[row_index];
  const float min_p = a.min_p[row_index];

  if (slices > 1 && !(top_k > 0 && top_k < n) && !(top_p < 1.0) && !(min_p > 0.0f)) {
    // The slices' maximum (the first slice's on ties: its first index is the row's) and sum.
    const auto* stats = static_cast<const SliceStats*>(a.workspace) + static_cast<int64_t>(row_index) * slices;
    float m = stats[0].max;
    int best_i = stats[0].arg;
    unsigned long long total = 0;
    for (int j = 0; j < slices; ++j) {
      if (stats[j].max > m) m = stats[j].max, best_i = stats[j].arg;
      total += stats[j].mass;
    }
    const float log_total = hd::log_total_of_units(total);
    int token = best_i < n ? best_i : 0;
    if (!greedy && total > 0) {
      // The slice whose running mass passes the target, then that slice's units alone.
      const unsigned long long target = hd::draw_target(a.uniform[row_index], total);
      unsigned long long before = 0;
      int s = 0;
      while (s + 1 < slices && before + stats[s].mass <= target) before += stats[s++].mass;
      int lo, hi;
      slice_range(row.units, slices, s, lo, hi);
      token = inverse_cdf(
          row, lo, hi, [&](float zi) { return mass_of(zi, m); }, [&](unsigned long long) { return target - before; },
          token, s_u64, &s_token);
    }
    if (threadIdx.x == 0) {
      a.tokens[row_index] = token;
      a.logprobs[row_index] = greedy ? -log_total : row.z(token) - m - log_total;
    }
    return;
  }

  // The maximum and its first index.
  float best = -__builtin_huge_valf();
  int best_i = n;
  row.for_each([&](int i, float v) {
    if (v > best) best = v, best_i = i;  // i grows within a thread: the first of equal values stays
  });
  block_argmax(best, best_i, s_float, s_int);
  const float m = best;

  // The softmax's sum in mass units: the same in any order, whichever units a row's
  // alignment gives (a float sum's order would tie a row's log-prob to its place in the batch).
  // Summed over the inverse CDF's chunks: a row without top-k, top-p or min-p keeps every
  // unit's mass, so its draw scans these sums instead of a third pass over the row.
  unsigned long long units = 0;
  {
    int lo, hi;
    thread_chunk(0, row.units, lo, hi);
    row.visit(lo, 1, hi, [&](int, float zi) { units += mass_of(zi, m); });
  }
  const unsigned long long chunk_units = units;
  const float log_total = hd::log_total_of_units(block_reduce(units, SumOp{}, s_u64));

  if (greedy) {
    if (threadIdx.x == 0) a.tokens[row_index] = best_i < n ? best_i : 0, a.logprobs[row_index] = -log_total;
    return;
  }

  auto mass = [&](float zi) { return mass_of(zi, m); };
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

  // Inverse CDF in vocabulary order. A row without mass (total 0) keeps the first maximum.
  const bool keeps_all = key_min == 0 && !(min_p > 0.0f);  // kept_mass is mass_of: the chunks' sums above
  const int token = inverse_cdf(
      row, 0, row.units, kept_mass,
      [&](unsigned long long total) { return hd::draw_target(a.uniform[row_index], total); }, best_i < n ? best_i : 0,
      s_u64, &s_token, keeps_all ? chunk_units : kUnknownMass);
  if (threadIdx.x == 0) {
    a.tokens[row_index] = token;
    a.logprobs[row_index] = row.z(token) - m - log_total;
  }
}

}  // namespace

size_t sample_workspace_bytes(int rows) { return static_cast<size_t>(rows) * kSampleMaxSlices * sizeof(SliceStats); }

int sample(const SampleArgs& a, void* stream) {
  if (a.rows <= 0) return 0;
  if (a.vocab <= 0 || a.row_stride < a.vocab || a.slices < 0 || a.slices > kSampleMaxSlices)
    return cudaErrorInvalidValue;
  int slices = 1;
  if (a.workspace != nullptr && a.rows <= 65535) {  // the slices' grid: (slices, rows)
    slices = a.slices;
    if (slices == 0) {  // two blocks an SM over the device
      int device = 0, sms = 0;
      if (cudaGetDevice(&device) != cudaSuccess ||
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        return launch_status();
      slices = std::max(1, std::min(kSampleMaxSlices, 2 * sms / a.rows));
    }
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    if (slices > 1) {
      const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(a.rows));
      if (int status = launch_kernel(slice_max_kernel<T>, grid, kSliceThreads, 0, s, a, slices)) return status;
      if (int status = launch_kernel(slice_mass_kernel<T>, grid, kSliceThreads, 0, s, a, slices)) return status;
    }
    return launch_kernel(sample_kernel<T>, a.rows, kThreads, 0, s, a, slices);
  });
}

}  // namespace rlx::cuda
