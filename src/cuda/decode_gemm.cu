// y = x w^T (+ bias) on tensor cores for decode's batches past the GEMV's (up to 256 rows; from
// 9 with the GEMV on, from 1 without it),
// where cuBLAS's GEMMs ran at about a quarter of the copy bandwidth (H200, batch 64: 663 us a
// step for 0.7 GB of weights).
//
// A block takes WR tiles of 16 rows of w and 8 MT rows of x (grid x: the x rows, fastest, so
// the blocks that share a w tile run together and its later reads hit L2). Its 8 warps split
// k: warp (tile, split) takes the tile's 64-wide k chunks split, split + G, ... (G = 8 / WR),
// its w chunks two ahead. Nothing passes through shared memory on the way to the tensor
// cores: lane l (g = l / 4, q = l % 4) loads 16 bytes twice from each of its rows (w rows g
// and g + 8, x row g of each 8-row tile), at k = 64 c + 8 q and 64 c + 32 + 8 q (a row's 4
// lanes read 64 contiguous bytes a load), and the chunk's mma slice s takes values 4s .. 4s+3
// of those 16 as its k 2q, 2q+1, 2q+8, 2q+9 (the fragments of mma.cuh). A and B take the same
// order of k, so each slice sums 16 distinct k and the 4 slices the chunk's 64. The warps' sums
// are added in split order through shared memory. That order depends on k and n alone (WR by
// n): a row of x gives the same bits alone or among others in any batch this kernel takes.
// With GemvInput::silu_mul, x is the gate/up projection's output [m, 2k] and each operand vector
// is SiLU(gate) * up computed as it is loaded (silu_times_vector, silu_mul's own), so the
// down projection equals silu_mul then this GEMM bit for bit, one kernel fewer a layer.
#include <type_traits>

#include "mma.cuh"

namespace rlx::cuda {
namespace {

constexpr int kGemmWarps = 8;
constexpr int kGemmThreads = kGemmWarps * 32;
constexpr int kChunk = kDecodeGemmWidthStep;  // k values a chunk: 4 mma slices
static_assert(kChunk == 64);
constexpr int kAhead = 2;   // a warp's w chunks in flight

template <class T, int MT, int WR, bool Silu>
__global__ void __launch_bounds__(kGemmThreads, 1) decode_gemm_kernel(GemvArgs a) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma needs sm_80 (RLX_CUDA_ARCHITECTURES); ops.cpp takes cuBLAS there
#else
  constexpr int G = kGemmWarps / WR;  // warps splitting a tile's k
  constexpr int kCols = 8 * MT;       // x rows a block
  // A warp's sums, column (x row) by column, 20 floats a column: the fragments' stores and the
  // epilogue's loads meet at most 2 a bank.
  constexpr int kStride = 20;
  __shared__ float s_part[kGemmWarps][kCols * kStride];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int tile = warp / G, split = warp % G;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.y) * WR + tile) * 16;
  const int m0 = blockIdx.x * kCols;
  const int64_t vecs = a.k / 8;                   // 16-byte vectors a row of w
  const int64_t x_vecs = Silu ? 2 * vecs : vecs;  // a row of x: with Silu, gate's then up's
  const int64_t chunks = a.k / kChunk;
  const int tiles = (a.m - m0 + 7) / 8 < MT ? (a.m - m0 + 7) / 8 : MT;  // x tiles with rows
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const bool w0_ok = n0 + g < a.n, w1_ok = n0 + g + 8 < a.n;
  const auto* w = static_cast<const uint4*>(a.w);
  const uint4* w0 = w + (w0_ok ? n0 + g : 0) * vecs + q;
  const uint4* w1 = w + (w1_ok ? n0 + g + 8 : 0) * vecs + q;
  const auto* x = static_cast<const uint4*>(a.x);

  float acc[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[t][j] = 0.0f;
  // This warp's chunks: split + i G for i < mine; w's two rows of chunk i into d.
  const int64_t mine = split < chunks ? (chunks - split + G - 1) / G : 0;
  const auto load_w = [&](int64_t i, uint4(&d)[4]) {
    const int64_t at = (split + i * G) * (kChunk / 8);
    d[0] = w0_ok ? w0[at] : zero;
    d[1] = w0_ok ? w0[at + 4] : zero;
    d[2] = w1_ok ? w1[at] : zero;
    d[3] = w1_ok ? w1[at + 4] : zero;
  };
  uint4 wbuf[kAhead][4];
#pragma unroll
  for (int p = 0; p < kAhead; ++p)
    if (p < mine) load_w(p, wbuf[p]);
  for (int64_t i = 0; i < mine; i += kAhead) {
#pragma unroll
    for (int p = 0; p < kAhead; ++p) {
      if (i + p >= mine) break;
      const int64_t at = (split + (i + p) * G) * (kChunk / 8);
      uint4 xv[MT][2];  // every tile's x loads in flight together
      uint4 up[Silu ? MT : 1][2];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int row = m0 + 8 * t + g;
        const bool ok = t < tiles && row < a.m;
        const uint4* xp = x + (ok ? row : 0) * x_vecs + q + at;
        xv[t][0] = ok ? xp[0] : zero;
        xv[t][1] = ok ? xp[4] : zero;
        if constexpr (Silu) {
          up[t][0] = ok ? xp[vecs] : zero;
          up[t][1] = ok ? xp[vecs + 4] : zero;
        }
      }
      if constexpr (Silu) {
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          xv[t][0] = silu_times_vector<T>(xv[t][0], up[t][0]);
          xv[t][1] = silu_times_vector<T>(xv[t][1], up[t][1]);
        }
      }
      const auto* wa = reinterpret_cast<const uint32_t*>(&wbuf[p][0]);  // row g: 8 words
      const auto* wb = reinterpret_cast<const uint32_t*>(&wbuf[p][2]);  // row g + 8
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        if (t >= tiles) break;
        const auto* xb = reinterpret_cast<const uint32_t*>(&xv[t][0]);
#pragma unroll
        for (int s = 0; s < 4; ++s)
          mma_16816<T>(acc[t], wa[2 * s], wb[2 * s], wa[2 * s + 1], wb[2 * s + 1], xb[2 * s], xb[2 * s + 1]);
      }
      if (i + p + kAhead < mine) load_w(i + p + kAhead, wbuf[p]);
    }
  }
  // The warp's sums, [kCols x rows][16 w rows] (stride kStride), then each output the sum of
  // its tile's splits in order, plus the bias, rounded once.
  float* part = s_part[warp];
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const int col = 8 * t + 2 * q;
    part[col * kStride + g] = acc[t][0];
    part[(col + 1) * kStride + g] = acc[t][1];
    part[col * kStride + g + 8] = acc[t][2];
    part[(col + 1) * kStride + g + 8] = acc[t][3];
  }
  __syncthreads();
  const T* bias = static_cast<const T*>(a.bias);
  T* out = static_cast<T*>(a.out);
  for (int o = threadIdx.x; o < WR * 16 * kCols; o += kGemmThreads) {
    const int r = o % 16, col = (o / 16) % kCols, tl = o / (16 * kCols);
    const int64_t n = (static_cast<int64_t>(blockIdx.y) * WR + tl) * 16 + r;
    const int m = m0 + col;
    if (n >= a.n || m >= a.m) continue;
    float v = s_part[tl * G][col * kStride + r];
    for (int sp = 1; sp < G; ++sp) v += s_part[tl * G + sp][col * kStride + r];
    if (bias) v += Num<T>::to(bias[n]);
    out[static_cast<int64_t>(m) * a.n + n] = Num<T>::from(v);
  }
#endif
}

template <class T, int MT, bool Silu>
int launch(const GemvArgs& a, cudaStream_t stream) {
  const unsigned xs = static_cast<unsigned>((a.m + 8 * MT - 1) / (8 * MT));
  const int64_t tiles = (a.n + 15) / 16;
  const auto go = [&](auto wr) {
    constexpr int WR = decltype(wr)::value;
    const dim3 grid(xs, static_cast<unsigned>((tiles + WR - 1) / WR));
    return launch_kernel(decode_gemm_kernel<T, MT, WR, Silu>, grid, kGemmThreads, 0, stream, a);
  };
  // More w tiles a block (fewer reads of x from L2 for each byte of w) where n leaves 256 blocks
  // a block of x rows at least. By n alone: WR sets the warps that split k (the sums' order),
  // which must not change with the batch.
  if (tiles >= 4 * 256) return go(std::integral_constant<int, 4>{});
  if (tiles >= 2 * 256) return go(std::integral_constant<int, 2>{});
  return go(std::integral_constant<int, 1>{});
}

}  // namespace

int decode_gemm(const GemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return 0;
  if (a.m > kDecodeGemmMaxRows || a.n > kDecodeGemmMaxCols || a.k <= 0 || a.k % kChunk != 0 || !a.x || !a.w || !a.out ||
      !aligned16(a.x) || !aligned16(a.w) || a.experts ||
      (a.input != GemvInput::plain && a.input != GemvInput::silu_mul))
    return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  return with_16bit_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    if (a.input == GemvInput::silu_mul) {  // up's loads too: at most 4 x tiles a block (registers)
      if (a.m <= 16) return launch<T, 2, true>(a, s);
      return launch<T, 4, true>(a, s);
    }
    if (a.m <= 16) return launch<T, 2, false>(a, s);
    if (a.m <= 32) return launch<T, 4, false>(a, s);
    return launch<T, 8, false>(a, s);
  });
}

}  // namespace rlx::cuda
