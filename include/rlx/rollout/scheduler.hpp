// The rollout engine's scheduler: which sequences run in the next forward, with how many
// tokens each, and which KV blocks they hold. Pure bookkeeping over a BlockAllocator (no
// model, no tensors), so its decisions are tested without one; the engine's model runner
// carries a StepPlan out.
//
// Admission: waiting sequences start in order (preempted ones first) while the step's token
// budget (max_batch_tokens) and the running bound (max_running, counted by group) allow;
// a prompt longer than the budget is prefilled in chunks over several steps. Reservation:
// every planned chunk holds the blocks its tokens are written to; the first write into a
// shared block copies it (copy-on-write, a StepPlan::copies entry). Preemption: when a
// running sequence needs a block and none is free, the most recently admitted one gives
// its blocks back and waits at the front, to be recomputed. Prefix match: full blocks are
// published under the hash of their token prefix (per weight version) once a step computes
// them, and a sequence starting afresh looks its prompt up block by block. A group's n
// samples prefill once: the leader computes the prompt and fork() hands its blocks to the
// followers.
//
//   rlx::Scheduler sched({.block_size = 4, .max_batch_tokens = 64}, /*num_blocks=*/32);
//   rlx::Sequence s;
//   s.tokens = prompt;
//   s.prompt_len = prompt.size();
//   sched.add(s);
//   auto plan = sched.schedule();   // plan.chunks: {&s, prompt.size()}; s.blocks reserved
//   ...                             // the forward computes them
//   s.computed += plan.chunks[0].n;
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "rlx/rollout/block_allocator.hpp"

namespace rlx {

struct SchedulerConfig {
  int32_t block_size = 16;          // tokens per KV block
  int64_t max_batch_tokens = 2048;  // tokens per forward (prefill chunks plus decode tokens)
  int64_t max_running = 256;        // sequences in the running batch
  bool prefix_caching = true;       // publish full blocks and match prompts against them
};

// One sample's tokens and its place in the KV cache, as the scheduler sees it. The engine
// derives its per-sample state from it.
struct Sequence {
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t prompt_len = 0;       // leading tokens of `tokens` that are the prompt
  int64_t computed = 0;         // leading tokens whose keys/values are in `blocks`
  std::vector<BlockId> blocks;
  std::vector<uint64_t> hashes;      // prefix hashes of the leading full blocks
  std::vector<Sequence*> followers;  // samples forked from this one once its prompt is computed
  bool whole_prompt = false;         // computes its prompt itself, never from cached prefixes
  bool running = false, done = false;
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  // Started: it runs, or it has tokens of its own (preempted; its cache is recomputed).
  bool in_flight() const { return running || generated() > 0; }
};

// One step, as the scheduler planned it.
struct StepPlan {
  struct Chunk {
    Sequence* seq;
    int64_t n;  // tokens seq->computed .. computed + n are computed this step
  };
  std::vector<Chunk> chunks;  // the running sequences in admission order, then those admitted
  // Copy-on-write: block `first`'s contents go to block `second` before the step writes.
  std::vector<std::pair<BlockId, BlockId>> copies;
  std::vector<Sequence*> preempted;  // gave their blocks back this step, in order
  bool empty() const { return chunks.empty(); }
  // Every chunk is one token that samples (a decode step: no prefill, no fork).
  bool decode_only() const;
};

class Scheduler {
 public:
  // Prefixes hash under `weight_version` (set_weight_version() changes it).
  Scheduler(SchedulerConfig cfg, int32_t num_blocks, int64_t weight_version = 0);

  const SchedulerConfig& config() const { return cfg_; }
  // Queues a group's leader (its followers run once it has computed its prompt).
  void add(Sequence& leader);
  // Plans the next step: the running sequences' next chunks (preempting from the back when
  // blocks run out), then waiting ones while budget and room remain. `draining`: only
  // sequences in flight start (old weights drain before an update).
  StepPlan schedule(bool draining = false);
  // A decode step of `rows` again (the running batch, one token each, planned before their
  // last step's tokens are known): reserves their next token's blocks if all fit without
  // preemption; nothing (and nothing reserved) otherwise.
  std::optional<StepPlan> chain(const std::vector<Sequence*>& rows);
  // Whether the first waiting group would fit beside the running batch (max_running).
  bool room_for_waiting() const;
  // The leader's prompt is computed: its followers share every block and start running.
  // Returns them, in order.
  std::vector<Sequence*> fork(Sequence& leader);
  // Makes s's full blocks up to token `upto` findable by prefix. Done when a step is
  // planned: every write of a forward lands before any attention read in the same layer,
  // so a sequence admitted later in the same step can already share them.
  void publish_full_blocks(Sequence& s, int64_t upto);
  // Gives s's blocks back and queues it at the front (recomputed later).
  void preempt(Sequence& s);
  void preempt_all();
  // s is done: its blocks go back (it leaves the running set at drop_finished()).
  void finish(Sequence& s);
  void drop_finished();
  // New weights: cached prefixes are stale; prefixes hash under the new version from now.
  void set_weight_version(int64_t version);
  // Forgets every published prefix (a step that published them failed).
  void forget_prefixes() { blocks_.clear_cache(); }

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  BlockAllocator& blocks() { return blocks_; }
  const BlockAllocator& blocks() const { return blocks_; }

  struct Stats {
    int64_t preemptions = 0, prefix_hit_tokens = 0, shared_prefill_tokens = 0, cow_copies = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  // What reserve(s, n) takes: `add` new blocks, and one more if the first block written is
  // shared (copy-on-write).
  struct Reservation {
    int64_t add = 0;
    bool cow = false;
    size_t first = 0;  // index of the block the first write goes to
    int64_t blocks() const { return add + (cow ? 1 : 0); }
  };
  Reservation reservation(const Sequence& s, int64_t n) const;
  // schedule()'s two halves: the running sequences' next chunks (preempting from the back
  // when blocks run out; a sequence that preempts itself ends the pass), then admission.
  void plan_running(StepPlan& plan, int64_t& budget);
  void admit_waiting(StepPlan& plan, int64_t& budget, bool draining);
  bool reserve(Sequence& s, int64_t n, std::vector<std::pair<BlockId, BlockId>>& copies);
  void match_prefix(Sequence& s);
  void release_blocks(Sequence& s);

  SchedulerConfig cfg_;
  BlockAllocator blocks_;
  uint64_t prefix_root_;
  std::deque<Sequence*> waiting_;     // leaders; preempted sequences go to the front
  std::vector<Sequence*> running_;    // in admission order
  std::vector<Sequence*> preempted_;  // by the step being planned
  Stats stats_;
};

}  // namespace rlx
