// What the paged attention kernels and their CPU reference share: where a token's key
// and value live in the pool, how a sequence is cut into splits, and the online-softmax
// rules that add a key and merge two partial results.
//
// Pool layout, per layer and for keys and values alike: [block, kv_head, block_size,
// head_dim], so the block_size x head_dim values of one kv head in one block are
// contiguous and a warp reads a token's head_dim values in one coalesced load.
//
// Scores are kept in base 2 (s = q.k * scale * log2(e)), so exp is exp2.
//
// Splits ("flash decoding"): a sequence of L context tokens is cut into
// decode_splits(L) pieces of kDecodeSplitTokens tokens. The size is fixed in tokens, never
// chosen from the batch, and the partial results are merged in split order, so a
// sequence's output does not depend on what else is in the batch.
//
//   rlx::hd::PagedLayout L{.block_size = 16, .kv_heads = 2, .head_dim = 64};
//   int64_t at = rlx::hd::paged_token_offset(L, table, /*pos=*/37, /*kv_head=*/1);  // + dim
#pragma once

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "rlx/core/hd.hpp"

namespace rlx::hd {

constexpr int kDecodeSplitTokens = 128;
constexpr float kLog2e = 1.4426950408889634f;

RLX_HD int decode_splits(int context_tokens) {
  return (context_tokens + kDecodeSplitTokens - 1) / kDecodeSplitTokens;
}

struct PagedLayout {
  int32_t block_size = 16;
  int32_t kv_heads = 1;
  int32_t head_dim = 64;
};

// Element offset of (block, kv_head, slot in the block, dim) in one layer's pool.
RLX_HD int64_t paged_offset(const PagedLayout& l, int32_t block, int32_t kv_head, int32_t in_block, int32_t dim) {
  return ((static_cast<int64_t>(block) * l.kv_heads + kv_head) * l.block_size + in_block) * l.head_dim + dim;
}

// Offset of dim 0 of position `pos` of a sequence with block table `table`.
RLX_HD int64_t paged_token_offset(const PagedLayout& l, const int32_t* table, int64_t pos, int32_t kv_head) {
  return paged_offset(l, table[pos / l.block_size], kv_head, static_cast<int32_t>(pos % l.block_size), 0);
}

// Offset of dim 0 of the token in pool slot `slot` (block * block_size + in_block), as the
// engine's write slots name them.
RLX_HD int64_t paged_slot_offset(const PagedLayout& l, int64_t slot, int32_t kv_head) {
  return paged_offset(l, static_cast<int32_t>(slot / l.block_size), kv_head, static_cast<int32_t>(slot % l.block_size), 0);
}

RLX_HD float hd_exp2(float x) {
#if defined(__CUDA_ARCH__)
  return exp2f(x);
#else
  return std::exp2(x);
#endif
}

// The running softmax of one query head over some keys: m the largest score (base 2),
// l = sum of exp2(s - m). The weighted sum of values stays with the caller.
struct SoftmaxState {
  float m;
  float l;
};
RLX_HD SoftmaxState softmax_empty() { return {-__builtin_huge_valf(), 0.0f}; }

// Adds a key of score s: `scale_old` rescales the accumulator so far, `p` weighs the new value.
RLX_HD void softmax_add(SoftmaxState& st, float s, float& scale_old, float& p) {
  const float m = st.m > s ? st.m : s;
  scale_old = hd_exp2(st.m - m);  // 0 while empty (m = -inf)
  p = hd_exp2(s - m);
  st.l = st.l * scale_old + p;
  st.m = m;
}

// Merges b into a: `scale_a` and `scale_b` rescale their accumulators. Either may be empty.
RLX_HD void softmax_merge(SoftmaxState& a, const SoftmaxState& b, float& scale_a, float& scale_b) {
  const float m = a.m > b.m ? a.m : b.m;
  if (m == -__builtin_huge_valf()) {
    scale_a = 1.0f;
    scale_b = 0.0f;
    return;
  }
  scale_a = hd_exp2(a.m - m);
  scale_b = hd_exp2(b.m - m);
  a.l = a.l * scale_a + b.l * scale_b;
  a.m = m;
}

}  // namespace rlx::hd
