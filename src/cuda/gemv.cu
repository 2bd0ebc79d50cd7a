// y = x w^T (+ bias) for a few rows of x: decode's projections at small batch (at batch 1
// cuBLAS's GEMMs ran at about 30% of the copy bandwidth on an H200), with the layer's
// RMSNorm or SiLU-mul optionally taken on the way in so that its kernel goes (GemvInput).
//
// A team of `team` threads (16 to 256, chosen by k alone) owns R rows of w. Its thread t reads
// the 16-byte chunks t, t + team, ... of each of those rows, a batch of them in flight at once
// (all of them for k up to 6 team chunks), multiplies them by the same chunks of the M rows of
// x (read from L1, or from shared memory once normalised), and the team sums by butterfly,
// then across its warps in index order. Every sum is ordered by k alone: a row of x alone gives
// the bits it gives among others. Expert-indexed: each row of out against its own expert's
// matrix. The grid is no larger than the device holds at once; a block takes its groups of
// rows in turn, its norm or SiLU-mul staged once.
#include <algorithm>
#include <type_traits>

#include "common.cuh"

namespace rlx::cuda {
namespace {

constexpr int kGemvThreads = 256;
constexpr int kVec = 8;            // 16-bit values in 16 bytes
constexpr int kChunksAThread = 6;  // a team takes k's chunks 6 a thread (team_for)

// Threads a row of w for `chunks` 16-byte chunks: the fewest (at least 16) that leave each at
// most kChunksAThread, at most the block.
int team_for(int64_t chunks) {
  int team = 16;
  while (team < kGemvThreads && chunks > kChunksAThread * team) team *= 2;
  return team;
}

// A thread's chunks of its R rows loaded together: all kChunksAThread with one row, fewer with
// more rows (the registers; more rows run where the grid has many blocks to hide latency).
__host__ __device__ constexpr int batch_for(int rows) { return rows == 1 ? kChunksAThread : rows == 2 ? 3 : 2; }

// The rows of RMSNorm(x + add) * norm_weight into s ([rows, k] in T) exactly as
// add_rms_norm_vec_kernel computes them: its vector passes (common.cuh), the same threads on
// the same vectors in the same order, and the block's other warps add zeros to the sum. Block
// (0, 0) writes x + add to residual_out. `s_sum`: kGemvThreads / 32 floats.
template <class T>
__device__ void stage_norm(const GemvArgs& a, int rows, uint4* s, float* s_sum) {
  const int vecs = static_cast<int>(a.k / kVec);
  const int threads = norm_threads(vecs);
  const bool writer = a.add && blockIdx.x == 0 && blockIdx.y == 0;
  const auto* weight = static_cast<const uint4*>(a.norm_weight);
  for (int m = 0; m < rows; ++m) {
    const int64_t at = static_cast<int64_t>(m) * vecs;
    const auto* h = static_cast<const uint4*>(a.x) + at;
    const auto* add = a.add ? static_cast<const uint4*>(a.add) + at : nullptr;
    uint4* row = s + at;
    float squares = 0.0f;
    if (static_cast<int>(threadIdx.x) < threads) {
      for (int v = threadIdx.x; v < vecs; v += threads) {
        const uint4 sum = add_and_square<T>(h[v], add ? add + v : nullptr, squares);
        row[v] = sum;
        if (writer) static_cast<uint4*>(a.residual_out)[at + v] = sum;
      }
    }
    const float inv_rms = rsqrtf(block_reduce(squares, SumOp{}, s_sum) / static_cast<int>(a.k) + a.eps);
    for (int v = threadIdx.x; v < vecs; v += blockDim.x)  // block_reduce's barriers order the stores
      row[v] = rms_scaled_vector<T>(row[v], weight[v], inv_rms);
  }
  __syncthreads();
}

// SiLU(gate) * up of the rows into s ([rows, k] in T), as silu_mul computes it: the products
// then read it as a plain x. Each thread's chunks of gate and up are all in flight at once;
// read as the products needed them (a load in the team's inner loop, waited on before its
// arithmetic), the down projection took 11.6-13.1 us a launch at batch 1 on an H200, 0.7 TB/s.
template <class T>
__device__ void stage_silu(const GemvArgs& a, int rows, uint4* s) {
  const int64_t chunks = a.k / kVec;
  const auto* gate_up = static_cast<const uint4*>(a.x);
  for (int m = 0; m < rows; ++m)
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x)
      s[m * chunks + c] = silu_times_vector<T>(gate_up[2 * m * chunks + c], gate_up[(2 * m + 1) * chunks + c]);
  __syncthreads();
}

// The raw 16-byte chunks of one row of the product's input at one chunk index: x's own, or
// gate's and up's (SiLU-mul).
template <bool Silu>
struct InputChunk {
  uint4 raw[Silu ? 2 : 1];
};
template <bool Silu>
__device__ __forceinline__ InputChunk<Silu> load_input(const uint4* x, int64_t chunks, int m, int64_t c) {
  if constexpr (Silu)
    return {{x[2 * m * chunks + c], x[(2 * m + 1) * chunks + c]}};
  else
    return {{x[m * chunks + c]}};
}
// As floats: x's values, or SiLU(gate) * up rounded to T as silu_mul rounds it.
template <class T, bool Silu>
__device__ __forceinline__ void input_floats(const InputChunk<Silu>& in, float (&f)[kVec]) {
  if constexpr (Silu) {
    const T* g = reinterpret_cast<const T*>(&in.raw[0]);
    const T* u = reinterpret_cast<const T*>(&in.raw[1]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = Num<T>::to(silu_times<T>(Num<T>::to(g[j]), Num<T>::to(u[j])));
  } else {
    const T* e = reinterpret_cast<const T*>(&in.raw[0]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = Num<T>::to(e[j]);
  }
}

// Latency, not bandwidth, bounds these small products (an H200 trace, 2026-11-28: 0.5-1.7 TB/s
// of its 4.3), so every load a thread needs goes out before it uses any: the first batch of
// weight chunks before the kernel waits for the ones launched before it (weights are no
// decode kernel's output, kernels.hpp; with programmatic dependent launch they stream in while
// those end) and before the norm or SiLU-mul is staged, and with one row of x (staged, or
// plain) that row's chunks of the batch too.
// The arithmetic and its order are the same whatever is prefetched.
// One row of x (decode's, and the experts'): three blocks an SM (at most 80 registers), where
// a free choice took 88-101 and held two; more rows: two (94-128; three would spill). nvcc 13
// sm_90a spills none.
template <class T, int M, int R, bool Silu>
__global__ void __launch_bounds__(kGemvThreads, M == 1 ? 3 : 2)
    gemv_kernel(GemvArgs a, int team, int64_t groups_of_rows) {
  extern __shared__ uint4 s_x[];  // the normalised rows, or SiLU-mul's (staged: Silu false)
  __shared__ float s_red[kGemvThreads / 32][R * M];
  const int64_t chunks = a.k / kVec;
  const auto* w = static_cast<const uint4*>(a.w);
  const int t = threadIdx.x & (team - 1);
  // The grid is at most what the device holds at once: a block takes groups of rows g =
  // blockIdx.x, + gridDim.x, ... (its team the rows n0 .. n0 + R - 1 of each), and stages the
  // norm or SiLU-mul once for all of them.
  const auto first_row = [&](int64_t g) { return (g * (kGemvThreads / team) + threadIdx.x / team) * R; };
  int64_t n0 = first_row(blockIdx.x);
  bool active = n0 < a.n;
  constexpr int B = batch_for(R);
  uint4 wv[B][R];
  // A batch of chunks of the team's rows (zeros past k's and n's ends), issued together.
  const auto load_w = [&](int64_t base) {
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int64_t c = base + static_cast<int64_t>(b) * team;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[b][r] = active && c < chunks && n0 + r < a.n ? w[(n0 + r) * chunks + c] : make_uint4(0, 0, 0, 0);
    }
  };
  if (!a.experts) load_w(t);  // (the chosen experts are the kernel before's output)
  pdl_begin();
  const auto* x = static_cast<const uint4*>(a.x);
  T* out = static_cast<T*>(a.out);
  int rows = a.m;
  if (a.experts) {  // row blockIdx.y of out: its expert's matrix, its token's x (M is 1)
    const int i = blockIdx.y;
    w += a.experts[i] * a.n * chunks;
    x += static_cast<int64_t>(i / a.x_share) * chunks;
    out += static_cast<int64_t>(i) * a.n;
    rows = 1;
    load_w(t);
  }
  if (a.input == GemvInput::add_rms_norm) {
    stage_norm<T>(a, rows, s_x, &s_red[0][0]);
    x = s_x;
  } else if (!Silu && a.input == GemvInput::silu_mul) {
    stage_silu<T>(a, rows, s_x);
    x = s_x;
  }
  const T* bias = static_cast<const T*>(a.bias);
  for (int64_t g = blockIdx.x; g < groups_of_rows; g += gridDim.x) {
    if (g != blockIdx.x) {  // the next group's rows (the first group's were loaded above)
      n0 = first_row(g);
      active = n0 < a.n;
      load_w(t);
    }
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
    if (active) {
      // One row's chunks of x prefetched (registers: of eight rows, too many). Not unstaged
      // SiLU-mul's gate and up: twice the registers, fewer blocks an SM, and the down projection
      // took 13.1 us a launch against 11.6 us without (H200, batch 1, 2026-11-28).
      constexpr bool kPrefetchX = M == 1 && !Silu;
      for (int64_t base = t; base < chunks; base += static_cast<int64_t>(B) * team) {
        if (base != t) load_w(base);
        InputChunk<Silu> xv[kPrefetchX ? B : 1];
        if constexpr (kPrefetchX) {
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const int64_t c = base + static_cast<int64_t>(b) * team;
            if (c < chunks) xv[b] = load_input<Silu>(x, chunks, 0, c);
          }
        }
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const int64_t c = base + static_cast<int64_t>(b) * team;
          if (c >= chunks) break;
#pragma unroll
          for (int m = 0; m < M; ++m) {
            if (m >= rows) break;
            float xf[kVec];
            if constexpr (kPrefetchX)
              input_floats<T, Silu>(xv[b], xf);
            else
              input_floats<T, Silu>(load_input<Silu>(x, chunks, m, c), xf);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              const T* ws = reinterpret_cast<const T*>(&wv[b][r]);
#pragma unroll
              for (int j = 0; j < kVec; ++j) acc[r][m] += Num<T>::to(ws[j]) * xf[j];
            }
          }
        }
      }
    }
    // The team's sum: a butterfly over its lanes (every lane ends with the same bits), then, for
    // a team of several warps, their sums in index order.
    const int lanes = team < 32 ? team : 32;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m)
        for (int offset = lanes / 2; offset > 0; offset >>= 1)
          acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], offset);
    if (team > 32) {
      const int warp = threadIdx.x / 32;
      if (threadIdx.x % 32 == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < M; ++m) s_red[warp][r * M + m] = acc[r][m];
      __syncthreads();
      if (t == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < M; ++m) {
            float v = s_red[warp][r * M + m];
            for (int i = 1; i < team / 32; ++i) v += s_red[warp + i][r * M + m];
            acc[r][m] = v;
          }
      __syncthreads();  // s_red read before the next group's sums go in
    }
    if (t == 0 && n0 < a.n) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (n0 + r >= a.n) break;
        const float b = bias ? Num<T>::to(bias[n0 + r]) : 0.0f;
#pragma unroll
        for (int m = 0; m < M; ++m)
          if (m < rows) out[m * a.n + n0 + r] = Num<T>::from(acc[r][m] + b);
      }
    }
  }
}

// Staged rows (the norm's, or SiLU-mul's where they fit) sit in shared memory: the kernel
// then reads x plainly (Silu false); SiLU-mul's rows past kGemvNormBytes are computed from
// gate and up as the products need them (Silu true).
template <class T, int M, bool Silu>
int launch(const GemvArgs& a, cudaStream_t stream) {
  const bool staged = a.input == GemvInput::add_rms_norm ||
                      (a.input == GemvInput::silu_mul && static_cast<int64_t>(a.m) * a.k * 2 <= kGemvNormBytes);
  if constexpr (Silu)
    if (staged) return launch<T, M, false>(a, stream);
  const int team = team_for(a.k / kVec);
  const int64_t groups = kGemvThreads / team;  // row groups a block
  const int64_t blocks1 = (a.n + groups - 1) / groups;
  const unsigned ys = a.experts ? static_cast<unsigned>(a.m) : 1u;
  const size_t smem = staged ? static_cast<size_t>(a.m) * a.k * sizeof(T) : 0;
  const auto go = [&](auto r) {
    constexpr int R = decltype(r)::value;
    const int64_t groups_of_rows = (a.n + groups * R - 1) / (groups * R);
    // At most the blocks the device holds at once (a second partial wave would stage the norm
    // or SiLU-mul again and wait a whole block's latency): the blocks loop over the groups.
    // Expert-indexed rows (many, no staging) keep a block a group.
    int64_t blocks = groups_of_rows;
    int device = 0, sms = 0, per_sm = 0;
    const bool known = !a.experts && cudaGetDevice(&device) == cudaSuccess &&
                       cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
                       cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<T, M, R, Silu>, kGemvThreads,
                                                                     smem) == cudaSuccess;
    if (!known && !a.experts)
      (void)cudaGetLastError();  // the grid stays whole, and the query's error is not the launch's
    else if (known && per_sm > 0)
      blocks = std::min(blocks, static_cast<int64_t>(sms) * per_sm);
    const dim3 grid(static_cast<unsigned>(blocks), ys);
    return launch_kernel(gemv_kernel<T, M, R, Silu>, grid, kGemvThreads, smem, stream, a, team, groups_of_rows);
  };
  // More rows a team where the grid is large (the LM head), or where x's rows are many (each w
  // chunk then meets fewer reads of x from L1 for its products).
  if (blocks1 >= 4096) return go(std::integral_constant<int, 4>{});
  if (blocks1 >= 1024 || M >= 4) return go(std::integral_constant<int, 2>{});
  return go(std::integral_constant<int, 1>{});
}

template <class T, bool Silu>
int launch_rows(const GemvArgs& a, cudaStream_t stream) {
  if (a.m == 1 || a.experts) return launch<T, 1, Silu>(a, stream);
  if (a.m <= 4) return launch<T, 4, Silu>(a, stream);
  return launch<T, kGemvMaxRows, Silu>(a, stream);
}

bool valid(const GemvArgs& a) {
  if (a.m > (a.experts ? kGemvMaxExpertRows : kGemvMaxRows) || a.n > INT32_MAX || a.k <= 0 || a.k % kVec != 0 || !a.x ||
      !a.w || !a.out || !aligned16(a.x) || !aligned16(a.w))
    return false;
  if (a.experts) return a.input == GemvInput::plain && !a.bias && a.x_share >= 1;
  if (a.input != GemvInput::add_rms_norm) return true;
  // residual_out is written by one block while the others read x and add: never their memory.
  return a.norm_weight && aligned16(a.norm_weight) && a.k <= kGemvNormMaxWidth &&
         static_cast<int64_t>(a.m) * a.k * 2 <= kGemvNormBytes &&
         (!a.add || (aligned16(a.add) && a.residual_out && aligned16(a.residual_out) && a.residual_out != a.x &&
                     a.residual_out != a.add));
}

}  // namespace

int gemv(const GemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return 0;
  if (!valid(a)) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  return with_16bit_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    return a.input == GemvInput::silu_mul ? launch_rows<T, true>(a, s) : launch_rows<T, false>(a, s);
  });
}

}  // namespace rlx::cuda
