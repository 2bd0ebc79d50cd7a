// Decoder-only transformer of the Llama family (Llama, Qwen2, Qwen3, Mistral) and its
// mixtures of experts (Qwen3-MoE, Mixtral): RMSNorm, rotary embeddings (with linear and
// llama3 scaling), grouped-query attention with an optional per-head q/k norm, SwiGLU MLPs
// or sparse layers of SwiGLU experts (model/moe.hpp), optional q/k/v, output and MLP biases,
// tied or untied embeddings; fp32, bf16 or fp16.
//
// Two paths share the weights and the code: the full-sequence forward (training;
// padding and packing through ForwardInput::segments) and the incremental forward
// through a KVCache (generation). Parameter names are HF's
// ("model.layers.0.self_attn.q_proj.weight"), so checkpoints map one to one.
//
//   auto model = std::make_shared<rlx::Transformer>(rlx::model_preset("tiny"));
//   model->init_weights(/*seed=*/0);
//   at::Tensor logits = model->forward({.tokens = ids});     // [B, T, vocab]
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rlx/model/config.hpp"
#include "rlx/model/kv_cache.hpp"
#include "rlx/model/lora.hpp"
#include "rlx/model/moe.hpp"
#include "rlx/model/varlen_attention.hpp"

namespace rlx {

at::ScalarType to_scalar_type(DType dtype);
DType dtype_from_scalar_type(at::ScalarType t);

// cos and sin tables for RoPE at the given positions: [B, T, head_dim] in fp32.
std::pair<at::Tensor, at::Tensor> rope_tables(const ModelConfig& cfg, const at::Tensor& inv_freq,
                                              const at::Tensor& positions);
// The (scaled) inverse frequencies [head_dim / 2] in fp32.
at::Tensor rope_inv_freq(const ModelConfig& cfg);

// What every layer of one forward call shares: the tokens on the model's device, the
// RoPE tables, and how the full-sequence path attends (undefined with a cache): its
// sequences for varlen flash attention where the device has it, else the mask.
struct ForwardState {
  at::Tensor tokens, mask;
  // RoPE's tables [B, T, D] in the model's dtype. With a KV cache they are made on first use
  // from `positions` (Transformer::rope_of): a cache that rotates in its own kernel needs none.
  mutable at::Tensor cos, sin;
  at::Tensor positions;
  VarlenSeqs varlen;
  int64_t batch = 0, time = 0;
  KVCache* cache = nullptr;
  // Inference on CUDA: a layer's MLP output not yet added to its residual stream; the next
  // layer's input norm (or the final norm) adds it in the same kernel as its RMSNorm.
  mutable at::Tensor pending;
  // Trained LoRA adapters with dropout: the key of this forward's dropout masks (a block
  // recomputed in backward draws the same ones).
  uint64_t lora_key = 0;
  bool train = false;  // begun with gradients on: adapter dropout applies
  // Mixture of experts: ForwardInput's routing on the device, [B, T, S, k] int64; which of
  // the B * T tokens are not padding ([B * T] bool; undefined: all); where routing goes.
  at::Tensor routing, valid;
  RoutingTrace* trace = nullptr;
};

// How a model carries LoRA adapters (model/lora.hpp).
enum class LoraMode {
  unmerged,  // forward adds scale * B A x to each target (the learner, or an engine; switchable off)
  merged,    // the served weights are base + scale * B A, made again by merge_lora() (an engine)
};

// PEFT's initialisation of adapters given by name (model/lora.hpp's names): each lora_A
// Kaiming-uniform (bound 1 / sqrt(in)) from rlx's generator keyed by the seed and the name
// (the same values on any machine and rank count), each lora_B zero.
void init_lora_weights(const std::vector<std::pair<std::string, at::Tensor>>& adapters, uint64_t seed);

namespace detail {
struct Attention;
struct Body;
struct Block;
struct Projection;
}  // namespace detail

class Transformer : public torch::nn::Module {
 public:
  // Parameters are allocated uninitialised; call init_weights() or load weights.
  explicit Transformer(const ModelConfig& cfg, at::ScalarType dtype = at::kFloat, at::Device device = at::kCPU);

  const ModelConfig& config() const { return cfg_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

  // Hidden states after the final norm: [B, T, hidden_size].
  at::Tensor forward_hidden(const ForwardInput& in, KVCache* cache = nullptr);
  // LM-head logits for hidden states [..., hidden_size] -> [..., vocab_size], in the model's dtype.
  at::Tensor logits(const at::Tensor& hidden);
  at::Tensor forward(const ForwardInput& in, KVCache* cache = nullptr) { return logits(forward_hidden(in, cache)); }
  // The weight logits() multiplies by, [vocab_size, hidden_size] (the embedding when tied).
  const at::Tensor& lm_head_weight() const;

  // forward_hidden in its steps, for callers that run the layers one at a time (the
  // sharded learner gathers each layer's weights just before it runs):
  //   auto st = begin_forward(in, cache); auto h = embed(st);
  //   for (l ...) h = layer(l, h, st);    h = end_forward(h, st);
  ForwardState begin_forward(const ForwardInput& in, KVCache* cache = nullptr);
  at::Tensor embed(const ForwardState& st);
  at::Tensor layer(int64_t index, const at::Tensor& h, const ForwardState& st);
  at::Tensor end_forward(const at::Tensor& h, const ForwardState& st);

  // HF's initialisation (weights ~ N(0, initializer_range), norms 1, biases 0), drawn from
  // rlx's counter-based generator per parameter name: the same seed gives the same
  // weights on every machine, device and LibTorch version. `on_device`: drawn by LibTorch
  // where the parameters are instead (seconds for a 30B shape on a GPU, where the host's
  // draws take minutes; the values depend on the device; for benchmarks).
  void init_weights(uint64_t seed, bool on_device = false);

  // Parameters by HF name, in a stable order (the tied LM head is not listed; nor are
  // LoRA adapters: lora_parameters()).
  std::vector<std::pair<std::string, at::Tensor>> hf_parameters() const;

  // LoRA: registers an adapter (A [rank, in], B [out, rank], both zero) on every projection
  // that `spec` targets. Once per model; merged keeps a copy of each target's weight.
  void add_lora(const LoraSpec& spec, LoraMode mode);
  bool lora_merged() const { return lora_.enabled() && lora_mode_ == LoraMode::merged; }
  const LoraSpec& lora() const { return lora_; }
  // The adapters' parameters by PEFT's names (without its "base_model.model." prefix), in
  // a stable order: each target's lora_A, then its lora_B.
  std::vector<std::pair<std::string, at::Tensor>> lora_parameters() const;
  // What a weight update carries: the adapters when the model has them, else hf_parameters().
  std::vector<std::pair<std::string, at::Tensor>> sync_parameters() const;
  // PEFT's initialisation: A Kaiming-uniform (bound 1 / sqrt(in)), drawn from rlx's
  // generator per name; B zero (so the adapted model starts as the base).
  void init_lora(uint64_t seed);
  // Unmerged mode: whether forward adds the adapters (off: the base model, KL's reference).
  void set_lora_active(bool on) { lora_active_ = on; }
  // The seed of the adapters' dropout masks while training (with the forward's key).
  void set_lora_dropout_seed(uint64_t seed) { lora_seed_ = seed, lora_forwards_ = 0; }
  // Merged mode: each target's served weight becomes base + scale * B A (one addmm into
  // it) from the adapters' current values. Returns the bytes of weights written.
  int64_t merge_lora();

  // For inference (the rollout engine): each layer's q/k/v and gate/up weights (and
  // biases) become one tensor each, and the parameters views of it, so that forwards
  // without autograd run one GEMM where there were three and two (and, on CUDA, the fused
  // SiLU-mul and add + RMSNorm kernels), and copying into a parameter (a weight update)
  // updates the fused tensor. Forwards with autograd keep the separate GEMMs. A model whose
  // parameters something else re-points (the sharded learner) must not be fused.
  void fuse_projections();
  bool fused() const { return fused_; }

  // Mixture of experts: each expert over its own rows (grouped; the CPU, training and
  // prefill) or every expert over every row (dense; CUDA decode, which a graph captures).
  // Tests force one to compare them.
  void set_moe_strategy(MoeStrategy s) { moe_strategy_ = s; }

 private:
  at::Tensor fused_layer(const detail::Block& blk, int64_t index, const at::Tensor& h, const ForwardState& st);
  // Unmerged mode: `y` (the joined outputs of `projections`, in that order) plus the
  // adapters' updates of those that have one, from their shared input `x`.
  at::Tensor with_lora(const at::Tensor& y, std::initializer_list<const detail::Projection*> projections,
                       const at::Tensor& x, const ForwardState& st, uint64_t site) const;
  void begin_routing(const ForwardInput& in, ForwardState& st) const;
  const ForwardState& rope_of(const ForwardState& st) const;  // st, its RoPE tables made
  at::Tensor sparse_mlp(const detail::Block& blk, const at::Tensor& x, const ForwardState& st, uint64_t site) const;
  at::Tensor qk_normed(const detail::Attention& att, const at::Tensor& qkv, const ForwardState& st) const;
  bool lora_on() const { return lora_.enabled() && lora_mode_ == LoraMode::unmerged && lora_active_; }

  ModelConfig cfg_;
  at::ScalarType dtype_;
  at::Device device_;
  std::shared_ptr<detail::Body> body_;
  std::shared_ptr<detail::Projection> lm_head_;  // null when tied
  at::Tensor inv_freq_;                          // fp32 [head_dim / 2], a buffer
  bool fused_ = false;
  MoeStrategy moe_strategy_{};  // automatic
  LoraSpec lora_{.rank = 0};
  LoraMode lora_mode_ = LoraMode::unmerged;
  bool lora_active_ = true;
  uint64_t lora_seed_ = 0, lora_forwards_ = 0;  // dropout: the seed, and forwards since it was set
};

}  // namespace rlx
