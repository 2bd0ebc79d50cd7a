// Weight sync for a colocated run (train.placement = colocated): the learner and a rollout
// engine in one process on one device. A version goes straight into the engine's weights
// with one copy (the learner's compute-dtype tensors into the engine's own, fused, buffers;
// no staging, no shared memory, no socket), so a sync is that copy plus a version bump. The
// engine must be idle while it happens: the learner publishes while it holds the device's
// train turn (core/device_turns.hpp), which the rollout worker needs to generate.
//
//   rlx::DeviceTurns turns({.on_switch = rlx::rl::kv_handover(engine)});
//   rlx::rl::ColocatedWeights weights(engine, layout);
//   rlx::LearnerLoop loop(..., {..., .publisher = &weights, .turns = &turns});   // learner thread
//   rlx::rl::Worker worker({..., .turns = &turns}, engine, envs, client, weights);  // worker thread
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "rlx/core/device_turns.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/rollout/engine.hpp"

namespace rlx::rl {

class ColocatedWeights final : public dist::WeightPublisher, public dist::WeightSubscriber {
 public:
  // `staged`: the engine may be generating when a version is published (generation and
  // training overlap, no device turns): publish() then copies the version aside and the
  // worker's poll() hands it out, to be loaded between grants (two copies). Otherwise the
  // engine is idle at every publish (the learner holds the device's train turn) and the
  // version goes straight into the engine (one copy).
  ColocatedWeights(Engine& engine, dist::WeightLayout layout, bool staged = false);
  // Returns the bytes copied.
  int64_t publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  // The engine's version.
  int64_t version() const override { return engine_.weight_version(); }
  // Staged: the newest version published and not yet handed out (valid until the next
  // poll); otherwise nothing: publish() already put the weights in the engine.
  std::optional<dist::WeightUpdate> poll() override;
  const dist::WeightLayout& layout() const override { return layout_; }
  double last_copy_s() const { return last_copy_s_; }  // the last publish's copy (device synchronised)

 private:
  struct Snapshot {
    int64_t version = 0;
    std::vector<std::pair<std::string, at::Tensor>> tensors;
  };
  Engine& engine_;
  dist::WeightLayout layout_;
  bool staged_;
  double last_copy_s_ = 0;
  std::mutex mu_;
  std::shared_ptr<Snapshot> pending_;  // staged: published, not yet handed out
  std::shared_ptr<Snapshot> held_;     // staged: handed out by the last poll (its views stay valid)
};

// DeviceTurns' on_switch for a colocated engine: its KV pool is released when training takes
// the device and allocated again when generation takes it back.
std::function<void(DeviceTurns::Use)> kv_handover(Engine& engine);

}  // namespace rlx::rl
