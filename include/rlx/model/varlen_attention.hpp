// Attention over packed sequences of different lengths, without a mask ("varlen"): the
// queries of all sequences in one [total_q, Hq, D] tensor, their keys and values in one
// [total_k, Hkv, D] tensor, and the cumulative lengths that cut both into sequences.
// Within a sequence of Lq queries and Lk >= Lq keys, query i sits at key position
// Lk - Lq + i and sees keys 0 .. Lk - Lq + i (causal, aligned to the end: a prefill has
// Lq == Lk, an extend step Lq new tokens after Lk - Lq cached ones).
//
// Both users of packed attention share it: the learner's full-sequence forward (packed
// rows, segments as sequences, padding runs as sequences of their own) and the rollout
// engine's prefill/extend steps over the paged KV cache (the context gathered ragged, no
// padding). On CUDA in bf16/fp16 it is LibTorch's varlen flash attention
// (`_flash_attention_forward` with cumulative sequence lengths: grouped-query heads native,
// autograd through its registered derivative); elsewhere a reference that runs each
// sequence through rlx::attention (what the CPU tests hold the layouts to).
//
//   auto seqs = rlx::varlen_seqs(/*q_lens=*/{3, 1}, /*k_lens=*/{3, 6}, device);
//   auto out = rlx::varlen_attention(q /*[4, Hq, D]*/, k /*[9, Hkv, D]*/, v, seqs, scale);
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <span>
#include <vector>

namespace rlx {

struct VarlenSeqs {
  at::Tensor cu_q, cu_k;               // int32 [seqs + 1], cumulative query and key counts, on the device
  at::Tensor kv_index;                 // int64 [total_k] on the device: the rows of k and v that are
                                       // the sequences' keys, in order (a shared prefix's rows once per
                                       // sequence that sees them); undefined: k and v as given
  std::vector<int64_t> q_lens, k_lens; // per sequence, on the host
  int64_t max_q = 0, max_k = 0;
  int64_t seqs() const { return static_cast<int64_t>(q_lens.size()); }
  int64_t total_q() const;
  int64_t total_k() const;
  bool defined() const { return cu_q.defined(); }
};

// Every sequence needs 1 <= q_len <= k_len.
VarlenSeqs varlen_seqs(std::span<const int64_t> q_lens, std::span<const int64_t> k_lens, at::Device device);

// The sequences of packed rows: `segments` [B, T] (0 = padding), rows flattened in order;
// each run of equal values in a row is one sequence (a padding run too, whose outputs
// nobody reads), queries and keys alike. With `prefix` (ForwardInput::prefix), a run whose
// tokens name a prefix segment has that segment's tokens before its own as keys (kv_index).
VarlenSeqs varlen_from_segments(const at::Tensor& segments, at::Device device, const at::Tensor& prefix = {});

// Whether varlen_attention runs LibTorch's flash kernel: CUDA with LibTorch >= 2.1,
// compute capability >= 8.0, bf16 or fp16, head_dim a multiple of 8 up to 256.
bool flash_varlen_supported(at::Device device, at::ScalarType dtype, int64_t head_dim);

// q [total_q, Hq, D]; k, v [total_k, Hkv, D] (Hq a multiple of Hkv), or with seqs.kv_index
// any rows that it indexes. Returns [total_q, Hq, D] in q's dtype. Differentiable in q, k and
// v on either path (a row indexed twice gets both gradients).
at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const VarlenSeqs& seqs,
                            double scale);

// The reference path alone (each sequence through rlx::attention with its end-aligned
// causal mask), on any device: what tests compare the flash kernel to.
at::Tensor varlen_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const VarlenSeqs& seqs, double scale);

}  // namespace rlx
