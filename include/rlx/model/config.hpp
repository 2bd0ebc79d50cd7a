// ModelConfig: the shape of a decoder-only transformer of the Llama family (Llama, Qwen2,
// Qwen3, Mistral) or a mixture of experts (Qwen3-MoE, Mixtral), with named presets from
// `tiny` (a few hundred thousand parameters, for the 2-core CPU) to the published shapes.
//
//   auto cfg = rlx::model_preset("qwen3-0.6b");              // the preset names its family
//   auto moe = rlx::model_preset("tiny-moe");                 // 8 experts, top 2
//   fmt::print("{} parameters\n", cfg.num_parameters());
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlx/core/config.hpp"

namespace rlx {

// The families HF's `model_type` names. They differ in biases, a per-head norm of q and k
// (Qwen3), and sparse MLPs with their own tensor names (Qwen3-MoE's `mlp.experts.N.gate_proj`,
// Mixtral's `block_sparse_moe.experts.N.w1`).
enum class Arch { llama, qwen2, qwen3, mistral, qwen3_moe, mixtral };
constexpr std::array<std::pair<Arch, std::string_view>, 6> enum_names(Arch) {
  return {{{Arch::llama, "llama"},
           {Arch::qwen2, "qwen2"},
           {Arch::qwen3, "qwen3"},
           {Arch::mistral, "mistral"},
           {Arch::qwen3_moe, "qwen3_moe"},
           {Arch::mixtral, "mixtral"}}};
}
// Whether the family's checkpoints have sparse (mixture-of-experts) layers.
constexpr bool is_moe(Arch a) { return a == Arch::qwen3_moe || a == Arch::mixtral; }

enum class RopeType { none, linear, llama3 };
constexpr std::array<std::pair<RopeType, std::string_view>, 3> enum_names(RopeType) {
  return {{{RopeType::none, "none"}, {RopeType::linear, "linear"}, {RopeType::llama3, "llama3"}}};
}

// Floating-point dtype of weights and activations.
enum class DType { float32, bfloat16, float16 };
constexpr std::array<std::pair<DType, std::string_view>, 3> enum_names(DType) {
  return {{{DType::float32, "float32"}, {DType::bfloat16, "bfloat16"}, {DType::float16, "float16"}}};
}

// RoPE frequency scaling, as in HF configs' `rope_scaling`.
struct RopeScaling {
  RopeType type = RopeType::none;
  double factor = 1.0;                              // linear and llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3

  template <class V>
  void visit(V& v) {
    v("type", type, "none, linear (positions / factor) or llama3 (Llama-3.1 wavelength-dependent scaling)");
    v("factor", factor, "scaling factor", config::greater_than(0));
    v("low_freq_factor", low_freq_factor, "llama3: low-frequency factor", config::greater_than(0));
    v("high_freq_factor", high_freq_factor, "llama3: high-frequency factor", config::greater_than(0));
    v("original_max_position_embeddings", original_max_position_embeddings, "llama3: context the model was trained with",
      config::at_least(1));
  }
  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  Arch arch = Arch::llama;
  int64_t vocab_size = 512;              // rows of the embedding and the LM head
  int64_t hidden_size = 64;              // model width
  int64_t intermediate_size = 176;       // SwiGLU width
  int64_t num_layers = 2;                // transformer blocks
  int64_t num_heads = 4;                 // query heads
  int64_t num_kv_heads = 2;              // key/value heads (grouped-query attention)
  int64_t head_dim = 16;                 // per-head width
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;                 // bias on q/k/v projections (Qwen2: true)
  bool o_bias = false;                   // bias on the output projection
  bool mlp_bias = false;                 // bias on the MLP projections
  bool qk_norm = false;                  // RMSNorm over each head of q and k before RoPE (Qwen3)
  bool tie_word_embeddings = true;       // LM head shares the embedding matrix
  double initializer_range = 0.02;       // std of the normal initialisation
  int64_t bos_token_id = -1;             // -1: none
  int64_t eos_token_id = -1;             // -1: none
  // Mixture of experts: a sparse layer's MLP is `num_experts` SwiGLU experts of width
  // moe_intermediate_size, of which a router picks num_experts_per_tok per token (dropless).
  int64_t num_experts = 0;               // 0: every layer dense
  int64_t num_experts_per_tok = 2;       // top-k
  int64_t moe_intermediate_size = 0;     // each expert's SwiGLU width
  bool norm_topk_prob = true;            // the top-k gate weights renormalised to sum to 1
  int64_t decoder_sparse_step = 1;       // layer l is sparse when (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and l is not listed here
  double router_aux_loss_coef = 0.0;     // the checkpoint's own (kept on save); training's is learner.router_aux_loss_coef

  template <class V>
  void visit(V& v) {
    v("arch", arch, "architecture family: llama or qwen2");
    v("vocab_size", vocab_size, "vocabulary size", config::in_range(1, 1 << 24));
    v("hidden_size", hidden_size, "model width", config::in_range(1, 1 << 17));
    v("intermediate_size", intermediate_size, "SwiGLU MLP width", config::in_range(1, 1 << 20));
    v("num_layers", num_layers, "transformer blocks", config::in_range(1, 1024));
    v("num_heads", num_heads, "query heads", config::in_range(1, 1024));
    v("num_kv_heads", num_kv_heads, "key/value heads; divides num_heads", config::in_range(1, 1024));
    v("head_dim", head_dim, "per-head width (even, for RoPE)", config::in_range(2, 4096));
    v("max_position_embeddings", max_position_embeddings, "longest context", config::in_range(1, 1 << 24));
    v("rms_norm_eps", rms_norm_eps, "RMSNorm epsilon", config::in_half_open(0, 1));
    v("rope_theta", rope_theta, "RoPE base", config::greater_than(0));
    v("rope_scaling", rope_scaling, "RoPE scaling");
    v("qkv_bias", qkv_bias, "bias on q/k/v projections");
    v("o_bias", o_bias, "bias on the attention output projection");
    v("mlp_bias", mlp_bias, "bias on the MLP projections");
    v("tie_word_embeddings", tie_word_embeddings, "LM head shares the embedding matrix");
    v("initializer_range", initializer_range, "std of the normal weight initialisation", config::in_range(0, 100));
    v("bos_token_id", bos_token_id, "beginning-of-sequence token (-1: none)", config::in_range(-1, 1 << 24));
    v("eos_token_id", eos_token_id, "end-of-sequence token (-1: none)", config::in_range(-1, 1 << 24));
    v("qk_norm", qk_norm, "RMSNorm over each head of q and k before RoPE (qwen3)");
    v("num_experts", num_experts, "experts of a sparse layer (0: dense model)", config::in_range(0, 4096));
    v("num_experts_per_tok", num_experts_per_tok, "experts each token uses (top-k)", config::in_range(1, 4096));
    v("moe_intermediate_size", moe_intermediate_size, "each expert's SwiGLU width", config::in_range(0, 1 << 20));
    v("norm_topk_prob", norm_topk_prob, "renormalise the top-k gate weights to sum to 1");
    v("decoder_sparse_step", decoder_sparse_step, "every step-th layer is sparse", config::in_range(1, 1024));
    v("mlp_only_layers", mlp_only_layers, "layers kept dense");
    v("router_aux_loss_coef", router_aux_loss_coef, "the checkpoint's load-balancing loss weight (kept on save)",
      config::in_range(0, 1e6));
  }
  // Whether layer `l`'s MLP is a mixture of experts, and the sparse layers in order (a
  // sparse layer's index among them is its routing slot: ForwardInput::routing).
  bool is_sparse(int64_t l) const;
  std::vector<int64_t> sparse_layers() const;
  // Parameters one token's forward uses (the top-k experts of each sparse layer, not all).
  int64_t num_active_parameters() const;
  // Every field within its bounds, the cross-field checks and a parameter count of at most
  // kMaxParameters, before anything is allocated; throws rlx::Error naming the fields.
  void validate() const;
  static constexpr double kMaxParameters = 2e12;
  int64_t num_parameters() const;
  bool operator==(const ModelConfig&) const = default;
};

// The defaults a family sets on a shape: q/k/v bias (qwen2), the q/k norm (qwen3,
// qwen3_moe). Mixture-of-experts fields are the shape's, not the family's.
void apply_family(ModelConfig& c, Arch arch);

// Named shapes. A preset of a named model (qwen3-0.6b, qwen3-30b-a3b, mixtral-8x7b, ...)
// has that model's family; the generic shapes (tiny, small, base, tiny-moe) take `arch`'s
// defaults, and tiny-moe with a dense `arch` becomes that family's sparse one.
ModelConfig model_preset(std::string_view name, Arch arch = Arch::llama);
std::vector<std::string> model_preset_names();

}  // namespace rlx
