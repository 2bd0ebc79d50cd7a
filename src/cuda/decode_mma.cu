// Paged decode attention, pass 1 on tensor cores (fp16 and bf16, sm_80 and newer). The grid,
// the 128-token splits and the workspace are the other pass-1 kernels' (decode_attention.cu),
// so pass 2 and batch invariance are theirs too. A block takes one split of one sequence for
// the query heads (up to 8) that share a kv head; warp w takes the split's tokens
// [32w, 32w + 32):
//   load:    every lane issues all its 16-byte cp.async copies of the warp's keys and values
//            before anything waits (zeros past the context), into shared memory swizzled so
//            that ldmatrix's 8 rows of 16 bytes fall in 8 different bank groups;
//   scores:  S[16 x 32] = Q K^T by mma.m16n8k16, the group's heads the rows (8 of the 16
//            used), the tokens the columns: each (token, head) score once, with no conversion
//            or multiply on the CUDA cores; Q's fragments come straight from global memory;
//   softmax: a head's 32 scores sit in one lane quad: its max and sum are two shuffles each;
//   values:  O[16 x D] = P V, P's fragments the score accumulators rounded to T (as flash
//            attention rounds them), V's from ldmatrix.trans;
// then the warps merge in index order (write_split), as in the other pass-1 kernels.
#include <type_traits>

#include "decode_attention.cuh"
#include "mma.cuh"

namespace rlx::cuda {
namespace {

constexpr int kTokensPerWarp = 32;
static_assert(kWarps * kTokensPerWarp == hd::kDecodeSplitTokens);

// c += A B on the tensor cores (mma.cuh), A's rows 8-15 (a1, a3) zero: the group's heads fill
// rows 0-7.
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  mma_16816<T>(c, a0, 0u, a2, 0u, b0, b1);
}

// Two values rounded to T in one fragment register, `lo` in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  const T v[2] = {Num<T>::from(lo), Num<T>::from(hi)};
  uint32_t r;
  memcpy(&r, v, sizeof(r));
  return r;
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers; zeros where !valid.
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Four 8x8 matrices of 16-bit values, each row 16 bytes at the address its lane names
// (lanes 8i..8i+7: matrix i); .trans hands each lane the transposed pairs.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// Element index of 16-byte chunk `chunk` of row `row` in a [rows][D] tile whose chunks are
// XOR-swizzled by the row's low 3 bits.
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void wait_copies_but() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The warp's keys and values of tokens [first, first + 32) (zeros from `end` on) into its
// [32][D] tiles, every copy in flight before any wait: lane t finds token first + t in the
// block table, and the copies take it from that lane.
template <class T, int D>
__device__ __forceinline__ void load_warp_tokens(const DecodeAttentionArgs& a, int seq, int kv_head, int first, int end,
                                                 T* keys, T* values) {
  constexpr int kChunks = D / 8;  // 16-byte chunks of a row
  const int lane = threadIdx.x % 32;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  const hd::PagedLayout layout{a.block_size, a.kv_heads, D};
  const T* kpool = static_cast<const T*>(a.k_pool);
  const T* vpool = static_cast<const T*>(a.v_pool);
  const int64_t lane_token = first + lane < end ? hd::paged_token_offset(layout, table, first + lane, kv_head) : -1;
#pragma unroll
  for (int i = lane; i < kTokensPerWarp * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t token = __shfl_sync(0xffffffffu, lane_token, r);
    const bool valid = token >= 0;
    const int64_t at = valid ? token + c * 8 : 0;
    copy16_async(keys + swizzled<D>(r, c), kpool + at, valid);
    copy16_async(values + swizzled<D>(r, c), vpool + at, valid);
  }
}

// Q's fragments from global memory: row `row` (lane / 4) is head head0 + row, zero past `heads`.
template <class T, int D>
__device__ __forceinline__ void load_query(const DecodeAttentionArgs& a, int seq, int head0, int heads,
                                           uint32_t (&qf)[D / 16][2]) {
  const int lane = threadIdx.x % 32, row = lane / 4, pair = lane % 4;
  const T* q = static_cast<const T*>(a.q) + (static_cast<int64_t>(seq) * a.q_heads + head0 + row) * D + pair * 2;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    qf[k][0] = row < heads ? *reinterpret_cast<const uint32_t*>(q + k * 16) : 0u;
    qf[k][1] = row < heads ? *reinterpret_cast<const uint32_t*>(q + k * 16 + 8) : 0u;
  }
}

// The warp's 32 tokens from `first` (those from `end` on masked), its keys and values landed:
// scores, softmax and the values' product. o holds the unnormalised outputs in the
// accumulators' layout; m and l the softmax state of this lane's head (row lane / 4).
template <class T, int D>
__device__ __forceinline__ void warp_attention(const uint32_t (&qf)[D / 16][2], const T* keys, const T* values,
                                               int first, int end, float qscale, float (&o)[D / 8][4], float& m,
                                               float& l) {
  constexpr int kTiles = kTokensPerWarp / 8;  // score tiles of 8 tokens
  const int lane = threadIdx.x % 32, pair = lane % 4;
  // Scores: tile n holds tokens first + 8n .. +7; this lane's are 8n + 2 pair + {0, 1}.
  float s[kTiles][2];
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < D / 32; ++k) {
      uint32_t b[4];  // dims 32k .. 32k + 31 of the tile's 8 keys, 8 at a time
      load_matrices(b, keys + swizzled<D>(n * 8 + lane % 8, k * 4 + lane / 8));
      mma<T>(c, qf[2 * k][0], qf[2 * k][1], b[0], b[1]);
      mma<T>(c, qf[2 * k + 1][0], qf[2 * k + 1][1], b[2], b[3]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) s[n][j] = first + n * 8 + pair * 2 + j < end ? c[j] * qscale : -__builtin_huge_valf();
  }
  // Softmax over the warp's 32 tokens, per head (the lane quad of its row).
  m = -__builtin_huge_valf();
#pragma unroll
  for (int n = 0; n < kTiles; ++n) m = fmaxf(m, fmaxf(s[n][0], s[n][1]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  const float shift = m == -__builtin_huge_valf() ? 0.0f : m;  // a warp past the context: p = 0
  // The weights as the values' product takes them (rounded to T), and l their sum.
  l = 0.0f;
#pragma unroll
  for (int n = 0; n < kTiles; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[n][j] = round_to<T>(hd::hd_exp2(s[n][j] - shift));
      l += s[n][j];
    }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  // Values: 16 tokens a step; each ldmatrix.trans gives two 8-dim tiles' fragments.
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
#pragma unroll
  for (int k = 0; k < kTokensPerWarp / 16; ++k) {
    const uint32_t p_lo = pack<T>(s[2 * k][0], s[2 * k][1]);
    const uint32_t p_hi = pack<T>(s[2 * k + 1][0], s[2 * k + 1][1]);
#pragma unroll
    for (int d = 0; d < D / 16; ++d) {
      uint32_t b[4];
      load_matrices_transposed(b, values + swizzled<D>(k * 16 + (lane / 8 % 2) * 8 + lane % 8, d * 2 + lane / 16));
      mma<T>(o[2 * d], p_lo, p_hi, b[0], b[1]);
      mma<T>(o[2 * d + 1], p_lo, p_hi, b[2], b[3]);
    }
  }
}

// The warp's partial results into the block's [warp][head][D] outputs and [warp][head] states.
template <int D>
__device__ __forceinline__ void store_warp_partial(const float (&o)[D / 8][4], float m, float l,
                                                   float (*s_acc)[kMaxGroup][D], hd::SoftmaxState (*s_st)[kMaxGroup]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, row = lane / 4, pair = lane % 4;
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    s_acc[warp][row][d * 8 + pair * 2] = o[d][0];
    s_acc[warp][row][d * 8 + pair * 2 + 1] = o[d][1];
  }
  if (pair == 0) s_st[warp][row] = hd::SoftmaxState{m, l};
}

// The blocks an SM holds by shared memory (32 KB a block at head_dim 64, 64 KB at 128).
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32, D == 64 ? 6 : 3)
    decode_mma_kernel(DecodeAttentionArgs a, int max_splits) {
  static_assert(sizeof(T) == 2 && D % 32 == 0);
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async, ldmatrix and bf16 mma need sm_80 (RLX_CUDA_ARCHITECTURES)
#else
  extern __shared__ __align__(16) unsigned char smem[];
  const SplitBlock w = split_block(a);
  if (w.end <= w.begin) {
    // A sequence without context (never the engine's: a row holds at least its new token) gets
    // zeros, as pass 2 gives it, where no pass 2 runs.
    if (a.merge_counters && w.split == 0)
      for (int i = threadIdx.x; i < w.heads * D; i += blockDim.x)
        static_cast<T*>(a.out)[(static_cast<int64_t>(w.seq) * a.q_heads + w.head0 + i / D) * D + i % D] =
            Num<T>::from(0.0f);
    return;
  }
  const int warp = threadIdx.x / 32;
  // The warp's keys and values, every copy in flight before any wait; Q's fragments meanwhile.
  const int first = w.begin + warp * kTokensPerWarp;
  T* keys = reinterpret_cast<T*>(smem) + warp * kTokensPerWarp * D;
  T* values = keys + hd::kDecodeSplitTokens * D;
  load_warp_tokens<T, D>(a, w.seq, w.kv_head, first, w.end, keys, values);
  uint32_t qf[D / 16][2];
  load_query<T, D>(a, w.seq, w.head0, w.heads, qf);
  wait_copies();
  __syncwarp();
  float o[D / 8][4], m, l;
  warp_attention<T, D>(qf, keys, values, first, w.end, a.scale * hd::kLog2e, o, m, l);
  // Every warp is done with its keys and values: their space takes the partial results.
  __syncthreads();
  auto s_acc = reinterpret_cast<float(*)[kMaxGroup][D]>(smem);
  auto s_st = reinterpret_cast<hd::SoftmaxState(*)[kMaxGroup]>(smem + sizeof(float) * kWarps * kMaxGroup * D);
  store_warp_partial<D>(o, m, l, s_acc, s_st);
  __syncthreads();
  write_split<D>(a, s_acc, s_st, w.seq, w.head0, w.heads, w.split, max_splits);
  if (a.merge_counters) merge_if_last<T, D>(a, w, max_splits);
#endif
}

// Shared memory of the sequence kernel: two splits' keys and values (one landing while the
// other is used), then the warps' partial results and states.
template <class T, int D>
constexpr size_t sequence_shared_bytes() {
  return 2 * 2 * hd::kDecodeSplitTokens * D * sizeof(T) + sizeof(float) * kWarps * kMaxGroup * D +
         sizeof(hd::SoftmaxState) * kWarps * kMaxGroup;
}

// grid (kv heads x head chunks, sequences): a block takes one sequence's head chunk through all
// its splits, split s + 1's keys and values landing while split s is computed, each split's
// partial results merged as write_split merges them and folded into a running merge as pass 2
// folds them (the same operations in the same order: the split kernels' bits). Where batch x
// kv heads fills the device, no block waits on a workspace or a counter.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32, D == 64 ? 3 : 1)
    decode_mma_sequence_kernel(DecodeAttentionArgs a, int max_splits) {
  static_assert(sizeof(T) == 2 && D % 32 == 0);
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kSplit = hd::kDecodeSplitTokens;
  constexpr int kValues = (kMaxGroup * D + kWarps * 32 - 1) / (kWarps * 32);  // a thread's (head, dim) values
  const int seq = blockIdx.y;
  const int group = a.q_heads / a.kv_heads, chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int kv_head = blockIdx.x / chunks, g0 = (blockIdx.x % chunks) * kMaxGroup;
  const int heads = min(kMaxGroup, group - g0), head0 = kv_head * group + g0;
  const int context = min(a.context_lens[seq], a.max_context);
  const int splits = sequence_splits(a, seq, max_splits);
  const int warp = threadIdx.x / 32;
  T* tiles = reinterpret_cast<T*>(smem);  // [buffer][keys, values][kSplit][D]
  const auto keys_of = [&](int split) { return tiles + ((split & 1) * 2 * kSplit + warp * kTokensPerWarp) * D; };
  auto s_acc = reinterpret_cast<float(*)[kMaxGroup][D]>(smem + 2 * 2 * kSplit * D * sizeof(T));
  auto s_st = reinterpret_cast<hd::SoftmaxState(*)[kMaxGroup]>(smem + 2 * 2 * kSplit * D * sizeof(T) +
                                                               sizeof(float) * kWarps * kMaxGroup * D);
  const auto load_split = [&](int split) {
    const int begin = split * kSplit;
    load_warp_tokens<T, D>(a, seq, kv_head, begin + warp * kTokensPerWarp, min(context, begin + kSplit), keys_of(split),
                           keys_of(split) + kSplit * D);
    commit_copies();
  };
  if (splits > 0) load_split(0);
  uint32_t qf[D / 16][2];
  load_query<T, D>(a, seq, head0, heads, qf);
  const float qscale = a.scale * hd::kLog2e;
  hd::SoftmaxState total[kValues];
  float merged[kValues];
#pragma unroll
  for (int j = 0; j < kValues; ++j) total[j] = hd::softmax_empty(), merged[j] = 0.0f;
  for (int split = 0; split < splits; ++split) {
    // The next split's copies go out (into the buffer split - 1 used: the barrier at the end
    // of the last iteration freed it); then this split's are waited for.
    if (split + 1 < splits) {
      load_split(split + 1);
      wait_copies_but<1>();
    } else {
      wait_copies_but<0>();
    }
    __syncwarp();
    const int begin = split * kSplit, end = min(context, begin + kSplit);
    float o[D / 8][4], m, l;
    warp_attention<T, D>(qf, keys_of(split), keys_of(split) + kSplit * D, begin + warp * kTokensPerWarp, end, qscale, o,
                         m, l);
    store_warp_partial<D>(o, m, l, s_acc, s_st);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kValues; ++j) {
      const int i = static_cast<int>(threadIdx.x) + j * kWarps * 32;
      if (i < heads * D) {
        hd::SoftmaxState st;
        const float value = merge_warps<D>(s_acc, s_st, i / D, i % D, st);
        fold_split(total[j], merged[j], st, value);
      }
    }
    __syncthreads();  // the partial results read before the next split writes them
  }
  T* out = static_cast<T*>(a.out) + (static_cast<int64_t>(seq) * a.q_heads + head0) * D;
#pragma unroll
  for (int j = 0; j < kValues; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kWarps * 32;
    if (i < heads * D) out[i] = Num<T>::from(total[j].l > 0.0f ? merged[j] / total[j].l : 0.0f);
  }
#endif
}

}  // namespace

template <class T, int D>
int launch_decode_mma(const DecodeAttentionArgs& a, dim3 grid, int max_splits, cudaStream_t stream) {
  // Keys and values of a split; after them, the same space holds the warps' partial results.
  constexpr size_t kShared = 2 * hd::kDecodeSplitTokens * D * sizeof(T);
  static_assert(sizeof(float) * kWarps * kMaxGroup * D + sizeof(hd::SoftmaxState) * kWarps * kMaxGroup <= kShared);
  // Over 48 KB (head_dim 128) a kernel must ask for it; a failure shows in the launch's status.
  if constexpr (kShared > 48 * 1024)
    (void)cudaFuncSetAttribute(decode_mma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kShared));
  return launch_kernel(decode_mma_kernel<T, D>, grid, kWarps * 32, kShared, stream, a, max_splits);
}

template <class T, int D>
int launch_decode_mma_sequence(const DecodeAttentionArgs& a, int max_splits, cudaStream_t stream) {
  constexpr size_t kShared = sequence_shared_bytes<T, D>();
  // 144 KB at head_dim 128: more than sm_86/89/120 give a block (99 KB).
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return launch_status();
  if (static_cast<size_t>(optin) < kShared) return kSequenceDoesNotFit;
  if constexpr (kShared > 48 * 1024)
    (void)cudaFuncSetAttribute(decode_mma_sequence_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kShared));
  const int group = a.q_heads / a.kv_heads, chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(static_cast<unsigned>(a.kv_heads * chunks), static_cast<unsigned>(a.batch));
  return launch_kernel(decode_mma_sequence_kernel<T, D>, grid, kWarps * 32, kShared, stream, a, max_splits);
}

template int launch_decode_mma<__half, 64>(const DecodeAttentionArgs&, dim3, int, cudaStream_t);
template int launch_decode_mma<__half, 128>(const DecodeAttentionArgs&, dim3, int, cudaStream_t);
template int launch_decode_mma<__nv_bfloat16, 64>(const DecodeAttentionArgs&, dim3, int, cudaStream_t);
template int launch_decode_mma<__nv_bfloat16, 128>(const DecodeAttentionArgs&, dim3, int, cudaStream_t);
template int launch_decode_mma_sequence<__half, 64>(const DecodeAttentionArgs&, int, cudaStream_t);
template int launch_decode_mma_sequence<__half, 128>(const DecodeAttentionArgs&, int, cudaStream_t);
template int launch_decode_mma_sequence<__nv_bfloat16, 64>(const DecodeAttentionArgs&, int, cudaStream_t);
template int launch_decode_mma_sequence<__nv_bfloat16, 128>(const DecodeAttentionArgs&, int, cudaStream_t);

}  // namespace rlx::cuda
