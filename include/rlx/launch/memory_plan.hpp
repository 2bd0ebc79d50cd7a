// The memory plan of a run's learner process: what its weights, gradients, optimizer state,
// activations and (colocated) the rollout engine's weights and KV pool take on its device,
// per phase, checked against what the device has free before the first step. A colocated
// run releases the KV pool while the learner trains, so its peak is the larger phase, not
// the sum.
//
//   auto plan = rlx::launch::plan_memory(cfg, model_config, params, /*kv_pool_bytes=*/engine.kv_pool_bytes());
//   std::cerr << plan.describe();
//   plan.check(free_bytes, "cuda:0");   // throws a FatalError naming what does not fit, and the keys to lower
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rlx/launch/config.hpp"
#include "rlx/model/config.hpp"

namespace rlx::launch {

struct MemoryItem {
  std::string name;         // "weights (fp32 masters)", "KV pool", ...
  int64_t bytes = 0;
  bool train = true;        // resident while the learner trains
  bool generate = true;     // resident while the engine generates (colocated)
  std::string key;          // the config key that sizes it ("" when none)
};

struct MemoryPlan {
  std::vector<MemoryItem> items;
  bool colocated = false;
  int64_t train_bytes() const;     // sum of items resident while training
  int64_t generate_bytes() const;  // ... while generating (colocated)
  int64_t peak_bytes() const;      // the larger phase
  // One line per item and the phases' totals, in MiB.
  std::string describe() const;
  // Throws a FatalError when the peak exceeds `free_bytes` (no check when free_bytes < 0),
  // naming the device, the phase, its largest items and the keys that size them.
  void check(int64_t free_bytes, const std::string& device) const;
};

// Parameters of the adapters `lora` puts on a model of shape `model` (0 without).
int64_t lora_parameter_count(const ModelConfig& model, const LoraSpec& lora);

// `parameters`: the policy's parameter count; `kv_pool_bytes`: the colocated engine's pool
// (0 for a split run); `validation_kv_pool_bytes`: learner rank 0's validation engine's pool
// (validation.every_steps > 0; 0 on other ranks and without validation), which brings that
// engine's weights with it. Activations are an estimate from learner.micro_batch_tokens,
// learner.row_tokens, the model's widths and learner.activation_checkpointing.
MemoryPlan plan_memory(const RunConfig& cfg, const ModelConfig& model, int64_t parameters, int64_t kv_pool_bytes,
                       bool reference, bool critic, int64_t teacher_parameters = 0,
                       int64_t validation_kv_pool_bytes = 0);

// Bytes this process can still allocate on `device` ("cpu", "cuda:N"): the CUDA device's free
// memory (with LibTorch's unused reserve), or on the CPU the host's available memory
// (MemAvailable, within a cgroup's limit); -1 when unknown.
int64_t free_memory_bytes(const std::string& device);

}  // namespace rlx::launch
