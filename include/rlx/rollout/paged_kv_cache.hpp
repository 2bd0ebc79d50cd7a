// The rollout engine's KV cache: one pool of fixed-size blocks per layer, read and
// written through per-sequence block tables (BlockAllocator does the bookkeeping).
//
// A step packs the new tokens of every scheduled sequence into one row
// ([1, total_new_tokens]: prefill chunks and single decode tokens side by side),
// so the projections and MLPs run on exactly the tokens that need them. Only
// attention unpacks them, per sequence, against that sequence's cached context. On CUDA a
// pool is [block, kv_head, block_size, head_dim] (cuda/attention_math.hpp) and a
// decode step reads it in place with the split-K decode kernel; prefill, extend and mixed
// steps gather the contexts ragged (no padding) into varlen attention (LibTorch's flash
// kernel in bf16/fp16: chunked prefill and prefix-shared blocks are sequences whose queries
// start after their cached tokens). CPU pools are token-major, [block, block_size,
// kv_head, head_dim], and a step pads every context to the longest under a mask.
//
//   rlx::PagedKVCache cache(model->config(), /*num_blocks=*/256, /*block_size=*/16, at::kFloat, at::kCPU);
//   cache.plan({{.blocks = table_a, .cached = 0, .new_tokens = 5}, {.blocks = table_b, .cached = 9, .new_tokens = 1}});
//   auto hidden = model->forward_hidden({.tokens = packed}, &cache);   // packed: [1, 6]
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "rlx/model/kv_cache.hpp"
#include "rlx/model/varlen_attention.hpp"
#include "rlx/rollout/block_allocator.hpp"

namespace rlx {

class PagedKVCache final : public KVCache {
 public:
  enum class Layout { for_device, head_major, token_major };  // for_device: head-major on CUDA
  PagedKVCache(const ModelConfig& cfg, int32_t num_blocks, int32_t block_size, at::ScalarType dtype,
               at::Device device, Layout layout = Layout::for_device);

  // Bytes one block takes across all layers (keys and values).
  static int64_t block_bytes(const ModelConfig& cfg, int32_t block_size, at::ScalarType dtype);

  int32_t num_blocks() const { return num_blocks_; }
  // One layer's key pool, for tests and diagnostics.
  const at::Tensor& keys(int64_t layer) const { return keys_.at(static_cast<size_t>(layer)); }
  int32_t block_size() const { return block_size_; }

  // One scheduled sequence of the next forward, in packed order.
  struct Entry {
    std::span<const BlockId> blocks;  // covers cached + new_tokens slots
    int64_t cached = 0;               // tokens already in the cache
    int64_t new_tokens = 0;           // tokens this step computes (>= 1)
  };
  // Sets the next forward's layout; the input must be [1, sum of new_tokens].
  void plan(std::span<const Entry> entries);
  // Decode steps into fixed buffers, for CUDA graphs: up to `max_seqs` sequences of one new
  // token each, contexts up to `max_blocks` blocks; padded rows write and read `pad_block`
  // only. Needs the head-major layout.
  void enable_static(int64_t max_seqs, int64_t max_blocks, BlockId pad_block);
  // Plans a decode step padded to `rows` sequences (entries.size() <= rows <= max_seqs): the
  // plan goes to the device in one copy, into the same buffers every time. attend() then
  // reads the pool in place (the decode kernel; on CPU its fp32 reference). `max_context`
  // (0: max_blocks * block_size) bounds the entries' contexts, sizes the kernel's grid and
  // the block tables (what the step stages is sized to its rows and this bound).
  void plan_static(std::span<const Entry> entries, int64_t rows, int64_t max_context = 0);
  int64_t static_staged_bytes() const { return static_staged_bytes_; }  // the last plan_static's copy
  bool static_enabled() const { return static_bytes_.defined(); }
  bool graph_step() const override { return static_step_; }
  int64_t static_max_seqs() const { return static_max_seqs_; }
  int64_t static_max_context() const { return static_max_blocks_ * block_size_; }

  // Frees the pools' memory (every block's contents are lost); restore() allocates them
  // again, zero-filled. Nothing may attend in between.
  void release();
  void restore();
  bool released() const { return keys_.empty(); }

  // Copies whole blocks (all layers): dst[i] <- src[i]. For copy-on-write.
  void copy_blocks(std::span<const std::pair<BlockId, BlockId>> src_dst);

  at::Tensor begin(const ForwardInput& in) override;
  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    double scale) override;
  at::Tensor attend_rotating(int64_t layer, const at::Tensor& qkv, const at::Tensor& inv_freq, int64_t q_heads,
                             double scale, const QkNorm& norm) override;
  void end() override {}

 private:
  // Attention over the pool, the step's keys and values already in it; q [1, packed, Hq, D].
  at::Tensor attend_stored(int64_t layer, const at::Tensor& q, double scale);
  // The pool rows (see ctx_rows_) of tokens at pool slots (block * block_size + offset).
  at::Tensor pool_rows(const at::Tensor& slots) const;

  void allocate();
  int32_t num_blocks_, block_size_;
  int64_t kv_heads_, layers_, head_dim_;
  at::TensorOptions options_;
  bool head_major_;  // CUDA: [block, Hkv, block_size, D] for the kernels; CPU: [block, block_size, Hkv, D]
  std::vector<at::Tensor> keys_, values_;  // per layer, head- or token-major
  // The planned step:
  int64_t packed_ = 0, seqs_ = 0, max_new_ = 0;
  at::Tensor positions_;   // [1, packed]
  // Rows of a pool (head-major: one per token and head; token-major: one per token):
  at::Tensor write_rows_;  // of each new token
  at::Tensor write_slots_; // head-major: block * block_size + offset of each new token (RoPE + append kernel)
  // The context a step gathers, one of three ways:
  at::Tensor tables_, context_lens_;  // GPU decode steps read in place: int32 [seqs, table width], [seqs]
  at::Tensor merge_counters_;  // CUDA: zeros the tensor-core decode kernel counts its splits in (this cache's stream)
  VarlenSeqs varlen_;                 // head-major: ragged, ctx_rows_ sequence after sequence, no padding
  at::Tensor ctx_rows_;    // of each context position (token-major: [seqs * max_ctx], block 0 past the end)
  // Static decode (enable_static): one host staging buffer (pinned on CUDA) and its device
  // twin, holding positions and write rows (int64), then lengths and tables (int32).
  at::Tensor static_bytes_, static_host_;
  int64_t static_max_seqs_ = 0, static_max_blocks_ = 0, static_staged_bytes_ = 0;
  BlockId pad_block_ = 0;
  bool static_step_ = false;  // the planned step is a static one
  int64_t max_ctx_ = 0;
  // Token-major only (the padded batch under a mask):
  at::Tensor q_index_;     // [seqs * max_new] packed index of each (sequence, new token), 0 for padding
  at::Tensor out_index_;   // [packed] row of each packed token in the [seqs * max_new] layout
  at::Tensor allowed_;     // [seqs, max_new, max_ctx]
};

}  // namespace rlx
