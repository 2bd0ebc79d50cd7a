// Weight sync for a colocated run (train.placement = colocated): the learner and a rollout
// engine in one process on one device. A version goes straight into the engine's weights
// with one copy (the learner's compute-dtype tensors into the engine's own, fused, buffers;
// no staging, no shared memory, no socket), so a sync is that copy plus a version bump. The
// engine must be idle while it happens: the learner publishes while it holds the device's
// train turn (core/device_turns.hpp), which the rollout worker needs to generate.
//
//   rlx::DeviceTurns turns({.on_switch = rlx::rollout::kv_handover(engine)});
//   rlx::rollout::ColocatedWeights weights(engine, layout);
//   rlx::LearnerLoop loop(..., {..., .publisher = &weights, .turns = &turns});   // learner thread
//   rlx::rollout::Worker worker({..., .turns = &turns}, engine, envs, client, weights);  // worker thread
#pragma once

#include <functional>
#include <optional>

#include "rlx/core/device_turns.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/rollout/engine.hpp"

namespace rlx::rollout {

class ColocatedWeights final : public dist::WeightPublisher, public dist::WeightSubscriber {
 public:
  ColocatedWeights(Engine& engine, dist::WeightLayout layout);
  // Copies `tensors` into the engine's weights as `version` (the engine idle: its worker
  // does not hold the device). Returns the bytes copied.
  int64_t publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  // The engine's version: the worker sees a publish at once.
  int64_t version() const override { return engine_.weight_version(); }
  // Nothing to take: publish() already put the weights in the engine.
  std::optional<dist::WeightUpdate> poll() override { return std::nullopt; }
  const dist::WeightLayout& layout() const override { return layout_; }
  double last_copy_s() const { return last_copy_s_; }  // the last publish's copy (device synchronised)

 private:
  Engine& engine_;
  dist::WeightLayout layout_;
  double last_copy_s_ = 0;
};

// DeviceTurns' on_switch for a colocated engine: its KV pool is released when training takes
// the device and allocated again when generation takes it back.
std::function<void(DeviceTurns::Use)> kv_handover(Engine& engine);

}  // namespace rlx::rollout
