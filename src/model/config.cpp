#include "rlx/model/config.hpp"

#include <algorithm>
#include <optional>

namespace rlx {

void ModelConfig::validate() const {
  config::check_bounds(*this, "model config");
  RLX_CHECK(num_heads % num_kv_heads == 0, "num_heads ({}) must be a multiple of num_kv_heads ({})", num_heads,
            num_kv_heads);
  RLX_CHECK(head_dim % 2 == 0, "head_dim ({}) must be even for rotary embeddings", head_dim);
  if (rope_scaling.type == RopeType::llama3)
    RLX_CHECK(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor,
              "rope_scaling.high_freq_factor ({}) must exceed low_freq_factor ({})", rope_scaling.high_freq_factor,
              rope_scaling.low_freq_factor);
  RLX_CHECK(bos_token_id < vocab_size && eos_token_id < vocab_size,
            "bos_token_id ({}) and eos_token_id ({}) must be below vocab_size ({})", bos_token_id, eos_token_id,
            vocab_size);
  RLX_CHECK(is_moe(arch) == (num_experts > 0), "arch {} {} experts, and num_experts is {}", config::enum_to_string(arch),
            is_moe(arch) ? "has" : "has no", num_experts);
  if (num_experts > 0) {
    RLX_CHECK(num_experts_per_tok <= num_experts, "num_experts_per_tok ({}) exceeds num_experts ({})",
              num_experts_per_tok, num_experts);
    RLX_CHECK(moe_intermediate_size > 0, "moe_intermediate_size must be set for {} experts", num_experts);
    RLX_CHECK(num_experts <= 65535, "num_experts ({}) above 65535: routing records hold expert ids in 16 bits",
              num_experts);
  }
  for (int64_t l : mlp_only_layers)
    RLX_CHECK(l >= 0 && l < num_layers, "mlp_only_layers holds {}, not a layer of {}", l, num_layers);
  // Counted in double: an int64 product of absurd sizes would wrap before any check.
  const double q = double(num_heads) * head_dim, kv = double(num_kv_heads) * head_dim, h = double(hidden_size);
  const double mlp = num_experts > 0 ? double(num_experts) * (3 * h * double(moe_intermediate_size) + h)
                                     : 3 * h * double(intermediate_size);
  const double block = h * (2 * q + 2 * kv) + mlp + 2 * h;
  const double total = double(vocab_size) * h * (tie_word_embeddings ? 1 : 2) + double(num_layers) * block;
  RLX_CHECK(total <= kMaxParameters,
            "about {:.3g} parameters (vocab_size {}, hidden_size {}, intermediate_size {}, num_layers {}, heads {}x{}, "
            "experts {}): more than the {:.0g} rlx builds",
            total, vocab_size, hidden_size, intermediate_size, num_layers, num_heads, head_dim, num_experts,
            kMaxParameters);
}

bool ModelConfig::is_sparse(int64_t l) const {
  if (num_experts == 0 || (l + 1) % decoder_sparse_step != 0) return false;
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), l) == mlp_only_layers.end();
}

std::vector<int64_t> ModelConfig::sparse_layers() const {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < num_layers; ++l)
    if (is_sparse(l)) out.push_back(l);
  return out;
}

namespace {
// Parameters of the model, with `experts` of each sparse layer's experts counted.
int64_t count_parameters(const ModelConfig& c, int64_t experts) {
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim, h = c.hidden_size;
  int64_t attn = h * q + 2 * h * kv + q * h;
  if (c.qkv_bias) attn += q + 2 * kv;
  if (c.o_bias) attn += h;
  if (c.qk_norm) attn += 2 * c.head_dim;
  int64_t dense = 3 * h * c.intermediate_size;
  if (c.mlp_bias) dense += 2 * c.intermediate_size + h;
  const int64_t sparse = c.num_experts * h + experts * 3 * h * c.moe_intermediate_size;  // router + experts
  int64_t total = c.vocab_size * h + h;
  for (int64_t l = 0; l < c.num_layers; ++l) total += attn + (c.is_sparse(l) ? sparse : dense) + 2 * h;
  if (!c.tie_word_embeddings) total += c.vocab_size * h;
  return total;
}
}  // namespace

int64_t ModelConfig::num_parameters() const { return count_parameters(*this, num_experts); }
int64_t ModelConfig::num_active_parameters() const {
  return count_parameters(*this, num_experts > 0 ? num_experts_per_tok : 0);
}

void apply_family(ModelConfig& c, Arch arch) {
  c.arch = arch;
  c.qkv_bias = arch == Arch::qwen2;
  c.qk_norm = arch == Arch::qwen3 || arch == Arch::qwen3_moe;
}

namespace {
struct Preset {
  std::string_view name;
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos;
  double theta;
  bool tied;
  // A named model's family (its shape is that model's); nullopt: a generic shape.
  std::optional<Arch> arch = std::nullopt;
  int64_t experts = 0, top_k = 0, moe_inter = 0;
};
// Shapes, not weights: the named ones copy the published configs of those models.
constexpr Preset kPresets[] = {
    {"tiny", 512, 64, 176, 2, 4, 2, 16, 2048, 10000.0, true},                              // ~0.2M parameters
    {"small", 4096, 256, 704, 4, 8, 2, 32, 4096, 10000.0, true},                           // ~4M
    {"base", 32000, 768, 2048, 12, 12, 4, 64, 4096, 10000.0, true},                        // ~95M
    {"tiny-moe", 512, 64, 176, 2, 4, 2, 16, 2048, 10000.0, true, std::nullopt, 8, 2, 64},  // ~0.3M, 8 experts
    // small-moe: the active MLP width of small (top 4 x 176 = 704), 16 experts: the same active parameters
    {"small-moe", 4096, 256, 704, 4, 8, 2, 32, 4096, 10000.0, true, std::nullopt, 16, 4, 176},  // ~9M, 16 experts
    {"smollm2-360m", 49152, 960, 2560, 32, 15, 5, 64, 8192, 100000.0, true},
    {"qwen2.5-0.5b", 151936, 896, 4864, 24, 14, 2, 64, 32768, 1000000.0, true, Arch::qwen2},
    {"qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1000000.0, true, Arch::qwen3},
    {"qwen3-1.7b", 151936, 2048, 6144, 28, 16, 8, 128, 40960, 1000000.0, true, Arch::qwen3},
    {"qwen3-4b", 151936, 2560, 9728, 36, 32, 8, 128, 40960, 1000000.0, true, Arch::qwen3},
    {"qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128, 40960, 1000000.0, false, Arch::qwen3},
    {"qwen3-30b-a3b", 151936, 2048, 6144, 48, 32, 4, 128, 40960, 1000000.0, false, Arch::qwen3_moe, 128, 8, 768},
    {"mistral-7b", 32768, 4096, 14336, 32, 32, 8, 128, 32768, 1000000.0, false, Arch::mistral},
    {"mixtral-8x7b", 32000, 4096, 14336, 32, 32, 8, 128, 32768, 1000000.0, false, Arch::mixtral, 8, 2, 14336},
};
}  // namespace

ModelConfig model_preset(std::string_view name, Arch arch) {
  for (const auto& p : kPresets) {
    if (p.name != name) continue;
    ModelConfig c;
    Arch family = p.arch.value_or(arch);
    // A generic sparse shape in a dense family: that family's sparse kin.
    if (p.experts > 0 && !is_moe(family)) family = family == Arch::llama || family == Arch::mistral ? Arch::mixtral : Arch::qwen3_moe;
    if (p.experts == 0 && is_moe(family)) family = family == Arch::mixtral ? Arch::mistral : Arch::qwen3;
    apply_family(c, family);
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.inter;
    c.num_layers = p.layers;
    c.num_heads = p.heads;
    c.num_kv_heads = p.kv_heads;
    c.head_dim = p.head_dim;
    c.max_position_embeddings = p.max_pos;
    c.rope_theta = p.theta;
    c.tie_word_embeddings = p.tied;
    c.num_experts = p.experts;
    if (p.experts > 0) {
      c.num_experts_per_tok = p.top_k;
      c.moe_intermediate_size = p.moe_inter;
      if (family == Arch::mixtral) c.intermediate_size = p.moe_inter;  // Mixtral's experts are its MLP width
    }
    c.validate();
    return c;
  }
  std::string names;
  for (const auto& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
  auto guess = config::closest(name, model_preset_names());
  throw Error(fmt::format("unknown model preset '{}' (known: {}){}", name, names,
                          guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.emplace_back(p.name);
  return out;
}

}  // namespace rlx
