// The rollout worker in-process: a hub on its own thread (real ZeroMQ over ipc://), a
// learner client taking the groups, weights through a shared-memory segment, and the
// arithmetic environment; the worker runs on a thread of the test.
#include "rlx/rollout/worker.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "../helpers.hpp"
#include "../hub_thread.hpp"
#include "rlx/bus/hub.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/model/config.hpp"

using rlx::test::HubThread;
using rlx::test::TempDir;
namespace bus = rlx::bus;
namespace rollout = rlx::rollout;

namespace {

// Everything a worker needs, as the launcher's worker role builds it, on a tiny model.
struct Rig {
  TempDir dir;
  std::shared_ptr<const rlx::Tokenizer> tok = std::make_shared<rlx::CharTokenizer>(rlx::default_char_alphabet());
  std::shared_ptr<rlx::Transformer> model;
  std::unique_ptr<rlx::Engine> engine;
  rlx::env::Context context;
  std::string address, segment;
  std::unique_ptr<HubThread> hub;
  std::unique_ptr<rlx::dist::ShmWeightPublisher> pub;

  explicit Rig(int tasks, uint32_t group_size = 2) {
    rlx::env::register_bundled();
    auto mc = rlx::model_preset("tiny");
    mc.vocab_size = tok->vocab_size();
    model = std::make_shared<rlx::Transformer>(mc);
    model->init_weights(3);
    engine = std::make_unique<rlx::Engine>(model, rlx::EngineConfig{.block_size = 16, .kv_cache_blocks = 256}, tok);
    context = {.tokenizer = tok.get(), .options = {{"digits", 1}, {"terms", 2}}, .seed = 1};
    std::vector<std::string> records;
    for (int i = 0; i < tasks; ++i)
      records.push_back(rlx::env::Registry::global().generate("arithmetic", 1, static_cast<uint64_t>(i), context.options).dump());
    address = "ipc://" + (dir.path / "hub.sock").string();
    bus::HubOptions o;
    o.address = address;
    o.group_size = group_size;
    o.heartbeat_s = 0.1;
    o.peer_timeout_s = 5;
    o.replay.max_staleness = 0;  // synchronous: a lease asks for the current version
    hub = std::make_unique<HubThread>(o, std::move(records));
    segment = "rlx-worker-test-" + std::to_string(::getpid());
    pub = std::make_unique<rlx::dist::ShmWeightPublisher>(
        rlx::dist::ShmSyncOptions{.name = segment},
        rlx::dist::WeightLayout::of(model->hf_parameters(), at::kFloat));
  }
  // The learner's version 1 (the initial weights) published and announced: every lease
  // asks for it (synchronous hub).
  void publish_v1(bus::Client& learner) {
    pub->publish(1, model->hf_parameters());
    learner.publish_version(1);
  }
  rollout::EnvSource envs() {
    return {.make = [this] { return rlx::env::Registry::global().make("arithmetic", context); },
            .stop_strings = rlx::env::Registry::global().make("arithmetic", context)->stop_strings()};
  }
  bus::ClientOptions client(const std::string& who, const std::string& role = "worker") const {
    return {.address = address, .who = who, .role = role, .heartbeat_s = 0.1, .hub_timeout_s = 5, .request_timeout_s = 20,
            .credit_wait_s = 20};
  }
  rollout::WorkerOptions options() const {
    return {.who = "w0",
            .rollout = {.max_turns = 1, .sampling = {.temperature = 1.0, .max_new_tokens = 4}, .seed = 1},
            .leases_per_request = 3,
            .weights_timeout_s = 20};
  }
};

}  // namespace

TEST_CASE("rollout worker in-process: every lease becomes one group, sampled under the weights the lease asks for",
          "[rollout][worker]") {
  Rig rig(6);
  bus::Client learner(rig.client("learner", "learner"));
  rig.publish_v1(learner);
  bus::Client client(rig.client("w0"));
  rlx::dist::ShmWeightSubscriber weights({.name = rig.segment});
  std::vector<std::string> said;
  auto o = rig.options();
  int rounds = 0;
  o.status = [&](const std::string& what) { said.push_back(what); };
  o.after_round = [&] { ++rounds; };
  rollout::Worker worker(o, *rig.engine, rig.envs(), client, weights);
  std::atomic<bool> end{false}, leave{false};
  int64_t sent = -1;
  std::thread t([&] { sent = worker.run(end, leave); });  // until the hub's 6 prompts are done
  std::vector<bus::TrajectoryGroup> groups;
  while (groups.size() < 6) {
    auto b = learner.next_batch({.max_groups = 6}, 30);
    for (auto& g : b.groups) groups.push_back(std::move(g));
    if (b.end) break;
  }
  t.join();
  CHECK(sent == 6);
  CHECK(worker.groups_sent() == 6);
  CHECK(rounds >= 2);  // 3 leases a request
  CHECK(worker.busy_s() > 0);
  CHECK(rig.engine->weight_version() == 1);
  REQUIRE(groups.size() == 6);
  std::set<uint64_t> prompts;
  for (const auto& g : groups) {
    prompts.insert(g.prompt_index);
    CHECK(g.worker == "w0");
    REQUIRE(g.samples.size() == 2);
    for (const auto& s : g.samples) {
      REQUIRE(s.tokens.size() > static_cast<size_t>(s.prompt_len));
      CHECK(s.loss_mask.size() == s.tokens.size());
      CHECK(s.logprobs.size() == s.tokens.size());
      const auto v = s.versions.per_token();
      for (size_t i = 0; i < v.size(); ++i) CHECK(v[i] == (s.loss_mask[i] ? 1 : -1));  // actions only, at version 1
      CHECK((s.reward == 0.0f || s.reward == 1.0f));
    }
  }
  CHECK(prompts.size() == 6);  // each prompt once
  CHECK(std::find(said.begin(), said.end(), "asking the hub for leases") != said.end());
}

TEST_CASE("rollout worker in-process: leave finishes the leases held, end stops without sending a group cut short",
          "[rollout][worker]") {
  Rig rig(40);
  bus::Client learner(rig.client("learner", "learner"));
  rig.publish_v1(learner);
  rlx::dist::ShmWeightSubscriber weights({.name = rig.segment});
  {
    bus::Client client(rig.client("leaver"));
    std::atomic<bool> end{false}, leave{false};
    auto o = rig.options();
    o.who = "leaver";
    o.after_round = [&] { leave = true; };  // after its first grant's groups
    rollout::Worker worker(o, *rig.engine, rig.envs(), client, weights);
    CHECK(worker.run(end, leave) == 3);  // one grant of 3 leases, sent whole
  }
  {
    bus::Client client(rig.client("stopped"));
    std::atomic<bool> end{false}, leave{false};
    auto o = rig.options();
    o.who = "stopped";
    // Stopped while it waits for a version that never comes: returns at once, sends nothing.
    learner.publish_version(2);
    o.status = [&](const std::string& what) {
      if (what.starts_with("waiting for weights v2")) end = true;
    };
    rollout::Worker worker(o, *rig.engine, rig.envs(), client, weights);
    CHECK(worker.run(end, leave) == 0);
  }
  // A version that does not come within weights_timeout_s is an error naming it.
  bus::Client client(rig.client("late"));
  auto o = rig.options();
  o.who = "late";
  o.weights_timeout_s = 0.5;
  rollout::Worker worker(o, *rig.engine, rig.envs(), client, weights);
  std::atomic<bool> end{false}, leave{false};
  CHECK_THROWS_WITH(worker.run(end, leave), Catch::Contains("late: weights version 2 did not arrive within 0.5 s"));
}

TEST_CASE("rollout groups: a mixture-of-experts episode continued from its checkpoint has the routing of one never stopped",
          "[rollout][worker][routing]") {
  rlx::env::register_bundled();
  TempDir dir;
  auto tok = std::make_shared<rlx::CharTokenizer>(rlx::default_char_alphabet());
  auto mc = rlx::model_preset("tiny-moe");
  mc.vocab_size = tok->vocab_size();
  auto model = std::make_shared<rlx::Transformer>(mc);
  model->init_weights(5);
  rlx::env::Context context{.tokenizer = tok.get(), .seed = 1};
  const rollout::EnvSource envs{.make = [&] { return rlx::env::Registry::global().make("guess_number", context); },
                                .stop_strings = rlx::env::Registry::global().make("guess_number", context)->stop_strings()};
  const std::vector<bus::Lease> leases{{.lease_id = 1, .prompt_index = 0, .group_size = 2, .task = R"({"target": 7, "range": 9})"},
                                       {.lease_id = 2, .prompt_index = 1, .group_size = 2, .task = R"({"target": 2, "range": 9})"}};
  const rollout::RolloutOptions ro{.max_turns = 3, .sampling = {.temperature = 1.0, .max_new_tokens = 5}, .seed = 1};
  const auto engine = [&] { return std::make_unique<rlx::Engine>(model, rlx::EngineConfig{.block_size = 4}, tok); };
  // Uninterrupted.
  auto e1 = engine();
  auto whole = rollout::rollout_groups(*e1, envs, leases, ro);
  // Stopped right after its first checkpoint, then continued from it by another engine (the
  // worker that takes the lease over).
  const auto episodes = dir.path / "episodes";
  rollout::EpisodeCheckpoints first(episodes, 1);
  std::atomic<bool> stop{false};
  auto e2 = engine();
  auto cut = rollout::rollout_groups(*e2, envs, leases, ro, &first, [&] { stop = true; }, &stop);
  REQUIRE(cut[0].error == "the worker was stopped");
  rollout::EpisodeCheckpoints again(episodes, 1);
  auto e3 = engine();
  auto resumed = rollout::rollout_groups(*e3, envs, leases, ro, &again);
  int64_t recorded = 0, observation_turns = 0;
  for (size_t g = 0; g < leases.size(); ++g) {
    REQUIRE(resumed[g].error.empty());
    CHECK(resumed[g].start_turn == 1);
    CHECK(resumed[g].routing_layers == 2);
    REQUIRE(resumed[g].episodes.size() == 2);
    for (size_t k = 0; k < 2; ++k) {
      const auto& ep = whole[g].episodes[k];
      CHECK(resumed[g].episodes[k].turns == ep.turns);
      CHECK(resumed[g].episodes[k].tokens == ep.tokens);
      REQUIRE(whole[g].routing[k].size() == ep.tokens.size() * 4);
      CHECK(resumed[g].routing[k] == whole[g].routing[k]);
      for (size_t i = 0; i < ep.tokens.size(); ++i) recorded += whole[g].routing[k][4 * i] >= 0;
      observation_turns += ep.turns > 1;
    }
    auto t = rollout::to_trajectory_group(resumed[g], "w");
    CHECK(t.samples[1].routing.layers == 2);
    CHECK(t.samples[1].routing.experts == whole[g].routing[1]);
  }
  CHECK(observation_turns > 0);  // episodes went past their first turn
  CHECK(recorded > 40);

  // A checkpoint of the format before routing (rlx-episodes/1) continues with none recorded
  // for its tokens so far; one of another routing shape starts over.
  const auto file = episodes / "p0.e0";
  // Saves the first group's episodes at turn 1 with routing of `layers` x 2, all `value`
  // (-2: the episodes' own).
  const auto save = [&](uint16_t layers, int16_t value) {
    rollout::GroupRollout g{.lease = leases[0], .routing_layers = layers, .routing_top_k = 2};
    for (size_t k = 0; k < 2; ++k) {
      const size_t n = whole[0].episodes[k].tokens.size();
      g.envs.push_back(envs.make());
      g.episodes.push_back(whole[0].episodes[k]);
      g.versions.emplace_back(n, -1);
      g.routing.push_back(value == -2 ? whole[0].routing[k] : std::vector<int16_t>(n * layers * 2, value));
    }
    rollout::EpisodeCheckpoints(episodes, 1).save(g, 1);
  };
  save(2, -2);
  const auto rewrite = [&](const std::function<void(nlohmann::json&)>& change) {
    const auto text = rlx::read_file(file, 1 << 30);
    auto j = nlohmann::json::parse(text.substr(17));
    change(j);
    const auto body = j.dump();
    rlx::write_file_atomic(file, fmt::format("{:016x}\n{}", rlx::hash_name(body), body));
  };
  rewrite([](nlohmann::json& j) {
    j["format"] = "rlx-episodes/1";
    j.erase("routing_layers"), j.erase("routing_top_k");
    for (auto& s : j["samples"]) s.erase("routing");
  });
  rollout::GroupRollout old{.lease = leases[0], .routing_layers = 2, .routing_top_k = 2};
  REQUIRE(rollout::EpisodeCheckpoints(episodes, 1).restore(old, envs));
  CHECK(old.routing[1] == std::vector<int16_t>(old.episodes[1].tokens.size() * 4, -1));
  save(3, 1);
  rollout::GroupRollout other{.lease = leases[0], .routing_layers = 2, .routing_top_k = 2};
  CHECK_FALSE(rollout::EpisodeCheckpoints(episodes, 1).restore(other, envs));  // starts over
  CHECK(other.episodes.empty());
  CHECK_FALSE(std::filesystem::exists(file));
}
