// ModelConfig: the shape of a decoder-only transformer of the Llama / Qwen2 family,
// with named presets from `tiny` (a few hundred thousand parameters, for the
// 2-core CPU) to 0.5B-class shapes.
//
//   auto cfg = rlx::model_preset("qwen2.5-0.5b", rlx::Arch::qwen2);
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

enum class Arch { llama, qwen2 };
constexpr std::array<std::pair<Arch, std::string_view>, 2> enum_names(Arch) {
  return {{{Arch::llama, "llama"}, {Arch::qwen2, "qwen2"}}};
}

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
  bool tie_word_embeddings = true;       // LM head shares the embedding matrix
  double initializer_range = 0.02;       // std of the normal initialisation
  int64_t bos_token_id = -1;             // -1: none
  int64_t eos_token_id = -1;             // -1: none

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
  }
  // Every field within its bounds, the cross-field checks and a parameter count of at most
  // kMaxParameters, before anything is allocated; throws rlx::Error naming the fields.
  void validate() const;
  static constexpr double kMaxParameters = 2e12;
  int64_t num_parameters() const;
  bool operator==(const ModelConfig&) const = default;
};

// Named shapes. `arch` sets the family defaults (qwen2: q/k/v bias).
ModelConfig model_preset(std::string_view name, Arch arch = Arch::llama);
std::vector<std::string> model_preset_names();

}  // namespace rlx
