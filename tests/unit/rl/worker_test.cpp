// The rollout worker in-process: a hub on its own thread (real ZeroMQ over ipc://), a
// learner client taking the groups, weights through a shared-memory segment, and the
// arithmetic environment; the worker runs on a thread of the test.
#include "rlx/rl/worker.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>
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
namespace rl = rlx::rl;

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

  explicit Rig(int tasks, uint32_t group_size = 2, rlx::UpdatePolicy policy = rlx::UpdatePolicy::finish_old) {
    rlx::env::register_bundled();
    auto mc = rlx::model_preset("tiny");
    mc.vocab_size = tok->vocab_size();
    model = std::make_shared<rlx::Transformer>(mc);
    model->init_weights(3);
    engine = std::make_unique<rlx::Engine>(
        model, rlx::EngineConfig{.block_size = 16, .kv_cache_blocks = 256, .update_policy = policy}, tok);
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
  rl::EnvSource envs() {
    return {.make = [this] { return rlx::env::Registry::global().make("arithmetic", context); },
            .stop_strings = rlx::env::Registry::global().make("arithmetic", context)->stop_strings()};
  }
  bus::ClientOptions client(const std::string& who, const std::string& role = "worker") const {
    return {.address = address, .who = who, .role = role, .heartbeat_s = 0.1, .hub_timeout_s = 5, .request_timeout_s = 20,
            .credit_wait_s = 20};
  }
  rl::WorkerOptions options() const {
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
  rl::Worker worker(o, *rig.engine, rig.envs(), client, weights);
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
    rl::Worker worker(o, *rig.engine, rig.envs(), client, weights);
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
    rl::Worker worker(o, *rig.engine, rig.envs(), client, weights);
    CHECK(worker.run(end, leave) == 0);
  }
  // A version that does not come within weights_timeout_s is an error naming it.
  bus::Client client(rig.client("late"));
  auto o = rig.options();
  o.who = "late";
  o.weights_timeout_s = 0.5;
  rl::Worker worker(o, *rig.engine, rig.envs(), client, weights);
  std::atomic<bool> end{false}, leave{false};
  CHECK_THROWS_WITH(worker.run(end, leave), Catch::Contains("late: weights version 2 did not arrive within 0.5 s"));
}

namespace {

// Weights handed out in the order offered (the test decides when a version is out), counting
// the polls that find nothing new.
class OfferedWeights final : public rlx::dist::WeightSubscriber {
 public:
  explicit OfferedWeights(rlx::dist::WeightLayout layout) : layout_(std::move(layout)) {}
  void offer(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    std::lock_guard lock(mu_);
    queue_.push_back({.version = version, .tensors = tensors});
  }
  std::optional<rlx::dist::WeightUpdate> poll() override {
    std::lock_guard lock(mu_);
    if (queue_.empty()) {
      ++empty_polls_;
      cv_.notify_all();
      return std::nullopt;
    }
    auto u = std::move(queue_.front());
    queue_.pop_front();
    version_ = u.version;
    return u;
  }
  int64_t version() const override {
    std::lock_guard lock(mu_);
    return version_;
  }
  const rlx::dist::WeightLayout& layout() const override { return layout_; }
  // Until every offered version was taken and a poll after it found nothing: whoever polls
  // (the worker's updater thread) has handed the last one to the engine.
  bool wait_all_taken(double timeout_s) {
    std::unique_lock lock(mu_);
    const auto seen = empty_polls_;
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                        [&] { return queue_.empty() && empty_polls_ > seen; });
  }

 private:
  rlx::dist::WeightLayout layout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<rlx::dist::WeightUpdate> queue_;
  int64_t version_ = 0;
  int64_t empty_polls_ = 0;
};

// Two turns: an observation after the first action, the end after the second (with a
// counter in its info). The first step of any episode calls `after_first` once.
class TwoTurns final : public rlx::env::Env {
 public:
  TwoTurns(const rlx::Tokenizer& tok, std::function<void()>* after_first) : tok_(tok), after_first_(after_first) {}
  std::vector<rlx::TokenId> reset(const nlohmann::json&) override { return tok_.encode("1+1="); }
  rlx::env::StepResult step(std::span<const rlx::TokenId>) override {
    if (++turn_ == 1) {
      if (*after_first_) std::exchange(*after_first_, nullptr)();
      return {.observation = tok_.encode(" ok "), .reward = 0, .done = false};
    }
    return {.reward = 1, .done = true, .info = {{"errors_unparsed", 1}, {"extracted", "2"}}};
  }
  std::string save_state() const override { return "{}"; }
  void load_state(std::string_view) override {}

 private:
  const rlx::Tokenizer& tok_;
  std::function<void()>* after_first_;
  int turn_ = 0;
};

// One lease of two samples through a worker whose engine has `policy`; version 2 is
// offered after the first turn. Returns the group the hub took and the engine's version
// after the run.
std::pair<bus::TrajectoryGroup, int64_t> roll_across_an_update(rlx::UpdatePolicy policy) {
  Rig rig(1, 2, policy);
  bus::Client learner(rig.client("learner", "learner"));
  learner.publish_version(1);
  OfferedWeights weights(rlx::dist::WeightLayout::of(rig.model->hf_parameters(), at::kFloat));
  weights.offer(1, rig.model->hf_parameters());
  std::function<void()> after_first = [&] {
    weights.offer(2, rig.model->hf_parameters());
    // Partial rollouts: the update is staged while the grant runs; wait until it is, so
    // that the second turn is sampled after it.
    if (policy == rlx::UpdatePolicy::continue_) CHECK(weights.wait_all_taken(20));
  };
  // (In-process environments step one after another on the worker's thread.)
  rl::EnvSource envs{.make = [&]() -> std::unique_ptr<rlx::env::Env> {
    return std::make_unique<TwoTurns>(*rig.tok, &after_first);
  }};
  auto o = rig.options();
  o.rollout.max_turns = 2;
  o.rollout.sampling.ignore_eos = true;  // every action is cut at max_new_tokens (4)
  bus::Client client(rig.client("w0"));
  rl::Worker worker(o, *rig.engine, envs, client, weights);
  std::atomic<bool> end{false}, leave{false};
  std::thread t([&] { worker.run(end, leave); });
  std::vector<bus::TrajectoryGroup> groups;
  for (int tries = 0; groups.empty() && tries < 10; ++tries) {
    auto b = learner.next_batch({.max_groups = 1}, 30);
    for (auto& g : b.groups) groups.push_back(std::move(g));
    if (b.end) break;
  }
  t.join();
  REQUIRE(groups.size() == 1);
  return {groups[0], rig.engine->weight_version()};
}

// The versions of each action's tokens in order (-1 outside actions dropped), per turn.
std::vector<std::vector<int64_t>> action_versions(const bus::Trajectory& t) {
  std::vector<std::vector<int64_t>> turns;
  bool in_action = false;
  const auto v = t.versions.per_token();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!t.loss_mask[i]) {
      in_action = false;
      continue;
    }
    if (!in_action) turns.emplace_back();
    in_action = true;
    turns.back().push_back(v[i]);
  }
  return turns;
}

}  // namespace

TEST_CASE("rollout worker: with update_policy continue, a version out mid-grant samples the later tokens",
          "[rollout][worker]") {
  // continue: the second turn of each episode is sampled under version 2, staged while the
  // grant ran; finish_old: the grant finishes on version 1, and version 2 applies after it.
  for (const auto policy : {rlx::UpdatePolicy::continue_, rlx::UpdatePolicy::finish_old}) {
    const bool partial = policy == rlx::UpdatePolicy::continue_;
    INFO((partial ? "continue" : "finish_old"));
    auto [group, engine_version] = roll_across_an_update(policy);
    CHECK(engine_version == 2);
    REQUIRE(group.samples.size() == 2);
    for (const auto& s : group.samples) {
      const auto turns = action_versions(s);
      REQUIRE(turns.size() == 2);
      CHECK(turns[0] == std::vector<int64_t>(4, 1));
      CHECK(turns[1] == std::vector<int64_t>(4, partial ? 2 : 1));
      // The last action was cut at max_new_tokens; the environment's counter and answer ride along.
      CHECK(s.finish == "length");
      const auto meta = nlohmann::json::parse(s.metadata);
      CHECK(meta["env"]["errors_unparsed"] == 1.0);
      CHECK(meta["info"]["extracted"] == "2");
    }
  }
}

TEST_CASE("rollout worker: a trajectory's finish says why it ended; its metadata carries the environment's info",
          "[rollout][worker]") {
  rl::GroupRollout g;
  g.lease = {.lease_id = 3, .prompt_index = 1, .epoch = 0, .group_size = 3};
  for (int k = 0; k < 3; ++k) {
    auto& ep = g.episodes.emplace_back();
    ep.start(std::vector<rlx::TokenId>{1, 2});
    ep.add_action(std::vector<rlx::TokenId>{3, 4}, std::vector<float>{-0.5f, -0.5f});
    g.versions.push_back({-1, -1, 7, 7});
    g.truncated.push_back(k == 0);
    ep.done = k != 2;  // sample 2 ran out of turns
    ep.info.push_back({{"errors_unparsed", 1}, {"ok", true}, {"outcome", "first"}});
    // A long text is cut to kMaxInfoText bytes, not inside a character (the 2-byte \u00e9 at 511).
    ep.info.push_back({{"errors_unparsed", 2}, {"nested", {{"a", 1}}}, {"extracted", "\u00e9"},
                       {"detail", std::string(511, 'x') + "\u00e9 and more"}});
  }
  g.reward_parts = {{1.0, 0.5}, {0.0, 0.25}, {1.0, 0.0}};
  auto t = rl::to_trajectory_group(g, "w");
  REQUIRE(t.samples.size() == 3);
  CHECK(t.samples[0].finish == "length");  // cut by max_new_tokens
  CHECK(t.samples[1].finish == "stop");    // the environment ended it
  CHECK(t.samples[2].finish == "turns");   // env.max_turns reached
  const auto meta = nlohmann::json::parse(t.samples[0].metadata);
  CHECK(meta["env"] == nlohmann::json{{"errors_unparsed", 3.0}, {"ok", 1.0}});  // summed over turns; nested skipped
  CHECK(meta["info"]["extracted"] == "\u00e9");  // the last turn's text values
  CHECK(!meta["info"].contains("outcome"));
  CHECK(meta["info"]["detail"] == std::string(511, 'x'));
  static_assert(rl::kMaxInfoText == 512);
  CHECK(meta["reward_env"] == 1.0);
  CHECK(meta["reward_model"] == 0.5);
  // An environment's info is bounded in what a trajectory carries of it.
  rl::GroupRollout chatty;
  chatty.lease = g.lease;
  auto& ep = chatty.episodes.emplace_back();
  ep.start(std::vector<rlx::TokenId>{1});
  chatty.versions.push_back({-1});
  nlohmann::json info;
  for (int i = 0; i < 100; ++i) info["n" + std::to_string(i)] = i, info["s" + std::to_string(i)] = "text";
  ep.info.push_back(info);
  const auto bounded = nlohmann::json::parse(rl::to_trajectory_group(chatty, "w").samples[0].metadata);
  CHECK(bounded["env"].size() == rl::kMaxEnvCounters);
  CHECK(bounded["info"].size() == rl::kMaxInfoTexts);
  // Without info or a reward model: no metadata.
  rl::GroupRollout plain;
  plain.lease = g.lease;
  plain.episodes.emplace_back().start(std::vector<rlx::TokenId>{1});
  plain.versions.push_back({-1});
  CHECK(rl::to_trajectory_group(plain, "w").samples[0].metadata.empty());
  CHECK(rl::to_trajectory_group(plain, "w").samples[0].finish == "turns");
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
  const rl::EnvSource envs{.make = [&] { return rlx::env::Registry::global().make("guess_number", context); },
                                .stop_strings = rlx::env::Registry::global().make("guess_number", context)->stop_strings()};
  const std::vector<bus::Lease> leases{{.lease_id = 1, .prompt_index = 0, .group_size = 2, .task = R"({"target": 7, "range": 9})"},
                                       {.lease_id = 2, .prompt_index = 1, .group_size = 2, .task = R"({"target": 2, "range": 9})"}};
  const rl::RolloutOptions ro{.max_turns = 3, .sampling = {.temperature = 1.0, .max_new_tokens = 5}, .seed = 1};
  const auto engine = [&] { return std::make_unique<rlx::Engine>(model, rlx::EngineConfig{.block_size = 4}, tok); };
  // Uninterrupted.
  auto e1 = engine();
  auto whole = rl::rollout_groups(*e1, envs, leases, ro);
  // Stopped right after its first checkpoint, then continued from it by another engine (the
  // worker that takes the lease over).
  const auto episodes = dir.path / "episodes";
  rl::EpisodeCheckpoints first(episodes, 1);
  std::atomic<bool> stop{false};
  auto e2 = engine();
  auto cut = rl::rollout_groups(*e2, envs, leases, ro, &first, [&] { stop = true; }, &stop);
  REQUIRE(cut[0].error == "the worker was stopped");
  rl::EpisodeCheckpoints again(episodes, 1);
  auto e3 = engine();
  auto resumed = rl::rollout_groups(*e3, envs, leases, ro, &again);
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
    auto t = rl::to_trajectory_group(resumed[g], "w");
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
    rl::GroupRollout g{.lease = leases[0], .routing_layers = layers, .routing_top_k = 2};
    for (size_t k = 0; k < 2; ++k) {
      const size_t n = whole[0].episodes[k].tokens.size();
      g.envs.push_back(envs.make());
      g.episodes.push_back(whole[0].episodes[k]);
      g.versions.emplace_back(n, -1);
      g.routing.push_back(value == -2 ? whole[0].routing[k] : std::vector<int16_t>(n * layers * 2, value));
    }
    rl::EpisodeCheckpoints(episodes, 1).save(g, 1);
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
  rl::GroupRollout old{.lease = leases[0], .routing_layers = 2, .routing_top_k = 2};
  REQUIRE(rl::EpisodeCheckpoints(episodes, 1).restore(old, envs));
  CHECK(old.routing[1] == std::vector<int16_t>(old.episodes[1].tokens.size() * 4, -1));
  save(3, 1);
  rl::GroupRollout other{.lease = leases[0], .routing_layers = 2, .routing_top_k = 2};
  CHECK_FALSE(rl::EpisodeCheckpoints(episodes, 1).restore(other, envs));  // starts over
  CHECK(other.episodes.empty());
  CHECK_FALSE(std::filesystem::exists(file));
}
