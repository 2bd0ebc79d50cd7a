// Colocated weight sync and KV-pool hand-over (rl/colocated.hpp).
#include "rlx/rl/colocated.hpp"

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx::rl {

ColocatedWeights::ColocatedWeights(Engine& engine, dist::WeightLayout layout, bool staged)
    : engine_(engine), layout_(std::move(layout)), staged_(staged) {}

int64_t ColocatedWeights::publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  layout_.check(tensors);
  // The learner's gather of these tensors may still be queued: not the copy's time.
  if (!tensors.empty()) compat::synchronize(tensors.front().second.device());
  const double t0 = now_s();
  int64_t bytes = 0;
  if (staged_) {
    auto snap = std::make_shared<Snapshot>();
    snap->version = version;
    for (const auto& [name, t] : tensors) {
      snap->tensors.emplace_back(name, t.detach().to(t.device(), layout_.dtype, /*non_blocking=*/false, /*copy=*/true));
      bytes += snap->tensors.back().second.numel() * static_cast<int64_t>(snap->tensors.back().second.element_size());
    }
    std::lock_guard lock(mu_);
    RLX_CHECK(!pending_ || version > pending_->version, "colocated weights: version {} after {}", version, pending_->version);
    pending_ = std::move(snap);  // an older one not yet taken is dropped
  } else {
    bytes = engine_.load_weights(version, tensors);
  }
  if (!tensors.empty()) compat::synchronize(tensors.front().second.device());  // the copy is done when we say so
  last_copy_s_ = now_s() - t0;
  return bytes;
}

std::optional<dist::WeightUpdate> ColocatedWeights::poll() {
  std::lock_guard lock(mu_);
  if (!pending_) return std::nullopt;
  held_ = std::move(pending_);
  return dist::WeightUpdate{.version = held_->version, .tensors = held_->tensors};
}

std::function<void(DeviceTurns::Use)> kv_handover(Engine& engine) {
  return [&engine](DeviceTurns::Use to) {
    if (to == DeviceTurns::Use::train) engine.sleep();
    else engine.wake();
  };
}

}  // namespace rlx::rl
