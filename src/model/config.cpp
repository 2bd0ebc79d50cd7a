#include "rlx/model/config.hpp"

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
  // Counted in double: an int64 product of absurd sizes would wrap before any check.
  const double q = double(num_heads) * head_dim, kv = double(num_kv_heads) * head_dim, h = double(hidden_size);
  const double block = h * (2 * q + 2 * kv) + 3 * h * intermediate_size + 2 * h;
  const double total = double(vocab_size) * h * (tie_word_embeddings ? 1 : 2) + double(num_layers) * block;
  RLX_CHECK(total <= kMaxParameters,
            "about {:.3g} parameters (vocab_size {}, hidden_size {}, intermediate_size {}, num_layers {}, heads {}x{}): more "
            "than the {:.0g} rlx builds",
            total, vocab_size, hidden_size, intermediate_size, num_layers, num_heads, head_dim, kMaxParameters);
}

int64_t ModelConfig::num_parameters() const {
  const int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
  int64_t attn = hidden_size * q + 2 * hidden_size * kv + q * hidden_size;
  if (qkv_bias) attn += q + 2 * kv;
  if (o_bias) attn += hidden_size;
  int64_t mlp = 3 * hidden_size * intermediate_size;
  if (mlp_bias) mlp += 2 * intermediate_size + hidden_size;
  const int64_t block = attn + mlp + 2 * hidden_size;
  int64_t total = vocab_size * hidden_size + num_layers * block + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

namespace {
struct Preset {
  std::string_view name;
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos;
  double theta;
  bool tied;
};
// Shapes, not weights: the 0.5B-class ones copy the published configs of those models.
constexpr Preset kPresets[] = {
    {"tiny", 512, 64, 176, 2, 4, 2, 16, 2048, 10000.0, true},              // ~0.2M parameters
    {"small", 4096, 256, 704, 4, 8, 2, 32, 4096, 10000.0, true},           // ~4M
    {"base", 32000, 768, 2048, 12, 12, 4, 64, 4096, 10000.0, true},        // ~95M
    {"smollm2-360m", 49152, 960, 2560, 32, 15, 5, 64, 8192, 100000.0, true},
    {"qwen2.5-0.5b", 151936, 896, 4864, 24, 14, 2, 64, 32768, 1000000.0, true},
};
}  // namespace

ModelConfig model_preset(std::string_view name, Arch arch) {
  for (const auto& p : kPresets) {
    if (p.name != name) continue;
    ModelConfig c;
    c.arch = arch;
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
    c.qkv_bias = arch == Arch::qwen2;
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
