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
// The layer op before a projection taken on the way in, one kernel fewer a layer each, bit for bit
// the separate kernel then this GEMM (at most 4 x tiles a block: the second operand's registers):
// - GemvInput::silu_mul: x is the gate/up projection's output [m, 2k]; each operand vector is
//   SiLU(gate) * up as it is loaded (silu_times_vector, silu_mul's own).
// - GemvInput::add_rms_norm: first each of the block's rows' 1 / rms, a warp a row, reproducing
//   add_rms_norm_vec_kernel's sum of squares (norm_squares); blocks of the first column of w
//   tiles write x + add to residual_out. Then each operand vector is the rounded sum scaled
//   (add_rounded_vector, rms_scaled_vector: the norm kernel's own).
#include <type_traits>

#include "mma.cuh"

namespace rlx::cuda {
namespace {

constexpr int kGemmWarps = 8;
constexpr int kGemmThreads = kGemmWarps * 32;
constexpr int kChunk = kDecodeGemmWidthStep;  // k values a chunk: 4 mma slices
static_assert(kChunk == 64);
constexpr int kAhead = 2;   // a warp's w chunks in flight

// add_rms_norm_vec_kernel's sum of squares of row `row` (vecs 16-byte vectors, at most 1024)
// by one warp: its threads t < norm_threads(vecs), each summing vectors t, t + threads, ... in
// order, are this warp's lanes in turn (lane l is thread 32 w + l of its warp w), each warp's
// sums added by the same butterfly, then the warps in index order, as block_reduce does. With
// `residual` the rounded sums x + add are written there.
template <class T>
__device__ float norm_squares(const uint4* x, const uint4* add, uint4* residual, int64_t vecs) {
  const int lane = threadIdx.x % 32, threads = norm_threads(static_cast<int>(vecs));
  float total = 0.0f;
  for (int w = 0; w < threads / 32; ++w) {
    float squares = 0.0f;
    for (int64_t v = 32 * w + lane; v < vecs; v += threads) {
      const uint4 sum = add_and_square<T>(x[v], add ? add + v : nullptr, squares);
      if (residual) residual[v] = sum;
    }
    squares = warp_reduce(squares, SumOp{});
    total = w == 0 ? squares : total + squares;
  }
  return total;
}

template <class T, int MT, int WR, GemvInput In>
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
  constexpr bool Silu = In == GemvInput::silu_mul, Norm = In == GemvInput::add_rms_norm;
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
  const auto* add = static_cast<const uint4*>(a.add);
  const auto* norm_weight = static_cast<const uint4*>(a.norm_weight);

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
  // Norm (while the first w chunks load): each of the block's rows' 1 / rms, a warp a row; the
  // lane's row of each x tile kept.
  __shared__ float s_inv[Norm ? 8 * MT : 1];
  float inv_rms[Norm ? MT : 1];
  if constexpr (Norm) {
    auto* residual = a.add && blockIdx.y == 0 ? static_cast<uint4*>(a.residual_out) : nullptr;
    for (int r = warp; r < 8 * tiles; r += kGemmWarps) {
      const int64_t row = m0 + r;
      if (row >= a.m) break;
      const float squares = norm_squares<T>(x + row * vecs, add ? add + row * vecs : nullptr,
                                            residual ? residual + row * vecs : nullptr, vecs);
      if (lane == 0) s_inv[r] = rsqrtf(squares / static_cast<int>(a.k) + a.eps);
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < MT; ++t) inv_rms[t] = t < tiles && m0 + 8 * t + g < a.m ? s_inv[8 * t + g] : 0.0f;
  }
  for (int64_t i = 0; i < mine; i += kAhead) {
#pragma unroll
    for (int p = 0; p < kAhead; ++p) {
      if (i + p >= mine) break;
      const int64_t at = (split + (i + p) * G) * (kChunk / 8);
      uint4 xv[MT][2];  // every tile's x loads in flight together
      uint4 up[Silu || Norm ? MT : 1][2];  // Silu: up's; Norm: add's
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
        if constexpr (Norm) {
          up[t][0] = up[t][1] = zero;
          if (ok && add) {
            const uint4* ap = add + row * vecs + q + at;
            up[t][0] = ap[0];
            up[t][1] = ap[4];
          }
        }
      }
      if constexpr (Silu) {
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          xv[t][0] = silu_times_vector<T>(xv[t][0], up[t][0]);
          xv[t][1] = silu_times_vector<T>(xv[t][1], up[t][1]);
        }
      }
      if constexpr (Norm) {
        const uint4 nw0 = norm_weight[q + at], nw1 = norm_weight[q + at + 4];
#pragma unroll
        for (int t = 0; t < MT; ++t) {  // rows past m: zeros in, zeros out (their 1 / rms is 0)
          xv[t][0] = rms_scaled_vector<T>(add ? add_rounded_vector<T>(xv[t][0], up[t][0]) : xv[t][0], nw0, inv_rms[t]);
          xv[t][1] = rms_scaled_vector<T>(add ? add_rounded_vector<T>(xv[t][1], up[t][1]) : xv[t][1], nw1, inv_rms[t]);
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

template <class T, int MT, GemvInput In>
int launch(const GemvArgs& a, cudaStream_t stream) {
  const unsigned xs = static_cast<unsigned>((a.m + 8 * MT - 1) / (8 * MT));
  const int64_t tiles = (a.n + 15) / 16;
  const auto go = [&](auto wr) {
    constexpr int WR = decltype(wr)::value;
    const dim3 grid(xs, static_cast<unsigned>((tiles + WR - 1) / WR));
    return launch_kernel(decode_gemm_kernel<T, MT, WR, In>, grid, kGemmThreads, 0, stream, a);
  };
  // More w tiles a block (fewer reads of x from L2 for each byte of w) where n leaves 256 blocks
  // a block of x rows at least. By n alone: WR sets the warps that split k (the sums' order),
  // which must not change with the batch.
  if (tiles >= 4 * 256) return go(std::integral_constant<int, 4>{});
  if (tiles >= 2 * 256) return go(std::integral_constant<int, 2>{});
  return go(std::integral_constant<int, 1>{});
}

bool valid(const GemvArgs& a) {
  if (a.m > kDecodeGemmMaxRows || a.n > kDecodeGemmMaxCols || a.k <= 0 || a.k % kChunk != 0 || !a.x || !a.w || !a.out ||
      !aligned16(a.x) || !aligned16(a.w) || a.experts)
    return false;
  if (a.input != GemvInput::add_rms_norm) return true;
  // The norm kernel's vector path (k at most 8192); residual_out written while other blocks
  // read x and add: never their memory.
  return a.norm_weight && aligned16(a.norm_weight) && a.k <= kGemvNormMaxWidth &&
         (!a.add || (aligned16(a.add) && a.residual_out && aligned16(a.residual_out) && a.residual_out != a.x &&
                     a.residual_out != a.add));
}

template <class T, GemvInput In>
int launch_rows(const GemvArgs& a, cudaStream_t stream) {
  if (a.m <= 16) return launch<T, 2, In>(a, stream);
  if constexpr (In == GemvInput::plain) {
    if (a.m > 32) return launch<T, 8, In>(a, stream);
  }
  return launch<T, 4, In>(a, stream);  // a fold's second operand: at most 4 tiles (registers)
}

}  // namespace

int decode_gemm(const GemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return 0;
  if (!valid(a)) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  return with_16bit_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    switch (a.input) {
      case GemvInput::silu_mul:
        return launch_rows<T, GemvInput::silu_mul>(a, s);
      case GemvInput::add_rms_norm:
        return launch_rows<T, GemvInput::add_rms_norm>(a, s);
      case GemvInput::plain:
        break;
    }
    return launch_rows<T, GemvInput::plain>(a, s);
  });
}

}  // namespace rlx::cuda
