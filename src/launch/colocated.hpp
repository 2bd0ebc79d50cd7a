// The rollout half of a colocated learner (train.placement = colocated; internal): the
// learner process also runs a rollout engine on the same device and worker 0 on a thread of
// its own. They take turns on the device (DeviceTurns): the engine's KV pool is released
// while the learner trains, and each new version goes into the engine's weights with one
// copy (rl::ColocatedWeights). The hub and the env servers stay as they are.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "rlx/core/device_turns.hpp"
#include "rlx/launch/memory_plan.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/rl/colocated.hpp"
#include "rlx/rollout/engine.hpp"

namespace rlx::launch {

class ColocatedRollout {
 public:
  // `model`: the engine's own copy of the starting weights (model.dtype, model.device).
  ColocatedRollout(const RoleContext& ctx, std::shared_ptr<Transformer> model, std::shared_ptr<const Tokenizer> tok,
                   dist::WeightLayout layout);
  ~ColocatedRollout();  // finish() if the worker still runs (errors dropped)
  ColocatedRollout(const ColocatedRollout&) = delete;
  ColocatedRollout& operator=(const ColocatedRollout&) = delete;

  dist::WeightPublisher& publisher() { return weights_; }
  // The device's turns, or null when generation and training overlap (train.mode = async:
  // the KV pool stays, versions are staged for the worker).
  DeviceTurns* turns() { return overlap_ ? nullptr : &turns_; }
  Engine& engine() { return *engine_; }

  // Starts worker 0 on its thread. If it fails, `stop` is set (the learner's loop ends) and
  // finish() rethrows its error.
  void start(std::atomic<bool>& stop);
  // Ends the worker (groups in flight are not sent: the hub issues their leases again),
  // joins it, and rethrows its error if it failed.
  void finish();
  bool failed() const { return failed_; }

  // The step's rollout and device figures (since the previous call): generate_s (the worker
  // held the device: generation and env steps), busy_device (the share of the step the
  // device was held), busy_worker_0 / busy_rollout, weight_copy_s, kv_pool_mb, and the
  // engine's CUDA graphs: graph_steps (decode steps replayed), graph_captures and
  // graph_capture_s (captured again after each sleep: what dropping them with the KV pool costs).
  void add_metrics(nlohmann::json& line);

 private:
  const RoleContext& ctx_;
  bool overlap_;
  std::shared_ptr<const Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  rl::ColocatedWeights weights_;
  DeviceTurns turns_;
  std::thread thread_;
  std::atomic<bool> end_{false}, failed_{false};
  std::exception_ptr error_;
  DeviceTurns::Totals last_;
  std::atomic<double> generated_s_{0};  // the worker's seconds rolling out (after each grant)
  double last_generated_s_ = 0, last_at_ = 0;
  // The engine's graph counters, read on the worker's thread after each round (EngineStats).
  std::atomic<int64_t> graph_steps_{0}, graph_captures_{0};
  std::atomic<double> graph_capture_s_{0};
  int64_t last_graph_steps_ = 0, last_graph_captures_ = 0;
  double last_graph_capture_s_ = 0;
};

}  // namespace rlx::launch
