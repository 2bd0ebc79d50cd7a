// The learner's fused elementwise ops on a GPU (model/fused_ops.hpp): RoPE both ways, and the
// backward passes of RMSNorm and SiLU-and-multiply (their forwards are the engine's kernels,
// norms.cu). One pass each where eager LibTorch's autograd makes five to ten, the same rules
// and roundings as the CPU rows in src/model/fused_ops.cpp, which are their reference.
#include <algorithm>

#include "common.cuh"

namespace rlx::cuda {
namespace {

constexpr int kThreads = 256;

// dx for one row a block: y = w * n, n = x * inv_rms; dn = g * w; dx = inv (dn - n mean(dn n)).
template <class T>
__global__ void __launch_bounds__(kThreads) rms_norm_dx_kernel(RmsNormBackwardArgs a) {
  __shared__ float s_sum[kThreads / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * a.hidden;
  const T* x = static_cast<const T*>(a.x) + row;
  const T* g = static_cast<const T*>(a.grad) + row;
  const T* w = static_cast<const T*>(a.weight);
  T* dx = static_cast<T*>(a.dx) + row;
  const float inv = a.inv_rms[blockIdx.x];
  float dot = 0.0f;
  for (int i = threadIdx.x; i < a.hidden; i += blockDim.x)
    dot += Num<T>::to(g[i]) * Num<T>::to(w[i]) * (Num<T>::to(x[i]) * inv);
  const float mean = block_reduce(dot, SumOp{}, s_sum) / a.hidden;
  for (int i = threadIdx.x; i < a.hidden; i += blockDim.x) {
    const float n = Num<T>::to(x[i]) * inv;
    dx[i] = Num<T>::from(inv * (Num<T>::to(g[i]) * Num<T>::to(w[i]) - n * mean));
  }
}

// dw's partial sums: block (column tile, row block) sums g * n (n rounded to T, as the forward
// stored it) over kRmsNormBlockRows rows, one column a thread, in row order: a fixed order, so
// the sum of the partials (LibTorch's, over row blocks) does not depend on the launch.
template <class T>
__global__ void __launch_bounds__(kThreads) rms_norm_dw_kernel(RmsNormBackwardArgs a) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= a.hidden) return;
  const int r0 = blockIdx.y * kRmsNormBlockRows, r1 = min(a.rows, r0 + kRmsNormBlockRows);
  const T* x = static_cast<const T*>(a.x);
  const T* g = static_cast<const T*>(a.grad);
  float acc = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const int64_t at = static_cast<int64_t>(r) * a.hidden + col;
    acc += Num<T>::to(g[at]) * round_to<T>(Num<T>::to(x[at]) * a.inv_rms[r]);
  }
  a.dw_partial[static_cast<int64_t>(blockIdx.y) * a.hidden + col] = acc;
}

// One (batch, time) position a block, every head: y[i] = (x[i] c[i] - x[i+h] s[i]) k,
// y[i+h] = (x[i+h] c[i+h] + x[i] s[i+h]) k; transposed (the backward), dx[i] = (g[i] c[i] +
// g[i+h] s[i+h]) k, dx[i+h] = (g[i+h] c[i+h] - g[i] s[i]) k. x strided, out contiguous.
template <class T>
__global__ void rope_kernel(RopeArgs a) {
  const int64_t p = blockIdx.x, b = p / a.time, t = p % a.time;
  const int d = a.head_dim, half = d / 2;
  const T* x = static_cast<const T*>(a.x) + b * a.stride_batch + t * a.stride_time;
  const T* c = static_cast<const T*>(a.cos) + p * d;
  const T* s = static_cast<const T*>(a.sin) + p * d;
  T* y = static_cast<T*>(a.out) + p * a.heads * d;
  for (int idx = threadIdx.x; idx < a.heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const T* xr = x + h * a.stride_head;
    const float v1 = Num<T>::to(xr[i]), v2 = Num<T>::to(xr[i + half]);
    const float c1 = Num<T>::to(c[i]), c2 = Num<T>::to(c[i + half]);
    const float s1 = Num<T>::to(s[i]), s2 = Num<T>::to(s[i + half]);
    float o1, o2;
    if (a.transpose) {
      o1 = (v1 * c1 + v2 * s2) * a.scale;
      o2 = (v2 * c2 - v1 * s1) * a.scale;
    } else {
      o1 = (v1 * c1 - v2 * s1) * a.scale;
      o2 = (v2 * c2 + v1 * s2) * a.scale;
    }
    y[h * d + i] = Num<T>::from(o1);
    y[h * d + i + half] = Num<T>::from(o2);
  }
}

// d gate = d u s (1 + g (1 - s)), d up = d silu(g) (silu rounded to T, as the forward), s = sigmoid(g).
// d gate and d up of one element of SiLU(gate) * up, from the gradient d of its output.
template <class T>
__device__ __forceinline__ void silu_mul_grad(float g, float u, float d, T& dgate, T& dup) {
  const float s = 1.0f / (1.0f + expf(-g));
  dup = Num<T>::from(d * round_to<T>(g * s));
  dgate = Num<T>::from(d * u * s * (1.0f + g * (1.0f - s)));
}

template <class T>
__global__ void silu_mul_backward_kernel(const T* gate_up, const T* grad, T* dgate_up, int64_t rows, int inter) {
  const int64_t n = rows * inter;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / inter, i = k % inter, at = r * 2 * inter + i;
    silu_mul_grad<T>(Num<T>::to(gate_up[at]), Num<T>::to(gate_up[at + inter]), Num<T>::to(grad[k]), dgate_up[at],
                     dgate_up[at + inter]);
  }
}

// 16 bytes of each operand a thread (rows 16-byte aligned, inter a multiple of the vector):
// grid (column blocks, rows), no division per element.
template <class T>
__global__ void silu_mul_backward_vec_kernel(const T* gate_up, const T* grad, T* dgate_up, int64_t rows, int inter) {
  constexpr int kVec = 16 / sizeof(T);
  const int vecs = inter / kVec;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* gu = gate_up + r * 2 * inter;
    T* dgu = dgate_up + r * 2 * inter;
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < vecs; v += gridDim.x * blockDim.x) {
      const uint4 graw = *reinterpret_cast<const uint4*>(gu + v * kVec);
      const uint4 uraw = *reinterpret_cast<const uint4*>(gu + inter + v * kVec);
      const uint4 draw = *reinterpret_cast<const uint4*>(grad + r * inter + v * kVec);
      const T* g = reinterpret_cast<const T*>(&graw);
      const T* u = reinterpret_cast<const T*>(&uraw);
      const T* d = reinterpret_cast<const T*>(&draw);
      uint4 dg, du;
      T* dgv = reinterpret_cast<T*>(&dg);
      T* duv = reinterpret_cast<T*>(&du);
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        silu_mul_grad<T>(Num<T>::to(g[j]), Num<T>::to(u[j]), Num<T>::to(d[j]), dgv[j], duv[j]);
      *reinterpret_cast<uint4*>(dgu + v * kVec) = dg;
      *reinterpret_cast<uint4*>(dgu + inter + v * kVec) = du;
    }
  }
}

}  // namespace

int rms_norm_backward(const RmsNormBackwardArgs& a, void* stream) {
  if (a.rows <= 0) return 0;
  if (a.hidden <= 0 || (a.rows + kRmsNormBlockRows - 1) / kRmsNormBlockRows > 65535 || !a.x || !a.weight ||
      !a.inv_rms || !a.grad || !a.dx || !a.dw_partial)
    return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    rms_norm_dx_kernel<T><<<a.rows, kThreads, 0, s>>>(a);
    const dim3 grid((a.hidden + kThreads - 1) / kThreads, (a.rows + kRmsNormBlockRows - 1) / kRmsNormBlockRows);
    rms_norm_dw_kernel<T><<<grid, kThreads, 0, s>>>(a);
    return launch_status();
  });
}

int rope(const RopeArgs& a, void* stream) {
  if (a.rows <= 0) return 0;
  if (a.rows > 0x7fffffff || a.time <= 0 || a.heads <= 0 || a.head_dim <= 0 || a.head_dim % 2 || !a.x || !a.cos ||
      !a.sin || !a.out)
    return cudaErrorInvalidValue;
  const int threads = std::min(256, std::max(32, (a.heads * a.head_dim / 2 + 31) / 32 * 32));
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    rope_kernel<T><<<static_cast<unsigned>(a.rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_status();
  });
}

int silu_mul_backward(DType dtype, const void* gate_up, const void* grad, void* dgate_up, int64_t rows, int inter,
                      void* stream) {
  if (rows <= 0) return 0;
  if (inter <= 0 || !gate_up || !grad || !dgate_up) return cudaErrorInvalidValue;
  const int64_t n = rows * inter;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  const auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    constexpr int kVec = 16 / sizeof(T);
    const auto* gu = static_cast<const T*>(gate_up);
    const auto* g = static_cast<const T*>(grad);
    auto* dgu = static_cast<T*>(dgate_up);
    if (inter % kVec == 0 && aligned16(gate_up) && aligned16(grad) && aligned16(dgate_up)) {
      const int vecs = inter / kVec;
      const dim3 grid(static_cast<unsigned>((vecs + kThreads - 1) / kThreads),
                      static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
      silu_mul_backward_vec_kernel<T><<<grid, kThreads, 0, s>>>(gu, g, dgu, rows, inter);
    } else {
      silu_mul_backward_kernel<T><<<blocks, kThreads, 0, s>>>(gu, g, dgu, rows, inter);
    }
    return launch_status();
  });
}

}  // namespace rlx::cuda
