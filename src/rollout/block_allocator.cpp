#include "rlx/rollout/block_allocator.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "rlx/core/error.hpp"

namespace rlx {

BlockAllocator::BlockAllocator(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      refs_(static_cast<size_t>(num_blocks), 0),
      evictable_pos_(static_cast<size_t>(num_blocks)),
      hash_of_(static_cast<size_t>(num_blocks)) {
  RLX_CHECK(num_blocks >= 1 && block_size >= 1, "BlockAllocator: num_blocks ({}) and block_size ({}) must be >= 1",
            num_blocks, block_size);
  free_.reserve(static_cast<size_t>(num_blocks));
  // Handed out in increasing order.
  for (BlockId b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

void BlockAllocator::check(BlockId b) const {
  RLX_ASSERT(b >= 0 && b < num_blocks(), "block id {} out of range [0, {})", b, num_blocks());
}

std::optional<BlockId> BlockAllocator::allocate() {
  BlockId b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!evictable_.empty()) {
    b = evictable_.front();
    evictable_.pop_front();
    unpublish(b);
    ++stats_.evictions;
  } else {
    return std::nullopt;
  }
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockAllocator::retain(BlockId b) {
  check(b);
  auto& r = refs_[static_cast<size_t>(b)];
  RLX_ASSERT(r > 0, "retain of free block {}", b);
  ++r;
}

void BlockAllocator::release(BlockId b) {
  check(b);
  auto& r = refs_[static_cast<size_t>(b)];
  RLX_ASSERT(r > 0, "release of free block {}", b);
  if (--r > 0) return;
  if (hash_of_[static_cast<size_t>(b)]) {
    evictable_.push_back(b);
    evictable_pos_[static_cast<size_t>(b)] = std::prev(evictable_.end());
  } else {
    free_.push_back(b);
  }
}

int32_t BlockAllocator::ref_count(BlockId b) const {
  check(b);
  return refs_[static_cast<size_t>(b)];
}

uint64_t BlockAllocator::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  return XXH64(tokens.data(), tokens.size_bytes(), parent);
}

std::optional<BlockId> BlockAllocator::lookup(uint64_t hash) {
  ++stats_.lookups;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const BlockId b = it->second;
  auto& r = refs_[static_cast<size_t>(b)];
  if (r == 0) evictable_.erase(evictable_pos_[static_cast<size_t>(b)]);
  ++r;
  ++stats_.hits;
  return b;
}

void BlockAllocator::publish(BlockId b, uint64_t hash) {
  check(b);
  RLX_ASSERT(refs_[static_cast<size_t>(b)] > 0, "publish of free block {}", b);
  if (hash_of_[static_cast<size_t>(b)] || by_hash_.contains(hash)) return;
  hash_of_[static_cast<size_t>(b)] = hash;
  by_hash_.emplace(hash, b);
}

void BlockAllocator::unpublish(BlockId b) {
  auto& h = hash_of_[static_cast<size_t>(b)];
  if (!h) return;
  by_hash_.erase(*h);
  h.reset();
}

void BlockAllocator::clear_cache() {
  for (BlockId b : evictable_) {
    unpublish(b);
    free_.push_back(b);
  }
  evictable_.clear();
  for (BlockId b = 0; b < num_blocks(); ++b) unpublish(b);
}

}  // namespace rlx
