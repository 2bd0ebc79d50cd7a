// y = x w^T (+ bias) for a few rows of x (decode at small batch: at batch 1 cuBLAS's GEMMs ran
// at about 30% of the copy bandwidth on an H200): each warp takes R rows of w, reads them once
// with 16-byte loads, multiplies them by the M rows of x (read from L1: every warp shares
// them) and sums over its lanes by butterfly; fp32 accumulation, one rounding at the end.
// Expert-indexed, the same with each row of the output against its own expert's matrix.
#include "common.cuh"

namespace rlx::cuda {
namespace {

constexpr int kGemvWarps = 8;

template <class T, int M, int R>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvArgs a) {
  constexpr int kVec = 8;  // 16-bit values in 16 bytes
  const int lane = threadIdx.x % 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32) * R;
  if (n0 >= a.n) return;
  const int64_t chunks = a.k / kVec;
  const auto* w = static_cast<const uint4*>(a.w);
  const auto* x = static_cast<const uint4*>(a.x);
  T* out = static_cast<T*>(a.out);
  int rows = a.m;
  if (a.experts) {  // row blockIdx.y of out: its expert's matrix, its token's x (M is 1)
    const int i = blockIdx.y;
    w += a.experts[i] * a.n * chunks;
    x += static_cast<int64_t>(i / a.x_share) * chunks;
    out += static_cast<int64_t>(i) * a.n;
    rows = 1;
  }
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
#pragma unroll 4
  for (int64_t c = lane; c < chunks; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = n0 + r < a.n ? w[(n0 + r) * chunks + c] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m >= rows) break;
      const uint4 xv = x[m * chunks + c];
      const T* xs = reinterpret_cast<const T*>(&xv);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const T* ws = reinterpret_cast<const T*>(&wv[r]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[r][m] += Num<T>::to(ws[j]) * Num<T>::to(xs[j]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = warp_reduce(acc[r][m], SumOp{});
  if (lane != 0) return;
  const T* bias = static_cast<const T*>(a.bias);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (n0 + r >= a.n) break;
    const float b = bias ? Num<T>::to(bias[n0 + r]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (m < rows) out[m * a.n + n0 + r] = Num<T>::from(acc[r][m] + b);
  }
}

template <class T, int M>
int launch_rows(const GemvArgs& a, cudaStream_t stream) {
  // Rows of w a warp: enough warps to fill the device for the small projections, fewer
  // reductions for the large ones (the LM head). Expert-indexed: one grid row per row of out.
  const unsigned ys = a.experts ? static_cast<unsigned>(a.m) : 1u;
  const auto blocks = [&](int r) {
    return dim3(static_cast<unsigned>((a.n + kGemvWarps * r - 1) / (kGemvWarps * r)), ys);
  };
  if (a.n <= 4096)
    gemv_kernel<T, M, 1><<<blocks(1), kGemvWarps * 32, 0, stream>>>(a);
  else if (a.n <= 16384)
    gemv_kernel<T, M, 2><<<blocks(2), kGemvWarps * 32, 0, stream>>>(a);
  else
    gemv_kernel<T, M, 4><<<blocks(4), kGemvWarps * 32, 0, stream>>>(a);
  return launch_status();
}

}  // namespace

int gemv(const GemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return 0;
  if (a.m > (a.experts ? kGemvMaxExpertRows : kGemvMaxRows) || a.k <= 0 || a.k % 8 != 0 || !a.x || !a.w || !a.out ||
      a.dtype == DType::f32 || (a.experts && (a.bias || a.x_share < 1)))
    return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    if constexpr (sizeof(T) != 2) {
      return cudaErrorInvalidValue;
    } else {
      if (a.m == 1 || a.experts) return launch_rows<T, 1>(a, s);
      if (a.m == 2) return launch_rows<T, 2>(a, s);
      if (a.m <= 4) return launch_rows<T, 4>(a, s);
      return launch_rows<T, 8>(a, s);
    }
  });
}

}  // namespace rlx::cuda
