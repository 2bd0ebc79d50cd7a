// The learner process's memory plan (launch/memory_plan.hpp).
#include "rlx/launch/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx::launch {

namespace {

int64_t dtype_bytes(DType d) { return d == DType::float32 ? 4 : 2; }
double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

// Activations kept for backward by one micro-batch of `tokens` (an estimate, in bytes): per
// layer and token the block's saved inputs and outputs (norm inputs, q/k/v, attention output,
// the MLP's gate, up and product), the attention probabilities of a padded row (the mask
// path), and the log-prob head's one chunk of logits
// in the compute dtype plus its fp32 work. With activation checkpointing a block keeps only
// its input, and one block's activations exist at a time.
int64_t activation_bytes(const RunConfig& cfg, const ModelConfig& m) {
  const int64_t b = dtype_bytes(cfg.learner.compute_dtype);
  const int64_t tokens = cfg.learner.micro_batch_tokens;
  const int64_t row = std::min(cfg.learner.row_tokens, tokens);
  const int64_t qkv = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim;
  // The mask path keeps each row's attention probabilities (CPU, or fp32 on CUDA); varlen
  // flash attention (CUDA, bf16/fp16) keeps only a log-sum-exp per head and token.
  const bool flash = cfg.model.device.starts_with("cuda") && cfg.learner.compute_dtype != DType::float32;
  // A sparse layer keeps, per token, each of its k experts' gathered input and SwiGLU
  // activations, and the router's fp32 probabilities.
  const int64_t mlp = m.num_experts > 0
                          ? m.num_experts_per_tok * (m.hidden_size + 3 * m.moe_intermediate_size) * b + m.num_experts * 4
                          : 3 * m.intermediate_size * b;
  const int64_t per_token_layer = (4 * m.hidden_size + qkv + m.num_heads * m.head_dim) * b + mlp +
                                  m.num_heads * (flash ? 4 : row * 4);
  const int64_t blocks = cfg.learner.activation_checkpointing
                             ? tokens * m.hidden_size * b * m.num_layers + tokens * per_token_layer
                             : tokens * per_token_layer * m.num_layers;
  const int64_t chunk = std::min<int64_t>(tokens, 1024);  // LearnerOptions::logprob_chunk_tokens
  return blocks + chunk * m.vocab_size * (b + 4);
}

}  // namespace

namespace {
// A target projection's [in, out] in layer `l` (an expert's, in a sparse layer).
std::pair<int64_t, int64_t> target_shape(const ModelConfig& m, const std::string& t, int64_t l) {
  const int64_t h = m.hidden_size, q = m.num_heads * m.head_dim, kv = m.num_kv_heads * m.head_dim,
                i = m.is_sparse(l) ? m.moe_intermediate_size : m.intermediate_size;
  if (t == "q_proj") return {h, q};
  if (t == "k_proj" || t == "v_proj") return {h, kv};
  if (t == "o_proj") return {q, h};
  if (t == "down_proj") return {i, h};
  return {h, i};  // gate_proj, up_proj
}

// Calls f(in, out) for every projection `lora` targets, in every layer (each expert's in a
// sparse layer).
template <class F>
void for_each_target(const ModelConfig& m, const LoraSpec& lora, F f) {
  if (!lora.enabled()) return;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    for (const auto& t : lora.targets) {
      const auto [in, out] = target_shape(m, t, l);
      const bool expert = m.is_sparse(l) && t != "q_proj" && t != "k_proj" && t != "v_proj" && t != "o_proj";
      for (int64_t e = 0; e < (expert ? m.num_experts : 1); ++e) f(in, out);
    }
  }
}

// Weights of the projections `lora` targets (what a merging engine keeps a base copy of).
int64_t lora_target_weights(const ModelConfig& m, const LoraSpec& lora) {
  int64_t n = 0;
  for_each_target(m, lora, [&](int64_t in, int64_t out) { n += in * out; });
  return n;
}
}  // namespace

int64_t lora_parameter_count(const ModelConfig& m, const LoraSpec& lora) {
  int64_t n = 0;
  for_each_target(m, lora, [&](int64_t in, int64_t out) { n += lora.rank * (in + out); });  // A [rank, in], B [out, rank]
  return n;
}

int64_t MemoryPlan::train_bytes() const {
  int64_t s = 0;
  for (const auto& i : items) s += i.train ? i.bytes : 0;
  return s;
}

int64_t MemoryPlan::generate_bytes() const {
  int64_t s = 0;
  for (const auto& i : items) s += i.generate ? i.bytes : 0;
  return s;
}

int64_t MemoryPlan::peak_bytes() const { return colocated ? std::max(train_bytes(), generate_bytes()) : train_bytes(); }

std::string MemoryPlan::describe() const {
  std::string out;
  for (const auto& i : items) {
    const char* when = !colocated ? "" : i.train && i.generate ? "  (both phases)" : i.train ? "  (training only)" : "  (generation only)";
    out += fmt::format("  {:<34} {:>10.1f} MiB{}\n", i.name, mib(i.bytes), when);
  }
  if (colocated)
    out += fmt::format("  training phase {:.1f} MiB, generation phase {:.1f} MiB, peak {:.1f} MiB\n", mib(train_bytes()),
                       mib(generate_bytes()), mib(peak_bytes()));
  else
    out += fmt::format("  peak {:.1f} MiB\n", mib(peak_bytes()));
  return out;
}

void MemoryPlan::check(int64_t free_bytes, const std::string& device) const {
  if (free_bytes < 0 || peak_bytes() <= free_bytes) return;
  const bool train_phase = !colocated || train_bytes() >= generate_bytes();
  std::vector<const MemoryItem*> phase;
  for (const auto& i : items)
    if (train_phase ? i.train : i.generate) phase.push_back(&i);
  std::sort(phase.begin(), phase.end(), [](auto* a, auto* b) { return a->bytes > b->bytes; });
  std::string largest;
  for (size_t k = 0; k < phase.size() && k < 3; ++k)
    largest += fmt::format("{}{} {:.1f} MiB{}", k ? ", " : "", phase[k]->name, mib(phase[k]->bytes),
                           phase[k]->key.empty() ? "" : fmt::format(" ({})", phase[k]->key));
  throw FatalError(fmt::format("memory plan: the {} needs {:.1f} MiB on {}, which has {:.1f} MiB free; largest: {}",
                               colocated ? (train_phase ? "training phase" : "generation phase") : "learner",
                               mib(peak_bytes()), device, mib(free_bytes), largest));
}

MemoryPlan plan_memory(const RunConfig& cfg, const ModelConfig& m, int64_t parameters, int64_t kv_pool_bytes,
                       bool reference, bool critic, int64_t teacher_parameters,
                       int64_t validation_kv_pool_bytes) {
  MemoryPlan p;
  p.colocated = cfg.train.placement == Placement::colocated;
  // Colocated async: generation and training overlap, so the KV pool and the activations
  // are resident together (one phase).
  const bool overlap = p.colocated && cfg.train.mode == TrainMode::async;
  const int64_t n = parameters;
  const int64_t compute = dtype_bytes(cfg.learner.compute_dtype);
  const auto& lora = cfg.model.lora;
  // What is trained: every weight, or with LoRA only the adapters (the base frozen in the
  // compute dtype, and KL's reference is that base: no copy).
  const int64_t t = lora.enabled() ? lora_parameter_count(m, lora) : n;
  if (lora.enabled()) {
    p.items.push_back({.name = "base weights (frozen)", .bytes = compute * n, .key = "learner.compute_dtype"});
    p.items.push_back({.name = "LoRA adapters (fp32 masters)", .bytes = 4 * t, .key = "model.lora.rank"});
  } else {
    p.items.push_back({.name = "weights (fp32 masters)", .bytes = 4 * n});
    if (compute != 4) p.items.push_back({.name = "weights (compute-dtype cast)", .bytes = compute * n, .generate = false});
  }
  p.items.push_back({.name = "gradients (fp32)", .bytes = 4 * t});
  p.items.push_back({.name = "optimizer state (AdamW, fp32)", .bytes = 8 * t});
  p.items.push_back({.name = "activations (estimate)", .bytes = activation_bytes(cfg, m), .generate = overlap,
                     .key = "learner.micro_batch_tokens"});
  if (reference && !lora.enabled()) p.items.push_back({.name = "reference model", .bytes = compute * n, .generate = false});
  if (critic)
    p.items.push_back({.name = "critic (weights, grads, AdamW)",
                       .bytes = lora.enabled() ? compute * n + 16 * t : 16 * n,
                       .key = "algorithm.critic"});
  if (teacher_parameters > 0)
    p.items.push_back({.name = "teacher model", .bytes = compute * teacher_parameters, .generate = false,
                       .key = "algorithm.teacher"});
  // An engine's weights and, with LoRA, its adapters (and with merging a copy of the targets'
  // base weights): resident in both phases.
  auto engine = [&](const std::string& who, const std::string& weights_key) {
    p.items.push_back({.name = who + " weights", .bytes = dtype_bytes(cfg.model.dtype) * n, .key = weights_key});
    if (!lora.enabled()) return;
    const int64_t base_copy = cfg.rollout.lora_merged ? lora_target_weights(m, lora) : 0;
    p.items.push_back({.name = who + " LoRA + base copy", .bytes = dtype_bytes(cfg.model.dtype) * (t + base_copy),
                       .key = "rollout.lora_merged"});
  };
  if (p.colocated) {
    engine("rollout engine", "model.dtype");
    p.items.push_back({.name = "rollout KV pool", .bytes = kv_pool_bytes, .train = overlap, .key = "rollout.kv_cache_blocks"});
  }
  // Learner rank 0's validation engine: its pool is allocated only while it validates, which
  // happens between steps with the learner holding the device (the training phase).
  if (validation_kv_pool_bytes > 0) {
    engine("validation engine", "validation.every_steps");
    p.items.push_back({.name = "validation KV pool", .bytes = validation_kv_pool_bytes, .generate = false,
                       .key = "validation.kv_cache_blocks"});
  }
  return p;
}

int64_t free_memory_bytes(const std::string& device) {
  const at::Device d(device);
  if (d.is_cuda()) return compat::device_free_bytes(d);
  int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kb = 0;
    meminfo >> kb;
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  // A cgroup (v2) limit below that: what is left of it.
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  int64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    try {
      const int64_t left = std::stoll(max_text) - current;
      if (available < 0 || left < available) available = std::max<int64_t>(0, left);
    } catch (const std::exception&) {
    }
  }
  return available;
}

}  // namespace rlx::launch
