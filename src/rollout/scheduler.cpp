#include "rlx/rollout/scheduler.hpp"

#include <algorithm>
#include <span>

#include "rlx/core/error.hpp"
#include "rlx/core/rng.hpp"

namespace rlx {

namespace {
uint64_t prefix_root(int64_t version) { return hash_name("rlx.prefix", static_cast<uint64_t>(version)); }
}  // namespace

bool StepPlan::decode_only() const {
  if (chunks.empty()) return false;
  for (const auto& [s, n] : chunks)
    if (n != 1 || !s->followers.empty() || s->computed + 1 != static_cast<int64_t>(s->tokens.size())) return false;
  return true;
}

Scheduler::Scheduler(SchedulerConfig cfg, int32_t num_blocks, int64_t weight_version)
    : cfg_(cfg), blocks_(num_blocks, cfg.block_size), prefix_root_(prefix_root(weight_version)) {}

void Scheduler::add(Sequence& leader) { waiting_.push_back(&leader); }

void Scheduler::set_weight_version(int64_t version) {
  blocks_.clear_cache();  // cached prefixes hold the old weights' keys and values
  prefix_root_ = prefix_root(version);
}

void Scheduler::release_blocks(Sequence& s) {
  for (BlockId b : s.blocks) blocks_.release(b);
  s.blocks.clear();
  s.hashes.clear();
  s.computed = 0;
}

void Scheduler::preempt(Sequence& s) {
  release_blocks(s);
  s.running = false;
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  waiting_.push_front(&s);
  preempted_.push_back(&s);
  ++stats_.preemptions;
}

void Scheduler::preempt_all() {
  while (!running_.empty()) preempt(*running_.back());
  preempted_.clear();
}

void Scheduler::finish(Sequence& s) {
  RLX_ASSERT(!s.done, "sequence finished twice");
  s.done = true;
  s.running = false;
  release_blocks(s);
}

void Scheduler::drop_finished() {
  std::erase_if(running_, [](const Sequence* s) { return s->done; });
  std::erase_if(waiting_, [](const Sequence* s) { return s->done; });
}

void Scheduler::match_prefix(Sequence& s) {
  const int64_t bs = cfg_.block_size;
  // At least the last token is computed: its logits sample the next token.
  const int64_t usable = (static_cast<int64_t>(s.tokens.size()) - 1) / bs;
  uint64_t h = prefix_root_;
  for (int64_t j = 0; j < usable; ++j) {
    h = BlockAllocator::chain_hash(h, std::span<const int32_t>(s.tokens.data() + j * bs, static_cast<size_t>(bs)));
    auto b = blocks_.lookup(h);
    if (!b) break;
    s.blocks.push_back(*b);
    s.hashes.push_back(h);
    s.computed += bs;
  }
  stats_.prefix_hit_tokens += s.computed;
}

void Scheduler::publish_full_blocks(Sequence& s, int64_t upto) {
  if (!cfg_.prefix_caching) return;
  const int64_t bs = cfg_.block_size, full = upto / bs;
  uint64_t h = s.hashes.empty() ? prefix_root_ : s.hashes.back();
  for (auto j = static_cast<int64_t>(s.hashes.size()); j < full; ++j) {
    h = BlockAllocator::chain_hash(h, std::span<const int32_t>(s.tokens.data() + j * bs, static_cast<size_t>(bs)));
    blocks_.publish(s.blocks[static_cast<size_t>(j)], h);
    s.hashes.push_back(h);
  }
}

Scheduler::Reservation Scheduler::reservation(const Sequence& s, int64_t n) const {
  const int64_t bs = cfg_.block_size;
  const auto need = static_cast<size_t>((s.computed + n + bs - 1) / bs);
  Reservation r;
  r.add = std::max<int64_t>(0, static_cast<int64_t>(need) - static_cast<int64_t>(s.blocks.size()));
  r.first = static_cast<size_t>(s.computed / bs);  // the block the first write goes to
  r.cow = r.first < s.blocks.size() && blocks_.ref_count(s.blocks[r.first]) > 1;
  return r;
}

bool Scheduler::reserve(Sequence& s, int64_t n, std::vector<std::pair<BlockId, BlockId>>& copies) {
  const auto r = reservation(s, n);
  if (blocks_.num_free() < r.blocks()) return false;
  if (r.cow) {
    const BlockId copy = *blocks_.allocate();
    copies.emplace_back(s.blocks[r.first], copy);
    blocks_.release(s.blocks[r.first]);
    s.blocks[r.first] = copy;
    ++stats_.cow_copies;
  }
  for (int64_t i = 0; i < r.add; ++i) s.blocks.push_back(*blocks_.allocate());
  return true;
}

StepPlan Scheduler::schedule(bool draining) {
  StepPlan plan;
  preempted_.clear();
  int64_t budget = cfg_.max_batch_tokens;
  plan_running(plan, budget);
  admit_waiting(plan, budget, draining);
  plan.preempted = std::move(preempted_);
  preempted_.clear();
  return plan;
}

void Scheduler::plan_running(StepPlan& plan, int64_t& budget) {
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    const int64_t n = std::min(static_cast<int64_t>(s->tokens.size()) - s->computed, budget);
    RLX_ASSERT(n > 0, "running sequence with nothing to compute");
    while (!reserve(*s, n, plan.copies)) {
      // Out of blocks: the most recently admitted sequence gives its blocks back.
      Sequence* victim = running_.back();
      preempt(*victim);
      if (victim == s) return;
    }
    plan.chunks.push_back({s, n});
    publish_full_blocks(*s, s->computed + n);
    budget -= n;
  }
}

void Scheduler::admit_waiting(StepPlan& plan, int64_t& budget, bool draining) {
  // New work only when the running batch has room. While old weights drain, only
  // sequences already in flight (preempted ones) start.
  while (budget > 0 && !waiting_.empty()) {
    Sequence* s = waiting_.front();
    if (draining && !s->in_flight()) break;
    const auto group = static_cast<int64_t>(1 + s->followers.size());
    if (!running_.empty() && static_cast<int64_t>(running_.size()) + group > cfg_.max_running) break;
    // A sequence that computes its prompt whole (prompt log-probs) matches no prefix.
    if (cfg_.prefix_caching && s->computed == 0 && !s->whole_prompt) match_prefix(*s);
    const int64_t n = std::min(static_cast<int64_t>(s->tokens.size()) - s->computed, budget);
    if (!reserve(*s, n, plan.copies)) {
      release_blocks(*s);
      break;
    }
    waiting_.pop_front();
    s->running = true;
    running_.push_back(s);
    plan.chunks.push_back({s, n});
    publish_full_blocks(*s, s->computed + n);
    budget -= n;
  }
}

bool Scheduler::room_for_waiting() const {
  if (waiting_.empty()) return false;
  const auto group = static_cast<int64_t>(1 + waiting_.front()->followers.size());
  return static_cast<int64_t>(running_.size()) + group <= cfg_.max_running;
}

std::optional<StepPlan> Scheduler::chain(const std::vector<Sequence*>& rows) {
  int64_t blocks = 0;
  for (const Sequence* s : rows) blocks += reservation(*s, 1).blocks();
  if (blocks > blocks_.num_free()) return std::nullopt;
  StepPlan plan;
  for (Sequence* s : rows) {
    RLX_ASSERT(reserve(*s, 1, plan.copies), "chain: a reservation counted as free failed");
    plan.chunks.push_back({s, 1});
  }
  return plan;
}

std::vector<Sequence*> Scheduler::fork(Sequence& leader) {
  std::vector<Sequence*> out;
  for (Sequence* f : leader.followers) {
    f->blocks = leader.blocks;
    for (BlockId b : f->blocks) blocks_.retain(b);
    f->hashes = leader.hashes;
    f->computed = leader.computed;
    f->running = true;
    running_.push_back(f);
    out.push_back(f);
    stats_.shared_prefill_tokens += leader.computed;
  }
  leader.followers.clear();
  return out;
}

}  // namespace rlx
