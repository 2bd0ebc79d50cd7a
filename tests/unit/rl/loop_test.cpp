// The learner's step loop in-process: a hub on its own thread (real ZeroMQ over ipc://), a
// worker client submitting groups, the loop on one rank with a tiny model and GRPO, and
// weights published into a shared-memory segment that a subscriber reads.
#include "rlx/rl/loop.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "../helpers.hpp"
#include "../hub_thread.hpp"
#include "../test_models.hpp"
#include "rlx/bus/hub.hpp"

using rlx::test::HubThread;
using rlx::test::TempDir;
namespace bus = rlx::bus;

namespace {

// A group for `lease` as a worker would send it: prompt 2 tokens, 3 sampled, reward s % 2.
bus::TrajectoryGroup group_for(const bus::Lease& lease, int64_t vocab) {
  bus::TrajectoryGroup g{.lease_id = lease.lease_id, .prompt_index = lease.prompt_index, .epoch = lease.epoch, .worker = "w"};
  for (uint32_t s = 0; s < lease.group_size; ++s) {
    bus::Trajectory t;
    t.prompt_len = 2;
    std::vector<int64_t> versions;
    for (int i = 0; i < 5; ++i) {
      t.tokens.push_back(static_cast<int32_t>((lease.prompt_index * 7 + s * 3 + static_cast<uint64_t>(i)) % static_cast<uint64_t>(vocab)));
      t.loss_mask.push_back(i >= 2);
      t.logprobs.push_back(i >= 2 ? -1.0f : 0.0f);
      versions.push_back(i >= 2 ? lease.min_version : -1);
    }
    t.versions = bus::TokenVersions(versions);
    t.reward = static_cast<float>(s % 2);
    // Odd samples: cut by max_new_tokens, and a counter of the environment's set.
    t.finish = s % 2 ? "length" : "stop";
    t.metadata = nlohmann::json{{"env", {{"errors_unparsed", s % 2}, {"checks", 2}}}}.dump();
    g.samples.push_back(std::move(t));
  }
  return g;
}

}  // namespace

TEST_CASE("learner loop in-process: batches -> steps -> versions published, metrics per step, the hub's end",
          "[learner][loop]") {
  TempDir dir;
  const auto cfg = rlx::test::test_model({});
  std::vector<std::string> records;
  for (int i = 0; i < 6; ++i) records.push_back("{\"q\":" + std::to_string(i) + "}");
  bus::HubOptions ho;
  ho.address = "ipc://" + (dir.path / "hub.sock").string();
  ho.group_size = 2;
  ho.heartbeat_s = 0.1;
  ho.replay.max_staleness = 0;  // synchronous: step k trains samples of version k - 1
  ho.groups_per_version = 2;
  HubThread hub(ho, records);
  const bus::ClientOptions co{.address = ho.address, .heartbeat_s = 0.1, .hub_timeout_s = 5, .request_timeout_s = 20,
                              .credit_wait_s = 20};
  // A worker thread answers every lease under the version it asks for.
  std::atomic<bool> worker_done{false};
  std::thread worker([&] {
    auto o = co;
    o.who = "w";
    bus::Client w(o);
    for (;;) {
      auto grant = w.request_leases(4);
      if (grant.exhausted) break;
      for (const auto& l : grant.leases) w.submit(group_for(l, cfg.vocab_size));
      if (grant.leases.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    w.close(5);
    worker_done = true;
  });
  auto comm = rlx::dist::single_process();
  rlx::Learner learner(cfg, *comm, {.optimizer = {.lr = 1e-2}});
  rlx::algo::register_bundled_algorithms();
  auto grpo = rlx::algo::make_algorithm({.name = "grpo"});
  const auto params = learner.model().gather_parameters();
  const auto segment = "rlx-loop-test-" + std::to_string(::getpid());
  rlx::dist::ShmWeightPublisher pub({.name = segment}, rlx::dist::WeightLayout::of(params, at::kFloat));
  auto lo = co;
  lo.who = "learner", lo.role = "learner";
  bus::Client client(lo);
  std::vector<nlohmann::json> lines;
  std::vector<int64_t> checkpoints;
  int reward_calls = 0;
  std::vector<std::pair<int64_t, size_t>> batches;  // on_batch: step, groups
  rlx::rl::LearnerLoop loop({.steps = 10,
                         .groups_per_step = 2,
                         .batch_timeout_s = 30,
                         .checkpoint_every = 2,
                         .on_rewards = [&](int64_t, std::vector<double>& r, const std::vector<size_t>& sizes) {
                           ++reward_calls;
                           CHECK(r.size() == 4);
                           CHECK((sizes == std::vector<size_t>{2, 2}));
                         },
                         .on_batch = [&](int64_t s, const bus::BatchView& b) { batches.emplace_back(s, b.groups.size()); },
                         .on_step = [&](int64_t, nlohmann::json& line) { lines.push_back(line); }},
                        {.models = {.policy = learner},
                         .algorithm = *grpo,
                         .comm = *comm,
                         .client = &client,
                         .publisher = &pub,
                         .checkpoint = [&](int64_t step, uint64_t) { checkpoints.push_back(step); }});
  int64_t step = 0;
  std::atomic<bool> stop{false};
  // 6 prompts, 2 groups a step: 3 steps, then the hub has no more.
  CHECK(loop.run(step, stop) == rlx::rl::LearnerLoop::End::exhausted);
  worker.join();
  CHECK(step == 3);
  CHECK(reward_calls == 3);
  REQUIRE(lines.size() == 3);
  for (size_t i = 0; i < lines.size(); ++i) {
    CHECK(lines[i]["step"] == static_cast<int64_t>(i) + 1);
    CHECK(lines[i]["groups"] == 2);
    CHECK(lines[i]["version_lag"] == 0);  // on-policy
    CHECK(lines[i]["sample_version_min"] == static_cast<int64_t>(i));
    CHECK(std::isfinite(lines[i]["pg_loss"].get<double>()));
    // The samples' finish reasons and environment counters, over the step's 4 samples.
    CHECK(lines[i]["truncated_fraction"] == 0.5);
    CHECK(lines[i]["env_errors_unparsed"] == 2.0);
    CHECK(lines[i]["env_errors_unparsed_mean"] == 0.5);
    CHECK(lines[i]["env_checks"] == 8.0);
  }
  CHECK((batches == std::vector<std::pair<int64_t, size_t>>{{1, 2}, {2, 2}, {3, 2}}));
  CHECK((checkpoints == std::vector<int64_t>{2}));
  CHECK(!loop.saved());  // step 3 is not checkpointed: a stop would save it
  CHECK(pub.version() == 3);
  // The published weights are the learner's.
  rlx::dist::ShmWeightSubscriber sub({.name = segment});
  auto u = sub.poll();
  REQUIRE(u);
  CHECK(u->version == 3);
  const auto now = learner.model().gather_parameters();
  for (size_t i = 0; i < now.size(); ++i) CHECK(at::equal(u->tensors[i].second, now[i].second));
  // A stop before the next batch: it returns at once, without a step.
  stop = true;
  CHECK(loop.run(step, stop) == rlx::rl::LearnerLoop::End::stopped);
  CHECK(step == 3);
  // At options.steps it ends without asking the hub.
  rlx::rl::LearnerLoop done({.steps = 3, .groups_per_step = 2}, {.models = {.policy = learner}, .algorithm = *grpo,
                                                            .comm = *comm, .client = &client});
  stop = false;
  CHECK(done.run(step, stop) == rlx::rl::LearnerLoop::End::steps);
}
