#include "validation.hpp"

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "rlx/bus/hub_state.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/launch/rollout_config.hpp"
#include "rlx/rollout/engine.hpp"
#include "rlx/rl/validation_metrics.hpp"
#include "rlx/rl/worker.hpp"

namespace rlx::launch {

using nlohmann::json;

namespace {
// Held-out tasks come from a generator stream that training never draws from.
constexpr uint64_t kHeldOutSeed = 0x68656c646f7574;  // "heldout"
// The sampled pass's seed: fixed, so that successive validations differ by the weights only.
constexpr uint64_t kValidationSeed = 0x76616c6964;  // "valid"

// Sets `flag` after `seconds` unless destroyed first.
class Deadline {
 public:
  Deadline(std::atomic<bool>& flag, double seconds)
      : thread_([this, &flag, seconds] {
          std::unique_lock lock(mu_);
          if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) flag = true;
        }) {}
  ~Deadline() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// The last turn's info: whether the environment called it correct, and its extracted answer.
bool is_correct(const env::Episode& e, double correct_reward) {
  if (!e.info.empty() && e.info.back().is_object() && e.info.back().contains("outcome"))
    return e.info.back()["outcome"] == "correct";
  return e.reward >= correct_reward - 1e-9;
}

std::string answer_of(const env::Episode& e, const Tokenizer& tok) {
  if (!e.info.empty() && e.info.back().is_object()) {
    const auto& info = e.info.back();
    if (const auto it = info.find("extracted"); it != info.end() && it->is_string()) return it->get<std::string>();
  }
  std::vector<TokenId> action;  // the model's own tokens
  for (size_t i = static_cast<size_t>(e.prompt_len); i < e.tokens.size(); ++i)
    if (e.loss_mask[i]) action.push_back(e.tokens[i]);
  return tok.decode(action);
}
}  // namespace

std::vector<bus::Lease> held_out_leases(const RunConfig& cfg, uint32_t count) {
  std::vector<std::string> tasks;
  if (!cfg.validation.dataset.empty()) {
    tasks = bus::load_jsonl(cfg.validation.dataset);
    if (tasks.size() > count) tasks.resize(count);  // its first `count` records
  } else {
    const auto options = cfg.env.options_json();
    for (uint64_t i = 0; i < count; ++i)
      tasks.push_back(env::Registry::global().generate(cfg.env.name, cfg.run.seed ^ kHeldOutSeed, i, options).dump());
  }
  std::vector<bus::Lease> out;
  for (uint64_t i = 0; i < tasks.size(); ++i)
    out.push_back({.lease_id = i, .prompt_index = i, .group_size = 1, .task = std::move(tasks[i])});
  return out;
}

Validator::Validator(const RunConfig& cfg, std::shared_ptr<Transformer> model, std::shared_ptr<const Tokenizer> tok,
                     Options options)
    : cfg_(cfg), options_(options), tok_(tok) {
  env::register_bundled();  // the learner's process has no environments of its own
  engine_ = std::make_unique<Engine>(
      std::move(model),
      EngineConfig{.block_size = static_cast<int32_t>(cfg.rollout.block_size), .kv_cache_blocks = options.kv_cache_blocks},
      tok);
  engine_->sleep();  // the KV pool only while validating (run()): the learner's memory plan counts it so
  if (env::Registry::global().needs(cfg.env.name).runs_code) sandbox_ = std::make_unique<env::Sandbox>(cfg.env.sandbox);
  leases_ = held_out_leases(cfg, options.tasks);
}

Validator::~Validator() = default;

void Validator::load(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& params) {
  engine_->load_weights(version, params);
}

json Validator::run() {
  const double t0 = now_s();
  engine_->wake();
  env::Context context{.tokenizer = tok_.get(), .options = cfg_.env.options_json(), .seed = cfg_.run.seed};
  context.sandbox = sandbox_.get();
  auto& registry = env::Registry::global();
  const rl::EnvSource envs{.make = [&] { return registry.make(cfg_.env.name, context); },
                                .stop_strings = registry.make(cfg_.env.name, context)->stop_strings()};
  const auto base = rollout_options(cfg_);  // the rollout's turns, max_new_tokens and stop strings
  std::atomic<bool> stop{false};
  std::optional<Deadline> deadline;
  if (options_.timeout_s > 0) deadline.emplace(stop, options_.timeout_s);
  json m;
  int64_t errors = 0;
  // Greedy: one episode per task.
  auto greedy = base;
  greedy.sampling.temperature = 0;
  greedy.sampling.top_k = 0, greedy.sampling.top_p = 1, greedy.sampling.min_p = 0;
  double correct = 0, reward = 0;
  int64_t done = 0;
  for (const auto& g : rl::rollout_groups(*engine_, envs, leases_, greedy, nullptr, {}, &stop)) {
    if (!g.error.empty() || g.episodes.empty()) {
      ++errors;
      continue;
    }
    ++done;
    reward += g.episodes[0].reward;
    correct += is_correct(g.episodes[0], cfg_.validation.correct_reward) ? 1 : 0;
  }
  m["val/greedy_acc"] = done > 0 ? correct / static_cast<double>(done) : 0.0;
  m["val/greedy_reward"] = done > 0 ? reward / static_cast<double>(done) : 0.0;
  m["val/tasks"] = done;
  // n samples per task.
  const uint32_t n = cfg_.validation.samples;
  if (n > 0 && !options_.greedy_only && !stop) {
    auto leases = leases_;
    for (auto& l : leases) l.group_size = n;
    auto sampled = base;
    sampled.sampling.temperature = cfg_.validation.temperature;
    sampled.sampling.top_p = cfg_.validation.top_p;
    sampled.sampling.top_k = 0, sampled.sampling.min_p = 0;
    sampled.seed ^= kValidationSeed;
    std::vector<rl::TaskSamples> tasks;
    for (const auto& g : rl::rollout_groups(*engine_, envs, leases, sampled, nullptr, {}, &stop)) {
      if (!g.error.empty() || g.episodes.empty()) {
        ++errors;
        continue;
      }
      auto& t = tasks.emplace_back();
      for (const auto& e : g.episodes) {
        t.correct.push_back(is_correct(e, cfg_.validation.correct_reward) ? 1 : 0);
        t.answers.push_back(answer_of(e, *tok_));
      }
    }
    const auto s = rl::sample_metrics(tasks, cfg_.validation.k);
    m[fmt::format("val/mean@{}", n)] = s.mean_at_n;
    m[fmt::format("val/maj@{}", n)] = s.maj_at_n;
    for (size_t i = 0; i < s.ks_used.size(); ++i) m[fmt::format("val/pass@{}", s.ks_used[i])] = s.pass_at_k[i];
    m["val/sampled_tasks"] = s.tasks;
  }
  m["val/errors"] = errors;
  m["val/cut_short"] = stop.load() ? 1 : 0;
  engine_->sleep();
  m["val_s"] = now_s() - t0;
  if (stop) log::warn("validation: cut short after {} s (validation.timeout_s); the metrics are those of the finished tasks",
                      options_.timeout_s);
  return m;
}

}  // namespace rlx::launch
