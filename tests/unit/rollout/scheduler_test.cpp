#include "rlx/rollout/scheduler.hpp"

#include <initializer_list>
#include <memory>
#include <numeric>

#include "../helpers.hpp"

using rlx::BlockId;
using rlx::Scheduler;
using rlx::Sequence;
using rlx::StepPlan;

namespace {

// Sequences with distinct tokens (or the given ones), owned by the test.
struct Seqs {
  std::vector<std::unique_ptr<Sequence>> all;
  Sequence& make(int64_t prompt_len, int32_t first_token = -1) {
    auto s = std::make_unique<Sequence>();
    const auto base = first_token >= 0 ? first_token : static_cast<int32_t>(1000 * (all.size() + 1));
    s->tokens.resize(static_cast<size_t>(prompt_len));
    std::iota(s->tokens.begin(), s->tokens.end(), base);
    s->prompt_len = prompt_len;
    all.push_back(std::move(s));
    return *all.back();
  }
  // A group: a leader and n - 1 followers with the same prompt.
  Sequence& group(int64_t prompt_len, int n) {
    Sequence& leader = make(prompt_len);
    for (int i = 1; i < n; ++i) {
      Sequence& f = make(prompt_len);
      f.tokens = leader.tokens;
      leader.followers.push_back(&f);
    }
    return leader;
  }
};

// Carries a plan out as the engine does, without a model: the chunks are computed; a leader
// whose prompt is complete forks; every sequence whose known tokens are all computed
// appends one token (its id: 7).
void run(Scheduler& sched, const StepPlan& plan) {
  std::vector<Sequence*> samplers;
  for (const auto& [s, n] : plan.chunks) {
    s->computed += n;
    if (s->computed != static_cast<int64_t>(s->tokens.size())) continue;
    samplers.push_back(s);
    for (Sequence* f : sched.fork(*s)) samplers.push_back(f);
  }
  for (Sequence* s : samplers) s->tokens.push_back(7);
}

void add(Scheduler& sched, std::initializer_list<Sequence*> seqs) {
  for (Sequence* s : seqs) sched.add(*s);
}

std::vector<Sequence*> planned(const StepPlan& plan) {
  std::vector<Sequence*> out;
  for (const auto& c : plan.chunks) out.push_back(c.seq);
  return out;
}

int64_t held(const Scheduler& sched) { return sched.blocks().num_blocks() - sched.blocks().num_free(); }

}  // namespace

TEST_CASE("scheduler: admission stops at the block budget, in arrival order", "[rollout][scheduler]") {
  Scheduler sched({.block_size = 4, .max_batch_tokens = 1000}, /*num_blocks=*/10);
  Seqs seqs;
  Sequence &a = seqs.make(9), &b = seqs.make(9), &c = seqs.make(9), &d = seqs.make(2);
  add(sched, {&a, &b, &c, &d});
  auto plan = sched.schedule();
  // 3 blocks each for a, b and c; d's 1 block would fit, but admission keeps arrival order.
  CHECK(planned(plan) == std::vector<Sequence*>{&a, &b, &c, &d});
  CHECK(held(sched) == 10);
  CHECK(a.blocks.size() == 3);
  CHECK(d.blocks.size() == 1);
  CHECK(sched.waiting().empty());

  Scheduler tight({.block_size = 4, .max_batch_tokens = 1000}, /*num_blocks=*/7);
  Seqs more;
  Sequence &e = more.make(9), &f = more.make(9), &g = more.make(9), &h = more.make(2);
  add(tight, {&e, &f, &g, &h});
  plan = tight.schedule();
  CHECK(planned(plan) == std::vector<Sequence*>{&e, &f});
  CHECK(g.blocks.empty());  // 3 blocks, 1 free: g waits, and h (1 block) waits behind it
  CHECK(h.blocks.empty());
  REQUIRE(tight.waiting().size() == 2);
  CHECK(tight.waiting().front() == &g);
  CHECK(tight.blocks().num_free() == 1);
  CHECK_FALSE(g.running);
  CHECK(e.running);
}

TEST_CASE("scheduler: a prompt longer than the token budget is prefilled in chunks", "[rollout][scheduler]") {
  Scheduler sched({.block_size = 4, .max_batch_tokens = 5}, /*num_blocks=*/16);
  Seqs seqs;
  Sequence &a = seqs.make(12), &b = seqs.make(3);
  add(sched, {&a, &b});
  auto plan = sched.schedule();
  REQUIRE(plan.chunks.size() == 1);  // the budget is spent on a's first chunk
  CHECK(plan.chunks[0].n == 5);
  CHECK(a.blocks.size() == 2);
  CHECK_FALSE(plan.decode_only());
  run(sched, plan);
  plan = sched.schedule();
  REQUIRE(plan.chunks.size() == 1);
  CHECK(plan.chunks[0].n == 5);
  CHECK(a.blocks.size() == 3);
  run(sched, plan);
  plan = sched.schedule();  // a's last 2 tokens, then b's prompt in what is left
  REQUIRE(plan.chunks.size() == 2);
  CHECK(plan.chunks[0].seq == &a);
  CHECK(plan.chunks[0].n == 2);
  CHECK(plan.chunks[1].seq == &b);
  CHECK(plan.chunks[1].n == 3);
  run(sched, plan);
  CHECK(a.computed == 12);
  CHECK(a.generated() == 1);
  plan = sched.schedule();  // both decode one token
  CHECK(plan.decode_only());
  CHECK(planned(plan) == std::vector<Sequence*>{&a, &b});
}

TEST_CASE("scheduler: out of blocks, the most recently admitted sequence is preempted and waits first",
          "[rollout][scheduler]") {
  Scheduler sched({.block_size = 2, .max_batch_tokens = 100}, /*num_blocks=*/6);
  Seqs seqs;
  Sequence &a = seqs.make(3), &b = seqs.make(3), &c = seqs.make(3);
  add(sched, {&a, &b, &c});
  auto plan = sched.schedule();
  CHECK(planned(plan) == std::vector<Sequence*>{&a, &b, &c});
  CHECK(sched.blocks().num_free() == 0);
  run(sched, plan);  // 4 tokens each: the 4th goes in their second block
  plan = sched.schedule();
  CHECK(plan.preempted.empty());
  run(sched, plan);  // 5 tokens each: a third block each, none free
  plan = sched.schedule();
  CHECK(plan.preempted == std::vector<Sequence*>{&c});
  CHECK(planned(plan) == std::vector<Sequence*>{&a, &b});
  CHECK(sched.waiting().front() == &c);
  CHECK_FALSE(c.running);
  CHECK(c.blocks.empty());
  CHECK(c.computed == 0);  // recomputed from its first token, generated ones included
  CHECK(c.generated() == 2);
  CHECK(sched.stats().preemptions == 1);
  CHECK(a.blocks.size() == 3);
  CHECK(b.blocks.size() == 3);
  CHECK(sched.blocks().num_free() == 0);
  run(sched, plan);
  // c waits until blocks come back; then it is admitted before anything newer.
  Sequence& d = seqs.make(1);
  sched.add(d);
  sched.finish(a);
  sched.drop_finished();
  plan = sched.schedule();
  CHECK(planned(plan) == std::vector<Sequence*>{&b, &c});
  CHECK(plan.chunks[1].n == 5);  // its prompt and the tokens it had generated
  CHECK(sched.waiting().front() == &d);
}

TEST_CASE("scheduler: a sequence that cannot get a block preempts itself when it is the newest",
          "[rollout][scheduler]") {
  Scheduler sched({.block_size = 2, .max_batch_tokens = 100, .prefix_caching = false}, /*num_blocks=*/3);
  Seqs seqs;
  Sequence &a = seqs.make(2), &b = seqs.make(3);
  add(sched, {&a, &b});
  auto plan = sched.schedule();
  CHECK(planned(plan) == std::vector<Sequence*>{&a, &b});
  run(sched, plan);  // a: 3 tokens (2 blocks needed, 1 held); b: 4 tokens (2 held)
  plan = sched.schedule();
  // a needs a block: b, the newest, gives back its two; a takes one, b's 4 tokens need 2.
  CHECK(plan.preempted == std::vector<Sequence*>{&b});
  CHECK(planned(plan) == std::vector<Sequence*>{&a});
  CHECK(sched.waiting().front() == &b);
  while (a.tokens.size() < 7) run(sched, sched.schedule());
  CHECK(a.blocks.size() == 3);
  CHECK(sched.stats().preemptions == 1);
  plan = sched.schedule();  // a needs a 4th block: the newest running, it preempts itself
  CHECK(plan.empty());
  CHECK(plan.preempted == std::vector<Sequence*>{&a});
  CHECK(sched.running().empty());
  CHECK(std::vector<Sequence*>(sched.waiting().begin(), sched.waiting().end()) == std::vector<Sequence*>{&a, &b});
  CHECK(sched.blocks().num_free() == 3);
}

TEST_CASE("scheduler: a group prefills once, shares its prompt's blocks, and copies the shared block it writes",
          "[rollout][scheduler]") {
  Scheduler sched({.block_size = 4, .max_batch_tokens = 100}, /*num_blocks=*/16);
  Seqs seqs;
  Sequence& leader = seqs.group(10, 3);
  const auto followers = leader.followers;
  sched.add(leader);
  auto plan = sched.schedule();
  CHECK(planned(plan) == std::vector<Sequence*>{&leader});  // the followers wait for the leader's prompt
  CHECK(held(sched) == 3);
  run(sched, plan);  // the leader forks: three samples on the same three blocks
  REQUIRE(sched.running().size() == 3);
  for (Sequence* f : followers) {
    CHECK(f->blocks == leader.blocks);
    CHECK(f->computed == 10);
    CHECK(f->running);
  }
  for (BlockId b : leader.blocks) CHECK(sched.blocks().ref_count(b) == 3);
  CHECK(held(sched) == 3);
  CHECK(sched.stats().shared_prefill_tokens == 20);
  // Each writes token 10 into block 2, shared by three: the first two copy it, the last
  // one holds it alone by then and writes in place.
  const BlockId shared = leader.blocks[2];
  plan = sched.schedule();
  CHECK(plan.decode_only());
  REQUIRE(plan.copies.size() == 2);
  CHECK(plan.copies[0].first == shared);
  CHECK(plan.copies[1].first == shared);
  CHECK(plan.copies[0].second == leader.blocks[2]);
  CHECK(plan.copies[1].second == followers[0]->blocks[2]);
  CHECK(followers[1]->blocks[2] == shared);
  CHECK(sched.stats().cow_copies == 2);
  for (int j = 0; j < 2; ++j) CHECK(sched.blocks().ref_count(leader.blocks[static_cast<size_t>(j)]) == 3);
  CHECK(held(sched) == 5);
}

TEST_CASE("scheduler: full blocks are matched by prefix across requests, per weight version", "[rollout][scheduler]") {
  Scheduler sched({.block_size = 4, .max_batch_tokens = 100}, /*num_blocks=*/16);
  Seqs seqs;
  Sequence& a = seqs.make(10, 0);
  sched.add(a);
  run(sched, sched.schedule());    // publishes a's two full blocks
  Sequence& b = seqs.make(11, 0);  // the same first 10 tokens, one more
  sched.add(b);
  auto plan = sched.schedule();
  REQUIRE(plan.chunks.size() == 2);
  CHECK(plan.chunks[1].seq == &b);
  CHECK(plan.chunks[1].n == 3);  // tokens 8..10: blocks 0 and 1 came from a
  CHECK(b.blocks[0] == a.blocks[0]);
  CHECK(b.blocks[1] == a.blocks[1]);
  CHECK(b.blocks[2] != a.blocks[2]);
  CHECK(sched.stats().prefix_hit_tokens == 8);
  run(sched, plan);
  // Finished, the blocks stay findable; new weights forget them.
  sched.finish(a);
  sched.finish(b);
  sched.drop_finished();
  CHECK(sched.blocks().num_free() == 16);
  Sequence& c = seqs.make(9, 0);
  sched.add(c);
  plan = sched.schedule();
  CHECK(plan.chunks[0].n == 1);  // only its last token: the first 8 are cached
  sched.finish(c);
  sched.drop_finished();
  sched.set_weight_version(1);
  Sequence& d = seqs.make(9, 0);
  sched.add(d);
  plan = sched.schedule();
  CHECK(plan.chunks[0].n == 9);
  // A sequence that computes its prompt whole matches nothing; one behind it does.
  sched.finish(d);
  sched.drop_finished();
  Sequence& e = seqs.make(9, 0);
  Sequence& f = seqs.make(9, 0);
  e.whole_prompt = true;
  add(sched, {&e, &f});
  plan = sched.schedule();
  REQUIRE(plan.chunks.size() == 2);
  CHECK(plan.chunks[0].n == 9);
  CHECK(plan.chunks[1].n == 1);
}

TEST_CASE("scheduler: finishing gives every block back; aborted waiting sequences leave the queue",
          "[rollout][scheduler]") {
  Scheduler sched({.block_size = 4, .max_batch_tokens = 100, .prefix_caching = false}, /*num_blocks=*/12);
  Seqs seqs;
  Sequence& g = seqs.group(6, 2);
  Sequence& solo = seqs.make(5);
  Sequence& late = seqs.make(33);  // 9 blocks: waits
  add(sched, {&g, &solo, &late});
  auto plan = sched.schedule();
  CHECK(planned(plan) == std::vector<Sequence*>{&g, &solo});
  run(sched, plan);
  run(sched, sched.schedule());
  CHECK(sched.running().size() == 3);
  CHECK(sched.waiting().size() == 1);
  for (Sequence* s : std::vector<Sequence*>(sched.running())) sched.finish(*s);
  sched.finish(late);
  sched.drop_finished();
  CHECK(sched.running().empty());
  CHECK(sched.waiting().empty());
  CHECK(sched.blocks().num_free() == 12);
  for (BlockId b = 0; b < 12; ++b) CHECK(sched.blocks().ref_count(b) == 0);
  CHECK(sched.blocks().num_cached() == 0);  // prefix caching off: nothing published
  for (const auto& s : seqs.all) {
    CHECK(s->done);
    CHECK(s->blocks.empty());
  }
}

TEST_CASE("scheduler: max_running counts whole groups; draining admits only sequences in flight",
          "[rollout][scheduler]") {
  Scheduler sched({.block_size = 4, .max_batch_tokens = 100, .max_running = 4}, /*num_blocks=*/32);
  Seqs seqs;
  Sequence& g1 = seqs.group(3, 3);
  Sequence& g2 = seqs.group(3, 2);
  sched.add(g1);
  run(sched, sched.schedule());
  CHECK(sched.running().size() == 3);
  sched.add(g2);
  CHECK_FALSE(sched.room_for_waiting());  // 3 running + a group of 2 exceed 4
  auto plan = sched.schedule();
  CHECK(plan.chunks.size() == 3);
  CHECK(plan.decode_only());
  CHECK(sched.waiting().front() == &g2);
  for (Sequence* s : std::vector<Sequence*>(sched.running())) sched.finish(*s);
  sched.drop_finished();
  CHECK(sched.room_for_waiting());
  CHECK(planned(sched.schedule()) == std::vector<Sequence*>{&g2});

  Seqs more;
  Sequence& fresh = more.make(3);
  Sequence& preempted = more.make(3);
  preempted.tokens.push_back(7);  // generated a token before it was preempted
  Scheduler drain({.block_size = 4}, 8);
  add(drain, {&fresh, &preempted});
  CHECK(drain.schedule(/*draining=*/true).empty());  // fresh heads the queue and may not start
  Scheduler drain2({.block_size = 4}, 8);
  add(drain2, {&preempted, &fresh});
  CHECK(planned(drain2.schedule(/*draining=*/true)) == std::vector<Sequence*>{&preempted});
  CHECK(drain2.waiting().front() == &fresh);
}

TEST_CASE("scheduler: a chained decode step reserves all its rows' blocks or none", "[rollout][scheduler]") {
  Scheduler sched({.block_size = 2, .max_batch_tokens = 100}, /*num_blocks=*/5);
  Seqs seqs;
  Sequence &a = seqs.make(3), &b = seqs.make(3);
  add(sched, {&a, &b});
  run(sched, sched.schedule());
  run(sched, sched.schedule());  // 5 tokens each, 4 computed in 2 blocks; one block free
  auto rows = sched.running();
  auto plan = sched.chain(rows);  // the 5th tokens need a block each: 2 > 1 free
  CHECK_FALSE(plan.has_value());
  CHECK(a.blocks.size() == 2);
  CHECK(b.blocks.size() == 2);
  CHECK(sched.blocks().num_free() == 1);
  sched.finish(b);
  sched.drop_finished();
  rows = sched.running();
  plan = sched.chain(rows);
  REQUIRE(plan.has_value());
  CHECK(plan->decode_only());
  CHECK(planned(*plan) == std::vector<Sequence*>{&a});
  CHECK(a.blocks.size() == 3);
}
