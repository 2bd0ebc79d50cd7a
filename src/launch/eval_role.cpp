// Held-out evaluation (`rlx eval`, and the accuracy `rlx sft` prints): greedy episodes on tasks
// the environment generates from a stream training never draws from, rolled out as a worker
// rolls them out (rollout::rollout_groups), environments in process.
#include "role_common.hpp"

#include "rlx/core/error.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/rollout/engine.hpp"
#include "rlx/rollout/worker.hpp"

namespace rlx::launch {

namespace {
// Held-out tasks come from a generator stream that training never draws from.
constexpr uint64_t kHeldOutSeed = 0x68656c646f7574;  // "heldout"

std::vector<bus::Lease> held_out_leases(const RunConfig& cfg) {
  std::vector<bus::Lease> out;
  const auto options = cfg.env.options_json();
  for (uint64_t i = 0; i < cfg.sft.eval_tasks; ++i)
    out.push_back({.lease_id = i, .prompt_index = i, .group_size = 1,
                   .task = env::Registry::global().generate(cfg.env.name, cfg.run.seed ^ kHeldOutSeed, i, options).dump()});
  return out;
}
}  // namespace

double greedy_accuracy(const RunConfig& cfg, const std::shared_ptr<Transformer>& model,
                       const std::shared_ptr<const Tokenizer>& tok) {
  Engine engine(model, {.block_size = static_cast<int32_t>(cfg.rollout.block_size), .kv_cache_blocks = cfg.rollout.kv_cache_blocks},
                tok);
  env::Context context{.tokenizer = tok.get(), .options = cfg.env.options_json(), .seed = cfg.run.seed};
  std::unique_ptr<Sandbox> sandbox;  // an environment that runs code runs it in its own sandbox
  if (env::Registry::global().needs(cfg.env.name).runs_code) {
    sandbox = std::make_unique<Sandbox>(cfg.env.sandbox);
    context.sandbox = sandbox.get();
  }
  auto& registry = env::Registry::global();
  const rollout::EnvSource envs{.make = [&] { return registry.make(cfg.env.name, context); },
                                .stop_strings = registry.make(cfg.env.name, context)->stop_strings()};
  const rollout::RolloutOptions ro{.max_turns = cfg.env.max_turns,
                                   .sampling = {.temperature = 0, .max_new_tokens = cfg.rollout.max_new_tokens},
                                   .seed = cfg.run.seed};
  double total = 0;
  for (const auto& g : rollout::rollout_groups(engine, envs, held_out_leases(cfg), ro)) {
    RLX_CHECK(g.error.empty(), "eval: task {}: {}", g.lease.prompt_index, g.error);
    total += g.episodes[0].reward;
  }
  return total / cfg.sft.eval_tasks;
}

double evaluate(const RunConfig& cfg) {
  set_threads(cfg);
  env::register_bundled();
  auto tok = run_tokenizer(cfg);
  return greedy_accuracy(cfg, initial_model(cfg, *tok), tok);
}

}  // namespace rlx::launch
