// Residual add + RMSNorm, and SiLU(gate) * up: one pass each where eager LibTorch makes
// four to six. Intermediates are rounded to the activation dtype where HF's modules store
// them (the sum, the normalised value, SiLU's output), so a bf16 row matches HF's rounding.
#include <algorithm>

#include "common.cuh"

namespace rlx::cuda {
namespace {

template <class T>
__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(AddRmsNormArgs a) {
  __shared__ float s_sum[kNormThreads / 32];
  pdl_begin();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * a.hidden;
  T* residual = static_cast<T*>(a.residual) + row;
  const T* x = a.x ? static_cast<const T*>(a.x) + row : nullptr;
  const T* weight = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out) + row;
  float squares = 0.0f;
  for (int i = threadIdx.x; i < a.hidden; i += blockDim.x) {
    T r = residual[i];
    if (x) {
      r = add_rounded<T>(r, x[i]);
      residual[i] = r;
    }
    const float h = Num<T>::to(r);
    squares += h * h;
  }
  const float inv_rms = rsqrtf(block_reduce(squares, SumOp{}, s_sum) / a.hidden + a.eps);
  if (a.inv_rms && threadIdx.x == 0) a.inv_rms[blockIdx.x] = inv_rms;  // the learner's, for backward
  for (int i = threadIdx.x; i < a.hidden; i += blockDim.x) {
    const float h = Num<T>::to(residual[i]);  // this thread's own store above
    out[i] = rms_scaled<T>(weight[i], h, inv_rms);
  }
}

// The same, 16 bytes of each operand at a time (add_and_square, rms_scaled_vector), a row's
// sums held in registers between the two passes (V a thread; rows 16-byte aligned, hidden a
// multiple of the vector). Its sum of squares goes in another order than the element kernel's:
// a row's bits depend on which of the two its tensors' alignment picks (rlx's own tensors,
// learner's and engine's, always take this).
template <class T, int V>
__global__ void __launch_bounds__(kNormThreads) add_rms_norm_vec_kernel(AddRmsNormArgs a) {
  constexpr int kVec = 16 / sizeof(T);
  __shared__ float s_sum[kNormThreads / 32];
  pdl_begin();
  const int vecs = a.hidden / kVec;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * a.hidden;
  auto* residual = reinterpret_cast<uint4*>(static_cast<T*>(a.residual) + row);
  const auto* x = a.x ? reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + row) : nullptr;
  const auto* weight = static_cast<const uint4*>(a.weight);
  auto* out = reinterpret_cast<uint4*>(static_cast<T*>(a.out) + row);
  uint4 sums[V];
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v >= vecs) break;
    sums[k] = add_and_square<T>(residual[v], x ? x + v : nullptr, squares);
    if (x) residual[v] = sums[k];
  }
  const float inv_rms = rsqrtf(block_reduce(squares, SumOp{}, s_sum) / a.hidden + a.eps);
  if (a.inv_rms && threadIdx.x == 0) a.inv_rms[blockIdx.x] = inv_rms;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v >= vecs) break;
    out[v] = rms_scaled_vector<T>(sums[k], weight[v], inv_rms);
  }
}

// 16 bytes of each operand a thread (gate, up and out rows 16-byte aligned, inter a multiple
// of the vector): grid (column blocks, rows), no division per element.
template <class T>
__global__ void silu_mul_vec_kernel(const T* gate_up, T* out, int rows, int inter) {
  pdl_begin();
  constexpr int kVec = 16 / sizeof(T);
  const int vecs = inter / kVec;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* gate = gate_up + static_cast<int64_t>(r) * 2 * inter;
    T* o = out + static_cast<int64_t>(r) * inter;
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < vecs; v += gridDim.x * blockDim.x) {
      const uint4 graw = *reinterpret_cast<const uint4*>(gate + v * kVec);
      const uint4 uraw = *reinterpret_cast<const uint4*>(gate + inter + v * kVec);
      *reinterpret_cast<uint4*>(o + v * kVec) = silu_times_vector<T>(graw, uraw);
    }
  }
}

// Any width and alignment: element by element.
template <class T>
__global__ void silu_mul_kernel(const T* gate_up, T* out, int rows, int inter) {
  pdl_begin();
  const int64_t n = static_cast<int64_t>(rows) * inter;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / inter, i = k % inter;
    const float g = Num<T>::to(gate_up[r * 2 * inter + i]);
    const float u = Num<T>::to(gate_up[r * 2 * inter + inter + i]);
    out[k] = silu_times<T>(g, u);
  }
}

}  // namespace

int add_rms_norm(const AddRmsNormArgs& a, void* stream) {
  if (a.rows <= 0) return 0;
  if (a.hidden <= 0 || !a.residual || !a.weight || !a.out) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    constexpr int kVec = 16 / sizeof(T);
    const int vecs = a.hidden / kVec;
    const bool vector = a.hidden % kVec == 0 && aligned16(a.residual) && aligned16(a.weight) && aligned16(a.out) &&
                        (!a.x || aligned16(a.x));
    // A warp-multiple of threads for the row's vectors (Qwen2.5-0.5B's 896 values: 112 of 8).
    const int threads = norm_threads(vecs);
    if (vector && vecs <= kNormThreads) return launch_kernel(add_rms_norm_vec_kernel<T, 1>, a.rows, threads, 0, s, a);
    if (vector && vecs <= 2 * kNormThreads)
      return launch_kernel(add_rms_norm_vec_kernel<T, 2>, a.rows, kNormThreads, 0, s, a);
    if (vector && vecs <= 4 * kNormThreads)
      return launch_kernel(add_rms_norm_vec_kernel<T, 4>, a.rows, kNormThreads, 0, s, a);
    return launch_kernel(add_rms_norm_kernel<T>, a.rows, kNormThreads, 0, s, a);
  });
}

int silu_mul(DType dtype, const void* gate_up, void* out, int rows, int inter, void* stream) {
  if (rows <= 0) return 0;
  if (inter <= 0) return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(rows) * inter;
  const int threads = 256, blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535));
  const auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    constexpr int kVec = 16 / sizeof(T);
    if (inter % kVec == 0 && aligned16(gate_up) && aligned16(out)) {
      const int vecs = inter / kVec;
      const dim3 grid(static_cast<unsigned>((vecs + threads - 1) / threads),
                      static_cast<unsigned>(std::min(rows, 65535)));
      return launch_kernel(silu_mul_vec_kernel<T>, grid, threads, 0, s, static_cast<const T*>(gate_up),
                           static_cast<T*>(out), rows, inter);
    }
    return launch_kernel(silu_mul_kernel<T>, blocks, threads, 0, s, static_cast<const T*>(gate_up),
                         static_cast<T*>(out), rows, inter);
  });
}

}  // namespace rlx::cuda
