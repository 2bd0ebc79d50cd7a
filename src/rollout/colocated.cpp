// Colocated weight sync and KV-pool hand-over (rollout/colocated.hpp).
#include "rlx/rollout/colocated.hpp"

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx::rollout {

ColocatedWeights::ColocatedWeights(Engine& engine, dist::WeightLayout layout)
    : engine_(engine), layout_(std::move(layout)) {}

int64_t ColocatedWeights::publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  layout_.check(tensors);
  const double t0 = now_s();
  const int64_t bytes = engine_.load_weights(version, tensors);
  if (!tensors.empty()) compat::synchronize(tensors.front().second.device());  // the copy is done when we say so
  last_copy_s_ = now_s() - t0;
  return bytes;
}

std::function<void(DeviceTurns::Use)> kv_handover(Engine& engine) {
  return [&engine](DeviceTurns::Use to) {
    if (to == DeviceTurns::Use::train) engine.sleep();
    else engine.wake();
  };
}

}  // namespace rlx::rollout
