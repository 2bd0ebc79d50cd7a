// What the pass-1 kernels of paged decode attention share (decode_attention.cu: the split
// and tiled kernels, pass 2 and the launcher; decode_mma.cu: the tensor-core kernel): the
// block shape, the workspace of per-split partial results, and the warps' merge that ends
// every pass 1.
#pragma once

#include "common.cuh"
#include "rlx/cuda/attention_math.hpp"

namespace rlx::cuda {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;  // query heads per thread block; larger groups take several

// Workspace per (sequence, q head, split): head_dim outputs (normalised), then m and l.
__host__ __device__ inline int64_t partial_index(int seq, int head, int split, int q_heads, int max_splits, int d) {
  return ((static_cast<int64_t>(seq) * q_heads + head) * max_splits + split) * (d + 2);
}

// A pass-1 block's work (grid: split, kv head x head chunk, sequence): split `split` of
// sequence `seq`, its tokens [begin, end) (none where the sequence is shorter), for the query
// heads [head0, head0 + heads) of kv head `kv_head`.
struct SplitBlock {
  int seq, split, begin, end, kv_head, head0, heads;
};
// Head chunk `chunk` (a grid's kv head x head chunk index): its kv head and query heads.
__device__ inline void head_chunk(const DecodeAttentionArgs& a, int chunk, SplitBlock& w) {
  const int group = a.q_heads / a.kv_heads, chunks = (group + kMaxGroup - 1) / kMaxGroup;
  w.kv_head = chunk / chunks;
  const int g0 = (chunk % chunks) * kMaxGroup;
  w.heads = min(kMaxGroup, group - g0);
  w.head0 = w.kv_head * group + g0;
}
__device__ inline SplitBlock split_block(const DecodeAttentionArgs& a) {
  SplitBlock w;
  w.seq = blockIdx.z;
  w.split = blockIdx.x;
  w.begin = w.split * hd::kDecodeSplitTokens;
  // Clamped: a context over max_context (a caller's bug) must not read past its table row.
  w.end = min(min(a.context_lens[w.seq], a.max_context), w.begin + hd::kDecodeSplitTokens);
  head_chunk(a, static_cast<int>(blockIdx.y), w);
  return w;
}

// One step of a merge: state b and its accumulator values vb (scaled as the caller's sum needs)
// into (a, va), N values that share the states, every rounding fixed (__fmaf_rn, __fmul_rn)
// rather than left to nvcc's contraction of x * s + y * t, which chose differently in pass 2
// and in the sequence kernel (a review's PTX reading): both now give the same bits. Both
// states empty: a and va unchanged.
template <int N>
__device__ __forceinline__ void merge_step(hd::SoftmaxState& a, float (&va)[N], const hd::SoftmaxState& b,
                                           const float (&vb)[N]) {
  const float m = a.m > b.m ? a.m : b.m;
  if (m == -__builtin_huge_valf()) return;
  const float sa = hd::hd_exp2(a.m - m), sb = hd::hd_exp2(b.m - m);
  a.l = __fmaf_rn(a.l, sa, __fmul_rn(b.l, sb));
  a.m = m;
#pragma unroll
  for (int j = 0; j < N; ++j) va[j] = __fmaf_rn(vb[j], sb, __fmul_rn(va[j], sa));
}
__device__ __forceinline__ void merge_step(hd::SoftmaxState& a, float& va, const hd::SoftmaxState& b, float vb) {
  float v[1] = {va};
  const float w[1] = {vb};
  merge_step(a, v, b, w);
  va = v[0];
}

// Value (g, d) of a split: the block's warps' partial results merged in index order; the state
// (m, l) into `total`, the output normalised by l.
template <int D>
__device__ __forceinline__ float merge_warps(const float (*s_acc)[kMaxGroup][D],
                                             const hd::SoftmaxState (*s_st)[kMaxGroup], int g, int d,
                                             hd::SoftmaxState& total) {
  total = s_st[0][g];
  float o = s_acc[0][g][d];
  for (int w = 1; w < kWarps; ++w) merge_step(total, o, s_st[w][g], s_acc[w][g][d]);
  return total.l > 0.0f ? o / total.l : 0.0f;
}

// The block's warps merge in index order; the block writes the split's (out / l, m, l) per
// head to the workspace. Both pass-1 kernels end here, after a barrier.
template <int D>
__device__ inline void write_split(const DecodeAttentionArgs& a, const float (*s_acc)[kMaxGroup][D],
                                   const hd::SoftmaxState (*s_st)[kMaxGroup], int seq, int head0, int heads, int split,
                                   int max_splits) {
  for (int i = threadIdx.x; i < heads * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    hd::SoftmaxState total;
    const float o = merge_warps<D>(s_acc, s_st, g, d, total);
    float* dst = a.workspace + partial_index(seq, head0 + g, split, a.q_heads, max_splits, D);
    dst[d] = o;
    if (d == 0) {
      dst[D] = total.m;
      dst[D + 1] = total.l;
    }
  }
}

// Pass 2's step: the next split's partial result (its normalised value and state) into a
// running merge of the splits before it.
__device__ __forceinline__ void fold_split(hd::SoftmaxState& total, float& o, const hd::SoftmaxState& split,
                                           float value) {
  merge_step(total, o, split, __fmul_rn(value, split.l));
}

// Pass 2 for one (sequence, head chunk), by a block of exactly kWarps * 32 threads (the thread
// mapping assumes it): each of the heads
// [head0, head0 + heads) merged over the sequence's `splits` partial results in split order,
// fold_split's operations for each value (the sequence kernel's bits). A thread takes kDims
// adjacent dims of one head, and loads kChunk splits' partial results before it folds them:
// one round trip to L2 a chunk of splits, where a value at a time made one a split and a value
// (4 x 5 of them in a row at a 576-token context). Loads bypass L1: a pass-1 block that merges
// reads what other blocks of the same kernel wrote.
template <class T, int D>
__device__ inline void merge_splits(const DecodeAttentionArgs& a, int seq, int head0, int heads, int splits,
                                    int max_splits) {
  constexpr int kDims = kMaxGroup * D / (kWarps * 32);  // 4 at head_dim 64, 8 at 128
  constexpr int kChunk = 32 / kDims;                    // 6 or 10 registers a split
  static_assert(kDims % 2 == 0 && D % kDims == 0);
  const int g = static_cast<int>(threadIdx.x) / (D / kDims), d0 = static_cast<int>(threadIdx.x) % (D / kDims) * kDims;
  if (g >= heads) return;
  // A split's record is D + 2 floats: 8-byte aligned, so its values and (m, l) load as float2.
  const float* part = a.workspace + partial_index(seq, head0 + g, 0, a.q_heads, max_splits, D);
  hd::SoftmaxState total = hd::softmax_empty();
  float o[kDims] = {};
  for (int s0 = 0; s0 < splits; s0 += kChunk) {
    float2 ml[kChunk], v[kChunk][kDims / 2];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const float* p = part + static_cast<int64_t>(min(s0 + i, splits - 1)) * (D + 2);
      ml[i] = __ldcg(reinterpret_cast<const float2*>(p + D));
#pragma unroll
      for (int j = 0; j < kDims / 2; ++j) v[i][j] = __ldcg(reinterpret_cast<const float2*>(p + d0) + j);
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (s0 + i >= splits) break;
      const hd::SoftmaxState st{ml[i].x, ml[i].y};
      float vb[kDims];
#pragma unroll
      for (int j = 0; j < kDims / 2; ++j) {
        vb[2 * j] = __fmul_rn(v[i][j].x, st.l);
        vb[2 * j + 1] = __fmul_rn(v[i][j].y, st.l);
      }
      merge_step(total, o, st, vb);
    }
  }
  T* out = static_cast<T*>(a.out) + (static_cast<int64_t>(seq) * a.q_heads + head0 + g) * D + d0;
#pragma unroll
  for (int j = 0; j < kDims; ++j) out[j] = Num<T>::from(total.l > 0.0f ? o[j] / total.l : 0.0f);
}

// The splits a sequence's context takes (clamped: a context over max_context, a caller's bug,
// must not read another head's partials).
__device__ inline int sequence_splits(const DecodeAttentionArgs& a, int seq, int max_splits) {
  return min(hd::decode_splits(min(a.context_lens[seq], a.max_context)), max_splits);
}

// After write_split, with a.merge_counters: the block that finishes its (sequence, head chunk)'s
// last split merges them all, in split order as pass 2 does (the same values), and zeroes the
// counter for the next call.
template <class T, int D>
__device__ inline void merge_if_last(const DecodeAttentionArgs& a, const SplitBlock& w, int max_splits) {
  __shared__ int s_last;
  const int splits = sequence_splits(a, w.seq, max_splits);
  __threadfence();  // this block's partial results, before its count
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = a.merge_counters + static_cast<int64_t>(w.seq) * gridDim.y + blockIdx.y;
    s_last = atomicAdd(counter, 1) + 1 == splits;
    if (s_last) *counter = 0;  // every other split has counted
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // the other blocks' partial results, after their counts
  merge_splits<T, D>(a, w.seq, w.head0, w.heads, splits, max_splits);
}

// Pass 1 on tensor cores (decode_mma.cu), fp16 and bf16, on the split kernel's grid and
// workspace; sm_80 and newer.
template <class T, int D>
int launch_decode_mma(const DecodeAttentionArgs& a, dim3 grid, int max_splits, cudaStream_t stream);
// The same splits' arithmetic, a block a (sequence, head chunk) taking its splits in turn and
// merging them as pass 2 does (the same bits; no workspace, no pass 2). kSequenceDoesNotFit,
// launching nothing, where the device cannot give a block its shared memory.
constexpr int kSequenceDoesNotFit = -1;
template <class T, int D>
int launch_decode_mma_sequence(const DecodeAttentionArgs& a, int max_splits, cudaStream_t stream);

}  // namespace rlx::cuda
