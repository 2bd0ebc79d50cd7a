#include "rlx/rollout/block_routing.hpp"

#include <algorithm>

#include "rlx/core/error.hpp"

namespace rlx {

BlockRouting::BlockRouting(int32_t num_blocks, int32_t block_size, int32_t layers, int32_t top_k)
    : block_size_(block_size), layers_(layers), top_k_(top_k), per_token_(static_cast<int64_t>(layers) * top_k) {
  RLX_ASSERT(num_blocks >= 0 && block_size >= 1 && layers >= 0 && top_k >= 0, "BlockRouting({}, {}, {}, {})", num_blocks,
             block_size, layers, top_k);
  slots_.assign(static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size) * static_cast<size_t>(per_token_), -1);
}

size_t BlockRouting::at(std::span<const BlockId> blocks, int64_t position) const {
  const auto b = static_cast<size_t>(position / block_size_);
  RLX_ASSERT(position >= 0 && b < blocks.size(), "BlockRouting: token {} of a sequence of {} blocks", position,
             blocks.size());
  const auto slot = static_cast<size_t>(blocks[b]) * static_cast<size_t>(block_size_) +
                    static_cast<size_t>(position % block_size_);
  return slot * static_cast<size_t>(per_token_);
}

void BlockRouting::write(std::span<const BlockId> blocks, int64_t from, int64_t n, const int16_t* rows) {
  if (!enabled()) return;
  for (int64_t i = 0; i < n; ++i) std::copy_n(rows + i * per_token_, per_token_, slots_.data() + at(blocks, from + i));
}

void BlockRouting::read(std::span<const BlockId> blocks, int64_t from, int64_t to, std::vector<int16_t>& out) const {
  if (!enabled()) return;
  for (int64_t p = from; p < to; ++p) {
    const int16_t* r = slots_.data() + at(blocks, p);
    out.insert(out.end(), r, r + per_token_);
  }
}

void BlockRouting::copy(BlockId src, BlockId dst) {
  if (!enabled()) return;
  const auto n = static_cast<size_t>(block_size_) * static_cast<size_t>(per_token_);
  std::copy_n(slots_.data() + static_cast<size_t>(src) * n, n, slots_.data() + static_cast<size_t>(dst) * n);
}

}  // namespace rlx
