// Validation of a policy on held-out tasks (internal to src/launch): a greedy pass and n
// samples per task with the validation section's sampling, scored by the run's environment,
// reported as val/... metrics. Learner rank 0 runs it during `rlx run` (validation.every_steps)
// at the step's weights with an engine of its own; `rlx eval` runs it once.
//
//   Validator v(cfg, model, tok, {.tasks = cfg.validation.tasks, .kv_cache_blocks = 256});
//   v.load(step, policy.model().sync_parameters());
//   json m = v.run();  // {"val/greedy_acc": 0.4, "val/mean@4": 0.35, "val/pass@4": 0.6, "val/maj@4": 0.45, ...}
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "rlx/bus/message.hpp"
#include "rlx/launch/config.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/model/transformer.hpp"
#include "validation_summary.hpp"

namespace rlx {
class Engine;
}  // namespace rlx
namespace rlx::env {
class Sandbox;
}  // namespace rlx::env

namespace rlx::launch {

// Held-out tasks: the first `count` records of validation.dataset, else the environment's
// generated tasks from a seed stream training never draws from (run.seed ^ "heldout").
std::vector<bus::Lease> held_out_leases(const RunConfig& cfg, uint32_t count);

// Whether `step` validates: step 0 (the start), every `every` steps and the last step.
inline bool validation_due(int64_t every, int64_t step, int64_t last_step) {
  return every > 0 && (step % every == 0 || step == last_step);
}

class Validator {
 public:
  struct Options {
    uint32_t tasks = 64;
    int64_t kv_cache_blocks = 256;
    bool greedy_only = false;  // `rlx sft`'s accuracy: no samples
    double timeout_s = 0;      // cut short after this (0: no limit)
  };
  Validator(const RunConfig& cfg, std::shared_ptr<Transformer> model, std::shared_ptr<const Tokenizer> tok,
            Options options);
  ~Validator();
  Validator(const Validator&) = delete;
  Validator& operator=(const Validator&) = delete;

  // A complete set of weights as the learner publishes them (HF names, or the adapters with
  // LoRA), copied into the engine's model.
  void load(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& params);
  // Greedy accuracy and, with validation.samples > 0, mean@n, pass@k and maj@n at the
  // engine's weights; cut short after Options::timeout_s (val/cut_short 1, the finished
  // tasks counted). Keys: val/greedy_acc, val/greedy_reward, val/mean@n, val/pass@k,
  // val/maj@n, val/tasks, val/errors, val/cut_short, val_s.
  nlohmann::json run();

 private:
  const RunConfig& cfg_;
  Options options_;
  std::shared_ptr<const Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<env::Sandbox> sandbox_;
  std::vector<bus::Lease> leases_;
};

}  // namespace rlx::launch
