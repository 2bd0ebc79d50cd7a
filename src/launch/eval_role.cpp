// Held-out evaluation (`rlx eval`, and the accuracy `rlx sft` prints): greedy episodes, and
// with validation.samples n sampled ones, on held-out tasks (validation.dataset, or tasks the
// environment generates from a stream training never draws from), rolled out as a worker
// rolls them out (validation.hpp), environments in process.
#include "role_common.hpp"
#include "validation.hpp"

#include "rlx/core/error.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/launch/roles.hpp"

namespace rlx::launch {

double greedy_accuracy(const RunConfig& cfg, const std::shared_ptr<Transformer>& model,
                       const std::shared_ptr<const Tokenizer>& tok) {
  Validator v(cfg, model, tok, {.tasks = cfg.sft.eval_tasks, .kv_cache_blocks = cfg.rollout.kv_cache_blocks, .greedy_only = true});
  const auto m = v.run();
  RLX_CHECK(m["val/errors"].get<int64_t>() == 0, "eval: {} of {} held-out tasks failed in the environment",
            m["val/errors"].get<int64_t>(), cfg.sft.eval_tasks);
  return m["val/greedy_reward"].get<double>();  // the mean episode reward
}

nlohmann::json evaluate_report(const RunConfig& cfg) {
  set_threads(cfg);
  env::register_bundled();
  auto tok = run_tokenizer(cfg);
  Validator v(cfg, initial_model(cfg, *tok), tok, {.tasks = cfg.sft.eval_tasks, .kv_cache_blocks = cfg.rollout.kv_cache_blocks});
  auto m = v.run();
  RLX_CHECK(m["val/errors"].get<int64_t>() == 0, "eval: {} held-out tasks failed in the environment",
            m["val/errors"].get<int64_t>());
  nlohmann::json out{{"accuracy", m["val/greedy_reward"]}, {"tasks", m["val/tasks"]}};
  for (const auto& [k, value] : m.items())
    if (k.starts_with("val/") && k != "val/tasks" && k != "val/errors" && k != "val/cut_short") out[k.substr(4)] = value;
  return out;
}

double evaluate(const RunConfig& cfg) { return evaluate_report(cfg)["accuracy"].get<double>(); }

}  // namespace rlx::launch
