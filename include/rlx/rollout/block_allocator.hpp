// Fixed-size KV-cache blocks: a free list, reference counts, and a prefix cache.
//
// A block holds the keys/values of `block_size` consecutive tokens of one or more
// sequences. Sequences that share a prefix share its blocks (reference count > 1);
// a sequence about to write into a shared block copies it first (copy-on-write,
// done by the engine). A full block whose keys/values are computed can be
// published under the hash of its token prefix; a later sequence with the same
// prefix finds it with lookup() instead of recomputing it. When its last user
// releases it, a published block stays cached (evictable, least recently released
// first) until the space is needed.
//
// Pure bookkeeping (no tensors): the KV pool itself lives in PagedKVCache.
//
//   rlx::BlockAllocator blocks(/*num_blocks=*/64, /*block_size=*/16);
//   auto b = blocks.allocate();                  // refcount 1
//   blocks.publish(*b, hash);                    // full and computed
//   blocks.release(*b);                          // refcount 0: cached, still findable
//   auto again = blocks.lookup(hash);            // same block, refcount 1
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace rlx {

using BlockId = int32_t;

class BlockAllocator {
 public:
  BlockAllocator(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return static_cast<int32_t>(refs_.size()); }
  int32_t block_size() const { return block_size_; }
  // Blocks allocate() can hand out now: never-used or released ones plus evictable cached ones.
  int32_t num_free() const { return static_cast<int32_t>(free_.size() + evictable_.size()); }
  int32_t num_cached() const { return static_cast<int32_t>(by_hash_.size()); }

  // A block with reference count 1, or nothing when every block is in use. Evicts the
  // least recently released cached block when no uncached block is free.
  std::optional<BlockId> allocate();
  void retain(BlockId b);
  // Drops one reference; at zero the block becomes free (or evictable if published).
  void release(BlockId b);
  int32_t ref_count(BlockId b) const;

  // The hash of a full block's tokens chained to its predecessor's hash.
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);
  // A published block with this hash, retained for the caller; nothing if none.
  std::optional<BlockId> lookup(uint64_t hash);
  // Makes a full, computed block findable. A hash already published keeps its first block.
  void publish(BlockId b, uint64_t hash);
  // Forgets every published hash (their contents are stale, e.g. after a weight update).
  void clear_cache();

  // Counters since construction.
  struct Stats {
    int64_t lookups = 0, hits = 0, evictions = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  void check(BlockId b) const;
  void unpublish(BlockId b);

  int32_t block_size_;
  std::vector<int32_t> refs_;
  std::vector<BlockId> free_;  // uncached, refcount 0 (LIFO)
  std::list<BlockId> evictable_;  // cached, refcount 0, least recently released first
  std::vector<std::list<BlockId>::iterator> evictable_pos_;
  std::vector<std::optional<uint64_t>> hash_of_;
  std::unordered_map<uint64_t, BlockId> by_hash_;
  Stats stats_;
};

}  // namespace rlx
