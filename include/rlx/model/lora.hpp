// LoRA adapters (Hu et al. 2021) on a transformer's linear layers: a target projection
// y = W x + b becomes y = W x + b + (alpha / rank) * B (A dropout(x)), with A [rank, in]
// and B [out, rank]; only A and B are trained. Names and layout follow PEFT's, so an
// adapter exports as `adapter_config.json` + `adapter_model.safetensors`:
//   model.layers.0.self_attn.q_proj.lora_A.weight   [rank, hidden]
//   model.layers.0.self_attn.q_proj.lora_B.weight   [q_out, rank]
//
// The spec is the run config's `model.lora` section (torch-free); a rank of 0 means no
// adapters. The learner trains them unmerged (the base weights frozen; with the adapters
// switched off the same weights are the KL reference); a rollout engine keeps its base
// weights and merges W + scale * B A into the weights it serves on every update.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"

namespace rlx {

// The projections an adapter may target, by their HF (and PEFT) module names.
inline constexpr std::array<std::string_view, 7> kLoraTargets{"q_proj", "k_proj", "v_proj", "o_proj",
                                                              "gate_proj", "up_proj", "down_proj"};

struct LoraSpec {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16;
  double dropout = 0;
  std::vector<std::string> targets{kLoraTargets.begin(), kLoraTargets.end()};

  bool enabled() const { return rank > 0; }
  double scale() const { return rank > 0 ? alpha / static_cast<double>(rank) : 0.0; }

  template <class V>
  void visit(V& v) {
    v("rank", rank, "LoRA rank; 0: train every weight (no adapters)", config::in_range(0, 4096));
    v("alpha", alpha, "LoRA alpha: the adapter's update is scaled by alpha / rank", config::greater_than(0));
    v("dropout", dropout, "dropout on an adapter's input while training", config::in_range(0, 0.9));
    v("targets", targets, "projections given adapters: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
  }
  void validate() const {
    RLX_CHECK(!enabled() || !targets.empty(), "model.lora.targets: a LoRA rank of {} needs at least one target", rank);
    for (size_t i = 0; i < targets.size(); ++i) {
      const auto& t = targets[i];
      RLX_CHECK(std::find(kLoraTargets.begin(), kLoraTargets.end(), t) != kLoraTargets.end(),
                "model.lora.targets[{}]: {:?} is not a projection of the model (q_proj, k_proj, v_proj, o_proj, "
                "gate_proj, up_proj, down_proj)",
                i, t);
      RLX_CHECK(std::find(targets.begin(), targets.begin() + static_cast<std::ptrdiff_t>(i), t) ==
                    targets.begin() + static_cast<std::ptrdiff_t>(i),
                "model.lora.targets[{}]: {:?} is listed twice", i, t);
    }
  }
  bool operator==(const LoraSpec&) const = default;
};

// Whether an HF parameter name is an adapter's ("...q_proj.lora_A.weight").
inline bool is_lora_parameter(std::string_view name) {
  return name.find(".lora_A.") != std::string_view::npos || name.find(".lora_B.") != std::string_view::npos;
}

}  // namespace rlx
