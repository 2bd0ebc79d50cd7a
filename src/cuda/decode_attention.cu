// Paged decode attention, split-K ("flash decoding"): one query token per sequence.
//
// Pass 1, grid (split, kv_head x head chunk, sequence): a thread block takes one split of
// kDecodeSplitTokens context tokens of one sequence and all the query heads (up to
// kMaxGroup of them) that share one kv head, so each key and value is read once for the
// whole GQA group, whatever its size (Qwen2.5-0.5B: 7). A warp reads kTokensPerWarp tokens
// at a time, each with kLanesPerToken lanes and one 16-byte load per lane. Each lane group
// keeps an online softmax per head; groups merge by a fixed butterfly, warps in index
// order, and the block writes (m, l, out / l) per head to the workspace.
// Pass 2, grid (sequence, kv head x head chunk): the splits merge in split order.
//
// Nothing depends on the batch: the split size is fixed, every reduction order is fixed.
// decode_tile_kernel below is the default pass 1 for fp16 and bf16 (DecodeAttentionArgs::kernel);
// decode_mma.cu has the tensor-core one.
#include <cfloat>
#include <type_traits>

#include "decode_attention.cuh"

namespace rlx::cuda {
namespace {

template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) decode_split_kernel(DecodeAttentionArgs a, int max_splits) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kLanesPerToken = D / kVec;
  constexpr int kTokensPerWarp = 32 / kLanesPerToken;
  static_assert(D % kVec == 0 && 32 % kLanesPerToken == 0 && kTokensPerWarp >= 1);
  pdl_begin();

  const SplitBlock w = split_block(a);
  if (w.end <= w.begin) return;
  const int seq = w.seq, split = w.split, begin = w.begin, end = w.end;
  const int kv_head = w.kv_head, heads = w.heads, head0 = w.head0;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane / kLanesPerToken, part = lane % kLanesPerToken;
  const float qscale = a.scale * hd::kLog2e;

  const T* q = static_cast<const T*>(a.q) + (static_cast<int64_t>(seq) * a.q_heads + head0) * D + part * kVec;
  float qv[kMaxGroup][kVec];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int j = 0; j < kVec; ++j) qv[g][j] = g < heads ? Num<T>::to(q[g * D + j]) * qscale : 0.0f;

  hd::SoftmaxState st[kMaxGroup];
  float acc[kMaxGroup][kVec];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    st[g] = hd::softmax_empty();
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[g][j] = 0.0f;
  }

  const hd::PagedLayout layout{a.block_size, a.kv_heads, D};
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  const T* kpool = static_cast<const T*>(a.k_pool);
  const T* vpool = static_cast<const T*>(a.v_pool);
  for (int base = begin + warp * kTokensPerWarp; base < end; base += kWarps * kTokensPerWarp) {
    const int t = base + sub;
    const bool valid = t < end;
    // One 16-byte load each (uint4 registers, read as kVec values of T).
    uint4 kraw = make_uint4(0, 0, 0, 0), vraw = make_uint4(0, 0, 0, 0);
    if (valid) {
      const int64_t at = hd::paged_token_offset(layout, table, t, kv_head) + part * kVec;
      kraw = *reinterpret_cast<const uint4*>(kpool + at);
      vraw = *reinterpret_cast<const uint4*>(vpool + at);
    }
    const T* kx = reinterpret_cast<const T*>(&kraw);
    const T* vx = reinterpret_cast<const T*>(&vraw);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) s += qv[g][j] * Num<T>::to(kx[j]);
#pragma unroll
      for (int offset = kLanesPerToken / 2; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
      if (valid && g < heads) {
        float scale_old, p;
        hd::softmax_add(st[g], s, scale_old, p);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[g][j] = acc[g][j] * scale_old + p * Num<T>::to(vx[j]);
      }
    }
  }

  // Lane groups of a warp merge by butterfly (the same pairs on every run).
#pragma unroll
  for (int offset = kLanesPerToken; offset < 32; offset <<= 1) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      hd::SoftmaxState other{__shfl_xor_sync(0xffffffffu, st[g].m, offset), __shfl_xor_sync(0xffffffffu, st[g].l, offset)};
      float sa, sb;
      hd::softmax_merge(st[g], other, sa, sb);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[g][j] = acc[g][j] * sa + __shfl_xor_sync(0xffffffffu, acc[g][j], offset) * sb;
    }
  }

  // Warps merge in index order through shared memory; warp 0 writes the split's result.
  __shared__ float s_acc[kWarps][kMaxGroup][D];
  __shared__ hd::SoftmaxState s_st[kWarps][kMaxGroup];
  if (sub == 0) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) s_acc[warp][g][part * kVec + j] = acc[g][j];
      if (part == 0) s_st[warp][g] = st[g];
    }
  }
  __syncthreads();
  write_split<D>(a, s_acc, s_st, seq, head0, heads, split, max_splits);
}

// Pass 1, tiled (the default for fp16 and bf16): the grid, splits and workspace of the split
// kernel above, but each warp takes its tokens kTile at a time in three phases, so that each
// (token, head) score is computed once and each head's softmax is updated once per tile:
//   scores: lane groups read the tile's keys coalesced (kLanesPerToken lanes a key, 16 bytes
//           each, every load of the tile issued before any arithmetic) and reduce each head's
//           dot product over the group; the scores go to shared memory;
//   softmax: lane t takes token t: the tile's max and sum per head by warp butterfly (every
//           lane gets the same values), weights p back to shared memory, the running (m, l),
//           and the factor that rescales what the warp summed before;
//   values: lane j owns dims [j * kDims, (j + 1) * kDims): for each token one coalesced read
//           of its value row, acc[g] += p[g][t] * v.
// The split's block-table entries are read once, into shared memory. The warps then merge
// in index order as above, and pass 2 is the same.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32, 4) decode_tile_kernel(DecodeAttentionArgs a, int max_splits) {
  static_assert(sizeof(T) == 2, "the tiled kernel reads 16-bit keys and values");
  pdl_begin();
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kLanesPerToken = D / kVec;
  constexpr int kTokensPerRound = 32 / kLanesPerToken;
  constexpr int kTile = 32;
  constexpr int kRounds = kTile / kTokensPerRound;
  // Key loads in flight a lane: 4 x 16 bytes (32 KB an SM at 4 blocks, twice what hides
  // HBM's latency at full bandwidth). All of a tile's rounds at once (16 at head_dim 128)
  // held 64 registers of keys and spilled 246 bytes at 168 registers; in fours: 111-128, none.
  constexpr int kChunk = 4;
  static_assert(kRounds % kChunk == 0);
  constexpr int kDims = D / 32;
  static_assert(D % kVec == 0 && 32 % kLanesPerToken == 0 && kDims >= 1 && (kDims == 2 || kDims == 4));
  using VecV = std::conditional_t<kDims == 2, uint32_t, uint2>;  // kDims values of T

  const SplitBlock w = split_block(a);
  if (w.end <= w.begin) return;
  const int seq = w.seq, split = w.split, begin = w.begin, end = w.end;
  const int kv_head = w.kv_head, heads = w.heads, head0 = w.head0;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane / kLanesPerToken, part = lane % kLanesPerToken;

  __shared__ float s_q[kMaxGroup][D];  // q * scale * log2(e); zero past `heads`
  __shared__ int32_t s_table[hd::kDecodeSplitTokens + 1];
  __shared__ float s_p[kWarps][kMaxGroup][kTile];  // a warp's tile: scores, then weights
  __shared__ float s_acc[kWarps][kMaxGroup][D];
  __shared__ hd::SoftmaxState s_st[kWarps][kMaxGroup];

  const float qscale = a.scale * hd::kLog2e;
  const T* q = static_cast<const T*>(a.q) + (static_cast<int64_t>(seq) * a.q_heads + head0) * D;
  for (int i = threadIdx.x; i < kMaxGroup * D; i += blockDim.x)
    s_q[i / D][i % D] = i / D < heads ? Num<T>::to(q[i]) * qscale : 0.0f;
  const int bs = a.block_size, first_block = begin / bs;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  for (int i = threadIdx.x; i <= (end - 1) / bs - first_block; i += blockDim.x) s_table[i] = table[first_block + i];
  __syncthreads();

  const T* kpool = static_cast<const T*>(a.k_pool);
  const T* vpool = static_cast<const T*>(a.v_pool);
  const hd::PagedLayout layout{bs, a.kv_heads, D};
  auto token_offset = [&](int t) {
    return hd::paged_offset(layout, s_table[t / bs - first_block], kv_head, t % bs, 0);
  };

  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][kDims];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -__builtin_huge_valf();
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < kDims; ++j) acc[g][j] = 0.0f;
  }

  for (int tile0 = begin + warp * kTile; tile0 < end; tile0 += kWarps * kTile) {
    // Scores, kChunk rounds of key loads at a time (all of them before their arithmetic).
#pragma unroll
    for (int r0 = 0; r0 < kRounds; r0 += kChunk) {
      uint4 kraw[kChunk];
#pragma unroll
      for (int r = 0; r < kChunk; ++r) {
        const int t = tile0 + (r0 + r) * kTokensPerRound + sub;
        kraw[r] =
            t < end ? *reinterpret_cast<const uint4*>(kpool + token_offset(t) + part * kVec) : make_uint4(0, 0, 0, 0);
      }
      for (int g = 0; g < heads; ++g) {
        float qc[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) qc[j] = s_q[g][part * kVec + j];
#pragma unroll
        for (int r = 0; r < kChunk; ++r) {
          const T* kx = reinterpret_cast<const T*>(&kraw[r]);
          float s = 0.0f;
#pragma unroll
          for (int j = 0; j < kVec; ++j) s += qc[j] * Num<T>::to(kx[j]);
#pragma unroll
          for (int offset = kLanesPerToken / 2; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
          const int tt = (r0 + r) * kTokensPerRound + sub;
          if (part == 0) s_p[warp][g][tt] = tile0 + tt < end ? s : -__builtin_huge_valf();
        }
      }
    }
    __syncwarp();
    // Softmax: lane t, token tile0 + t.
    float alpha[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      alpha[g] = 1.0f;
      if (g < heads) {
        const float s = s_p[warp][g][lane];
        const float mt = warp_reduce(s, MaxOp{});  // finite: a tile holds a token
        const float mn = m[g] > mt ? m[g] : mt;
        const float p = hd::hd_exp2(s - mn);  // 0 past the end (s = -inf)
        const float sum = warp_reduce(p, SumOp{});
        alpha[g] = hd::hd_exp2(m[g] - mn);  // 0 before the first tile
        l[g] = l[g] * alpha[g] + sum;
        m[g] = mn;
        s_p[warp][g][lane] = p;
      }
    }
    __syncwarp();
    // Values.
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
      for (int j = 0; j < kDims; ++j) acc[g][j] *= alpha[g];
#pragma unroll 8
    for (int tt = 0; tt < kTile; ++tt) {
      const int t = tile0 + tt;
      if (t >= end) break;
      const VecV raw = *reinterpret_cast<const VecV*>(vpool + token_offset(t) + lane * kDims);
      const T* vx = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < heads) {
          const float p = s_p[warp][g][tt];
#pragma unroll
          for (int j = 0; j < kDims; ++j) acc[g][j] += p * Num<T>::to(vx[j]);
        }
      }
    }
    __syncwarp();  // s_p is the next tile's
  }

  // Warps merge in index order; the block writes the split's (out / l, m, l) per head.
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int j = 0; j < kDims; ++j) s_acc[warp][g][lane * kDims + j] = acc[g][j];
    if (lane == 0) s_st[warp][g] = hd::SoftmaxState{m[g], l[g]};
  }
  __syncthreads();
  write_split<D>(a, s_acc, s_st, seq, head0, heads, split, max_splits);
}

// Pass 2, grid (sequence, kv head x head chunk): pass 1's grid without its splits.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) decode_merge_kernel(DecodeAttentionArgs a, int max_splits) {
  pdl_begin();
  SplitBlock w;
  w.seq = static_cast<int>(blockIdx.x);
  head_chunk(a, static_cast<int>(blockIdx.y), w);
  merge_splits<T, D>(a, w.seq, w.head0, w.heads, sequence_splits(a, w.seq, max_splits), max_splits);
}

template <class T, int D>
int launch(const DecodeAttentionArgs& a, cudaStream_t stream) {
  const int max_splits = hd::decode_splits(a.max_context);
  const int group = a.q_heads / a.kv_heads;
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(max_splits, a.kv_heads * chunks, a.batch);
  int status = 0;
  if constexpr (sizeof(T) == 2) {
    if (a.kernel == DecodeAttentionKernel::mma_sequence) {
      status = launch_decode_mma_sequence<T, D>(a, max_splits, stream);
      if (status != kSequenceDoesNotFit) return status;
    }
    if (a.kernel == DecodeAttentionKernel::mma || a.kernel == DecodeAttentionKernel::mma_sequence) {
      status = launch_decode_mma<T, D>(a, grid, max_splits, stream);
      if (status != 0 || a.merge_counters) return status;  // its blocks merged the splits
    } else if (a.kernel == DecodeAttentionKernel::tiled) {
      status = launch_kernel(decode_tile_kernel<T, D>, grid, kWarps * 32, 0, stream, a, max_splits);
    } else {
      status = launch_kernel(decode_split_kernel<T, D>, grid, kWarps * 32, 0, stream, a, max_splits);
    }
  } else {
    status = launch_kernel(decode_split_kernel<T, D>, grid, kWarps * 32, 0, stream, a, max_splits);  // fp32
  }
  if (status != 0) return status;
  return launch_kernel(decode_merge_kernel<T, D>, dim3(a.batch, a.kv_heads * chunks), kWarps * 32, 0, stream, a,
                       max_splits);
}

}  // namespace

size_t decode_attention_workspace(int batch, int q_heads, int head_dim, int max_context) {
  return static_cast<size_t>(batch) * q_heads * hd::decode_splits(max_context) * (head_dim + 2);
}

size_t decode_attention_counters(int batch, int q_heads, int kv_heads) {
  const int group = kv_heads > 0 ? q_heads / kv_heads : 0;
  return static_cast<size_t>(batch) * kv_heads * ((group + kMaxGroup - 1) / kMaxGroup);
}

int decode_attention(const DecodeAttentionArgs& a, void* stream) {
  if (a.batch <= 0) return 0;
  // The workspace's partial results are read as float2 (merge_splits): 8-byte aligned.
  if (a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.max_context <= 0 || a.block_size <= 0 ||
      a.max_blocks * a.block_size < a.max_context || reinterpret_cast<uintptr_t>(a.workspace) % 8 != 0)
    return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    switch (a.head_dim) {
      case 64: return launch<T, 64>(a, s);
      case 128: return launch<T, 128>(a, s);
      default: return cudaErrorInvalidValue;
    }
  });
}

const char* error_string(int status) { return cudaGetErrorString(static_cast<cudaError_t>(status)); }

}  // namespace rlx::cuda
