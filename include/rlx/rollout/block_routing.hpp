// The experts each cached token was routed to (mixture-of-experts models, rollout routing
// replay), kept beside the paged KV cache: one row of `layers x top_k` int16 per KV slot.
//
// The engine writes a token's row when a forward computes its keys and values, into the
// slot they went to, and reads a sequence's rows when it finishes. So whatever gave a
// sequence its keys also gives it their routing: its own forwards, its group leader's
// prompt (shared blocks), a copied block (copy-on-write copies the rows too), or another
// request's cached prefix (the rows of the forward that computed those blocks, with the
// same weights: the prefix cache is per weight version).
//
// Pure bookkeeping on the host (no tensors): [blocks][block_size][layers x top_k].
//
//   rlx::BlockRouting r(/*blocks=*/64, /*block_size=*/16, /*layers=*/2, /*top_k=*/2);
//   r.write(seq_blocks, /*from=*/0, /*n=*/3, rows);       // 3 tokens x 4 values
//   std::vector<int16_t> out;
//   r.read(seq_blocks, 0, 3, out);                        // the same 12 values
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "rlx/rollout/block_allocator.hpp"

namespace rlx {

class BlockRouting {
 public:
  BlockRouting() = default;  // records nothing (a dense model)
  BlockRouting(int32_t num_blocks, int32_t block_size, int32_t layers, int32_t top_k);

  bool enabled() const { return per_token_ > 0; }
  int32_t layers() const { return layers_; }
  int32_t top_k() const { return top_k_; }
  int64_t per_token() const { return per_token_; }  // layers x top_k
  int64_t bytes() const { return static_cast<int64_t>(slots_.size() * sizeof(int16_t)); }

  // Tokens [from, from + n) of a sequence whose KV blocks are `blocks` were routed as `rows`
  // ([n][layers x top_k]).
  void write(std::span<const BlockId> blocks, int64_t from, int64_t n, const int16_t* rows);
  // Appends the rows of tokens [from, to) of a sequence whose KV blocks are `blocks`.
  void read(std::span<const BlockId> blocks, int64_t from, int64_t to, std::vector<int16_t>& out) const;
  // Block `dst` becomes a copy of block `src` (copy-on-write).
  void copy(BlockId src, BlockId dst);

 private:
  size_t at(std::span<const BlockId> blocks, int64_t position) const;  // where token `position`'s row starts
  int32_t block_size_ = 0, layers_ = 0, top_k_ = 0;
  int64_t per_token_ = 0;
  std::vector<int16_t> slots_;
};

}  // namespace rlx
