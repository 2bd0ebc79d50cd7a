#include "rlx/rollout/block_allocator.hpp"

#include <set>

#include "../helpers.hpp"

using rlx::BlockAllocator;
using rlx::BlockId;

TEST_CASE("block allocator: allocate until empty, release makes blocks reusable", "[rollout]") {
  BlockAllocator a(4, 16);
  std::set<BlockId> got;
  for (int i = 0; i < 4; ++i) {
    auto b = a.allocate();
    REQUIRE(b);
    CHECK(a.ref_count(*b) == 1);
    got.insert(*b);
  }
  CHECK(got.size() == 4);
  CHECK(a.num_free() == 0);
  CHECK_FALSE(a.allocate());
  a.release(*got.begin());
  CHECK(a.num_free() == 1);
  CHECK(a.allocate() == *got.begin());
}

TEST_CASE("block allocator: reference counts keep shared blocks alive", "[rollout]") {
  BlockAllocator a(2, 4);
  auto b = *a.allocate();
  a.retain(b);
  a.retain(b);
  CHECK(a.ref_count(b) == 3);
  a.release(b);
  a.release(b);
  CHECK(a.num_free() == 1);
  a.release(b);
  CHECK(a.num_free() == 2);
  CHECK_THROWS_AS(a.release(b), rlx::InternalError);
}

TEST_CASE("block allocator: published blocks are found by hash until evicted, least recently released first", "[rollout]") {
  BlockAllocator a(3, 2);
  const std::vector<int32_t> t1 = {1, 2}, t2 = {3, 4};
  const uint64_t h1 = BlockAllocator::chain_hash(0, t1), h2 = BlockAllocator::chain_hash(h1, t2);
  CHECK(h1 != h2);
  CHECK(BlockAllocator::chain_hash(0, t2) != h2);  // the chain matters, not only the block's tokens
  auto b1 = *a.allocate(), b2 = *a.allocate();
  a.publish(b1, h1);
  a.publish(b2, h2);
  CHECK(a.num_cached() == 2);
  // In use: lookup shares it.
  auto hit = a.lookup(h1);
  REQUIRE(hit);
  CHECK(*hit == b1);
  CHECK(a.ref_count(b1) == 2);
  a.release(b1);
  a.release(b1);
  a.release(b2);
  // Released but cached: free for allocation, and still findable.
  CHECK(a.num_free() == 3);
  hit = a.lookup(h2);
  REQUIRE(hit);
  CHECK(*hit == b2);
  a.release(b2);  // now b1 was released before b2
  auto fresh = *a.allocate();  // the never-cached block first
  CHECK(fresh != b1);
  CHECK(fresh != b2);
  auto evicted = *a.allocate();
  CHECK(evicted == b1);
  CHECK_FALSE(a.lookup(h1));
  CHECK(a.stats().evictions == 1);
  CHECK(a.lookup(h2) == b2);
}

TEST_CASE("block allocator: clear_cache forgets every hash", "[rollout]") {
  BlockAllocator a(2, 2);
  auto b = *a.allocate();
  a.publish(b, 42);
  a.release(b);
  a.clear_cache();
  CHECK(a.num_cached() == 0);
  CHECK(a.num_free() == 2);
  CHECK_FALSE(a.lookup(42));
}
