#include "rlx/bus/hub_state.hpp"

#include <nlohmann/json.hpp>

#include <limits>
#include <set>

#include "../helpers.hpp"

using Catch::Matchers::Contains;
using namespace rlx::bus;
using rlx::test::error_of;

namespace {
std::vector<std::string> records(int n) {
  std::vector<std::string> r;
  for (int i = 0; i < n; ++i) r.push_back(R"({"prompt":")" + std::to_string(i) + R"("})");
  return r;
}
TrajectoryGroup group(uint64_t lease, std::vector<float> rewards, int64_t version, int tokens = 4) {
  TrajectoryGroup g{.lease_id = lease};
  for (float r : rewards) {
    Trajectory t{.reward = r};
    t.tokens.assign(static_cast<size_t>(tokens), 1);
    t.versions = TokenVersions(static_cast<size_t>(tokens), version);
    g.samples.push_back(t);
  }
  return g;
}
}  // namespace

TEST_CASE("hub: JSONL datasets are validated with file and line", "[bus]") {
  rlx::test::TempDir dir;
  rlx::test::write_file(dir / "ok.jsonl", "{\"prompt\": \"1+1\", \"answer\": 2}\n\n{\"prompt\": \"2+2\"}\n");
  CHECK(load_jsonl(dir / "ok.jsonl").size() == 2);
  rlx::test::write_file(dir / "bad.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \n");
  CHECK_THAT(error_of([&] { load_jsonl(dir / "bad.jsonl"); }), Contains("bad.jsonl:2: not valid JSON"));
  // Any JSON object is a task: which fields it needs is the environment's to check (GSM8K's
  // question/answer, MATH's problem/solution for the math environment).
  rlx::test::write_file(dir / "gsm8k.jsonl", "{\"question\": \"a\", \"answer\": \"#### 3\"}\n{\"problem\": \"b\"}\n");
  const auto tasks = load_jsonl(dir / "gsm8k.jsonl");
  REQUIRE(tasks.size() == 2);
  CHECK(nlohmann::json::parse(tasks[0]).at("question") == "a");
  rlx::test::write_file(dir / "array.jsonl", "{\"prompt\": \"a\"}\n[1, 2]\n");
  CHECK_THAT(error_of([&] { load_jsonl(dir / "array.jsonl"); }), Contains("array.jsonl:2") && Contains("JSON object"));
  rlx::test::write_file(dir / "empty.jsonl", "\n");
  CHECK_THAT(error_of([&] { load_jsonl(dir / "empty.jsonl"); }), Contains("no records"));
  // Issue 50, item 11: a record over the limit is refused at its line (a 1 GB line was
  // read whole); a last line without a newline still counts; a deep record is refused.
  std::string big = "{\"prompt\": \"" + std::string(200, 'x') + "\"}";
  rlx::test::write_file(dir / "big.jsonl", "{\"prompt\": \"a\"}\n" + big + "\n");
  CHECK_THAT(error_of([&] { load_jsonl(dir / "big.jsonl", 10, 100); }),
             Contains("big.jsonl:2: a record longer than 100 bytes"));
  CHECK(load_jsonl(dir / "big.jsonl", 10, big.size()).size() == 2);
  rlx::test::write_file(dir / "tail.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}");
  CHECK(load_jsonl(dir / "tail.jsonl").size() == 2);
  rlx::test::write_file(dir / "deep.jsonl", "{\"prompt\": \"a\", \"x\": " + std::string(5000, '[') + std::string(5000, ']') + "}\n");
  CHECK_THAT(error_of([&] { load_jsonl(dir / "deep.jsonl"); }), Contains("deep.jsonl:1: nested deeper than"));
}

TEST_CASE("hub: the prompt source is a seeded permutation per epoch, restorable from its cursor", "[bus]") {
  PromptSource a(records(10), {.seed = 4, .epochs = 2}), b(records(10), {.seed = 4, .epochs = 2});
  std::vector<uint64_t> seen;
  while (auto item = a.next()) {
    CHECK(item->index == b.next()->index);
    seen.push_back(item->index);
  }
  CHECK(a.exhausted());
  REQUIRE(seen.size() == 20);
  for (int e = 0; e < 2; ++e) {
    std::set<uint64_t> epoch(seen.begin() + e * 10, seen.begin() + (e + 1) * 10);
    CHECK(epoch.size() == 10);  // every record once per epoch
  }
  CHECK(std::vector<uint64_t>(seen.begin(), seen.begin() + 10) != std::vector<uint64_t>(seen.begin() + 10, seen.end()));
  PromptSource c(records(10), {.seed = 4, .epochs = 2});
  c.restore({.epoch = 1, .position = 3});
  CHECK(c.next()->index == seen[13]);
}

TEST_CASE("hub: every lease ends exactly once across lost workers, timeouts and late duplicates", "[bus]") {
  PromptSource src(records(30), {.seed = 1, .epochs = 1});
  LeaseTable table(src, {.group_size = 4, .timeout_s = 10, .max_attempts = 5});
  std::multiset<uint64_t> completed_prompts;
  std::map<uint64_t, uint64_t> prompt_of;
  double now = 0;
  int round = 0;
  std::vector<Lease> held_by_dead;
  while (!table.done()) {
    ++round;
    now += 1;
    // Three workers take a lease each; w2 goes silent every third round, w1 dies on round 5.
    for (const std::string w : {"w0", "w1", "w2"}) {
      auto lease = table.issue(w, now, 0);
      if (!lease) continue;
      prompt_of[lease->lease_id] = lease->prompt_index;
      if (w == "w1" && round == 5) {
        held_by_dead.push_back(*lease);
        continue;
      }
      if (w == "w2" && round % 3 == 0) continue;  // never answers: times out
      if (table.complete(lease->lease_id)) completed_prompts.insert(lease->prompt_index);
    }
    if (round == 5) table.worker_lost("w1");
    table.expire(now);
    REQUIRE(round < 1000);
  }
  // The dead worker's results arrive late: dropped.
  for (const auto& l : held_by_dead) CHECK_FALSE(table.complete(l.lease_id));
  CHECK(table.errors().empty());
  CHECK(completed_prompts.size() == 30);
  CHECK(std::set<uint64_t>(completed_prompts.begin(), completed_prompts.end()).size() == 30);  // no duplicate, no hole
  CHECK(table.completed() == 30);
}

TEST_CASE("hub: infra failures are retried up to max_attempts, data failures end at once", "[bus]") {
  PromptSource src(records(2), {.epochs = 1});
  LeaseTable table(src, {.max_attempts = 2});
  auto a = *table.issue("w", 0, 0);
  CHECK_FALSE(table.fail(a.lease_id, "infra", "sandbox crashed"));
  auto again = *table.issue("w", 0, 0);
  CHECK(again.lease_id == a.lease_id);
  CHECK(again.attempt == 1);
  auto rec = table.fail(a.lease_id, "infra", "sandbox crashed");
  REQUIRE(rec);
  CHECK_THAT(rec->reason, Contains("after 2 attempts"));
  auto b = *table.issue("w", 0, 0);
  auto data = table.fail(b.lease_id, "data", "task has no answer");
  REQUIRE(data);
  CHECK(data->kind == "data");
  CHECK(table.done());
  CHECK(table.errors().size() == 2);
  CHECK_FALSE(table.complete(b.lease_id));
  CHECK_THAT(error_of([&] { table.fail(1, "other", "x"); }), Contains("infra, data or filtered"));
}

TEST_CASE("hub: a lease whose finished group found no room is held, not re-issued, however long the wait", "[bus]") {
  PromptSource src(records(3), {.epochs = 1});
  LeaseTable table(src, {.timeout_s = 10, .max_attempts = 2});
  const auto a = *table.issue("w0", 0, 0);
  // The hub answered "full" at 8 and at 16: each time the lease's time starts again.
  CHECK(table.hold(a.lease_id, "w0", 8));
  CHECK(table.expire(15).empty());
  CHECK(table.hold(a.lease_id, "w0", 16));
  CHECK(table.expire(25).empty());
  CHECK(table.pending_reissue() == 0);
  // Timed out meanwhile (waiting to be re-issued), then its worker came back with the group:
  // the lease is that worker's again, another worker gets the next prompt, not this one.
  table.expire(26);
  CHECK(table.pending_reissue() == 1);
  CHECK(table.hold(a.lease_id, "w0", 27));
  CHECK(table.pending_reissue() == 0);
  const auto b = *table.issue("w1", 27, 0);
  CHECK(b.lease_id != a.lease_id);
  CHECK(table.complete(a.lease_id));
  CHECK_FALSE(table.hold(a.lease_id, "w0", 28));  // ended: nothing to hold
  CHECK(table.errors().empty());
}

TEST_CASE("hub: the replay buffer bounds staleness and size, filters, and batches by groups or tokens", "[bus]") {
  ReplayBuffer buf({.capacity_groups = 3, .max_staleness = 1, .drop_uniform_rewards = true});
  CHECK(buf.push(StoredGroup::of(group(1, {0, 1}, 5)), 6) == ReplayBuffer::Verdict::accepted);
  CHECK(buf.push(StoredGroup::of(group(2, {0, 1}, 4)), 6) == ReplayBuffer::Verdict::stale);
  CHECK(buf.push(StoredGroup::of(group(3, {1, 1}, 6)), 6) == ReplayBuffer::Verdict::filtered);
  CHECK(buf.push(StoredGroup::of(group(4, {0, 1}, 6, 10)), 6) == ReplayBuffer::Verdict::accepted);
  CHECK(buf.push(StoredGroup::of(group(5, {0, 1}, 6)), 6) == ReplayBuffer::Verdict::accepted);
  CHECK(buf.push(StoredGroup::of(group(6, {0, 1}, 6)), 6) == ReplayBuffer::Verdict::full);
  CHECK(buf.counts().stale == 1);
  CHECK(buf.counts().filtered == 1);
  // Version 7 makes group 1 (version 5) too stale.
  CHECK(buf.evict_stale(7) == 1);
  CHECK(buf.size() == 2);
  // Token budget: group 4 has 20 tokens, group 5 has 8; a 25-token batch takes group 4 only.
  auto batch = buf.pop(0, 25);
  REQUIRE(batch.size() == 1);
  CHECK(batch[0].lease_id == 4);
  // A group larger than the budget still comes out alone.
  batch = buf.pop(0, 1);
  REQUIRE(batch.size() == 1);
  CHECK(batch[0].lease_id == 5);
  CHECK(buf.pop(4, 0).empty());
}

TEST_CASE("hub: a batch for a later version counts and takes only the groups still fresh then", "[bus]") {
  ReplayBuffer buf({.capacity_groups = 10, .max_staleness = 1});
  for (auto [lease, version] : {std::pair<uint64_t, int64_t>{1, 5}, {2, 6}, {3, 6}})
    REQUIRE(buf.push(StoredGroup::of(group(lease, {0, 1}, version)), 6) == ReplayBuffer::Verdict::accepted);
  const uint64_t t = static_cast<uint64_t>(StoredGroup::of(group(9, {0, 1}, 6)).tokens);
  CHECK(buf.has_batch(3, 0, 6));
  CHECK_FALSE(buf.has_batch(3, 0, 7));  // group 1 (version 5) is two versions behind 7
  CHECK(buf.has_batch(2, 0, 7));
  CHECK(buf.has_batch(0, 2 * t, 7));
  CHECK_FALSE(buf.has_batch(0, 2 * t + 1, 7));
  CHECK(buf.has_batch(0, 0, 7));
  CHECK_FALSE(buf.has_batch(0, 0, 8));  // nothing is fresh at 8
  const auto batch = buf.pop(3, 0, 7);
  REQUIRE(batch.size() == 2);
  CHECK(batch[0].lease_id == 2);
  CHECK(batch[1].lease_id == 3);
  CHECK(buf.size() == 1);  // group 1 stays, for evict_stale
  CHECK(buf.evict_stale(7) == 1);
}

TEST_CASE("hub: the wait between turns is bounded by coalesce_us, half a worker's credits, and the held acks", "[bus]") {
  // No pace measured yet, or coalescing off: no wait.
  CHECK(coalesce_wait_s(800e-6, 0, 32, -1) == 0);
  CHECK(coalesce_wait_s(0, 50e-6, 32, -1) == 0);
  // At most coalesce_us.
  CHECK(coalesce_wait_s(800e-6, 100e-6, 32, -1) == Approx(800e-6));
  // A group every 50 us and 4 credits: two groups' time, so the worker still has credit left.
  CHECK(coalesce_wait_s(800e-6, 50e-6, 4, -1) == Approx(100e-6));
  // One credit: the worker waits on every ack, so the hub never does.
  CHECK(coalesce_wait_s(800e-6, 50e-6, 1, -1) == 0);
  // Held acks due in 300 us: not past that; due already: no wait.
  CHECK(coalesce_wait_s(800e-6, 100e-6, 32, 300e-6) == Approx(300e-6));
  CHECK(coalesce_wait_s(800e-6, 100e-6, 32, 0) == 0);
}

TEST_CASE("hub state: a group that cannot be its lease's result is named with the reason", "[bus]") {
  const rlx::bus::Lease lease{.lease_id = 4, .prompt_index = 9, .epoch = 1, .group_size = 2};
  rlx::bus::Trajectory t{.tokens = {5, 6, 7}, .loss_mask = {0, 1, 1}, .logprobs = {0.0f, -0.5f, -1.0f},
                         .versions = {-1, 3, 3}, .prompt_len = 1, .reward = 1.0f};
  rlx::bus::TrajectoryGroup g{.lease_id = 4, .prompt_index = 9, .epoch = 1, .samples = {t, t}};
  CHECK_FALSE(rlx::bus::group_mismatch(rlx::bus::view_of(g), lease).has_value());
  auto one = g;
  one.samples.pop_back();
  CHECK_THAT(*rlx::bus::group_mismatch(rlx::bus::view_of(one), lease), Catch::Contains("1 samples"));
  auto epoch = g;
  epoch.epoch = 2;
  CHECK_THAT(*rlx::bus::group_mismatch(rlx::bus::view_of(epoch), lease), Catch::Contains("does not match"));
  auto nan = g;
  nan.samples[1].logprobs[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(*rlx::bus::group_mismatch(rlx::bus::view_of(nan), lease), Catch::Contains("sample 1 token 2"));
  auto prompt = g;
  prompt.samples[0].prompt_len = 4;
  CHECK_THAT(*rlx::bus::group_mismatch(rlx::bus::view_of(prompt), lease), Catch::Contains("prompt_len 4"));
  auto reward = g;
  reward.samples[0].reward = std::numeric_limits<float>::infinity();
  CHECK_THAT(*rlx::bus::group_mismatch(rlx::bus::view_of(reward), lease), Catch::Contains("non-finite reward"));
}

TEST_CASE("hub state: a sample's expert routing must cover its tokens with experts in range", "[bus][routing]") {
  const rlx::bus::Lease lease{.lease_id = 4, .prompt_index = 9, .epoch = 1, .group_size = 2};
  rlx::bus::Trajectory t{.tokens = {5, 6, 7}, .loss_mask = {0, 1, 1}, .logprobs = {0.0f, -0.5f, -1.0f},
                         .versions = {-1, 3, 3}, .prompt_len = 1, .reward = 1.0f};
  // 3 tokens x 2 sparse layers x top 2; the last token was never forwarded.
  t.routing = {.layers = 2, .top_k = 2, .experts = {0, 1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1}};
  rlx::bus::TrajectoryGroup g{.lease_id = 4, .prompt_index = 9, .epoch = 1, .samples = {t, t}};
  const auto why = [&](const rlx::bus::TrajectoryGroup& x) {
    auto m = rlx::bus::group_mismatch(rlx::bus::view_of(x), lease);
    return m ? *m : std::string("accepted");
  };
  CHECK(why(g) == "accepted");
  auto dense = g;
  dense.samples[1].routing = {};  // a sample without routing (every token routes itself in the learner)
  CHECK(why(dense) == "accepted");
  auto short_ = g;
  short_.samples[1].routing.experts.pop_back();
  CHECK_THAT(why(short_), Catch::Contains("sample 1: routing: 11 values, the sample's 3 tokens x 2 sparse layers x top 2 make 12"));
  auto no_dims = g;
  no_dims.samples[0].routing.layers = 0;
  CHECK_THAT(why(no_dims), Catch::Contains("sample 0: routing: 12 values for 0 sparse layers x top 2"));
  auto high = g;
  high.samples[1].routing.experts[5] = rlx::bus::kMaxExperts;
  CHECK_THAT(why(high), Catch::Contains("sample 1: routing: token 1 layer 0 names expert 4096"));
  auto low = g;
  low.samples[0].routing.experts[6] = -2;
  CHECK_THAT(why(low), Catch::Contains("sample 0: routing: token 1 layer 1 names expert -2"));
  auto other = g;
  other.samples[1].routing = {.layers = 1, .top_k = 4, .experts = t.routing.experts};
  CHECK_THAT(why(other), Catch::Contains("sample 1: routing of 1 sparse layers x top 4, sample 0's is 2 x 2"));
}
