// What a run's config makes of its rollout side: the engine's settings and how a worker
// samples (rollout.* and env.max_turns), shared by the worker role and a colocated learner.
//
//   auto cfg = rlx::config::load_file<rlx::RunConfig>("run.yaml");
//   rlx::Engine engine(model, rlx::launch::engine_config(cfg), tokenizer);
//   auto o = rlx::launch::rollout_options(cfg);   // o.sampling.top_p == cfg.rollout.top_p, ...
#pragma once

#include "rlx/launch/config.hpp"
#include "rlx/rollout/engine.hpp"
#include "rlx/rl/worker.hpp"

namespace rlx::launch {

// rollout.block_size, rollout.kv_cache_blocks, rollout.update_policy.
EngineConfig engine_config(const RunConfig& cfg);
// env.max_turns; rollout.temperature, top_k, top_p, min_p, max_new_tokens and stop as the
// sampling parameters; rollout.seed (-1: run.seed).
rl::RolloutOptions rollout_options(const RunConfig& cfg);

}  // namespace rlx::launch
