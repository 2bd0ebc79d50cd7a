#include "rlx/model/hf.hpp"

#include <c10/core/GradMode.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/json.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/model/safetensors.hpp"
#include "model/hf_tensors.hpp"

namespace rlx {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {
json read_json(const fs::path& p) {
  constexpr uint64_t kMaxJsonBytes = 64 << 20;
  return parse_json(read_file(p, kMaxJsonBytes), p.string());
}

void write_json(const fs::path& p, const json& j) {
  std::ofstream out(p);
  out << j.dump(2) << "\n";
  if (!out) throw Error(fmt::format("cannot write {}", p.string()));
}

std::string dtype_name_hf(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return "float32";
  }
}
}  // namespace

ModelConfig model_config_from_hf(const json& j, std::string_view source) {
  auto where = [&](std::string_view key) { return fmt::format("{}: {}", source, key); };
  RLX_CHECK(j.is_object(), "{}: config.json is not a JSON object", source);
  auto get = [&]<class T>(const char* key, T fallback, bool required) -> T {
    if (!j.contains(key) || j[key].is_null()) {
      RLX_CHECK(!required, "{}: required field missing", where(key));
      return fallback;
    }
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      RLX_CHECK(!j[key].is_number_float(), "{}: must be an integer, got {}", where(key), j[key].dump());
    try {
      return j[key].get<T>();
    } catch (const json::exception&) {
      throw Error(fmt::format("{}: has the wrong type ({})", where(key), j[key].dump()));
    }
  };
  ModelConfig c;
  const std::string type = get.operator()<std::string>("model_type", "", true);
  const auto arch = config::enum_from_string<Arch>(type);
  if (!arch) {
    std::string known;
    for (const auto& n : config::enum_name_list<Arch>()) known += (known.empty() ? "" : ", ") + n;
    throw Error(fmt::format("{}: model_type '{}' is not supported ({})", where("model_type"), type, known));
  }
  apply_family(c, *arch);
  c.vocab_size = get.operator()<int64_t>("vocab_size", 0, true);
  c.hidden_size = get.operator()<int64_t>("hidden_size", 0, true);
  c.intermediate_size = get.operator()<int64_t>("intermediate_size", 0, true);
  c.num_layers = get.operator()<int64_t>("num_hidden_layers", 0, true);
  c.num_heads = get.operator()<int64_t>("num_attention_heads", 0, true);
  c.num_kv_heads = get.operator()<int64_t>("num_key_value_heads", c.num_heads, false);
  RLX_CHECK(c.num_heads > 0, "{}: must be positive", where("num_attention_heads"));
  c.head_dim = get.operator()<int64_t>("head_dim", c.hidden_size / c.num_heads, false);
  c.max_position_embeddings = get.operator()<int64_t>("max_position_embeddings", 2048, false);
  c.rms_norm_eps = get.operator()<double>("rms_norm_eps", 1e-6, false);
  c.initializer_range = get.operator()<double>("initializer_range", 0.02, false);
  c.tie_word_embeddings = get.operator()<bool>("tie_word_embeddings", false, false);
  const std::string act = get.operator()<std::string>("hidden_act", "silu", false);
  RLX_CHECK(act == "silu", "{}: activation '{}' is not supported (silu)", where("hidden_act"), act);
  if (c.arch == Arch::qwen2) {
    c.qkv_bias = true;
  } else {
    c.qkv_bias = c.o_bias = get.operator()<bool>("attention_bias", false, false);
    if (c.arch == Arch::llama) c.mlp_bias = get.operator()<bool>("mlp_bias", false, false);
  }
  // Sliding-window attention is not built: a window that would change attention within the
  // model's context is refused (Qwen's use_sliding_window; Mistral's and Mixtral's window).
  if (c.arch == Arch::qwen2 || c.arch == Arch::qwen3 || c.arch == Arch::qwen3_moe)
    RLX_CHECK(!get.operator()<bool>("use_sliding_window", false, false),
              "{}: sliding-window attention is not supported", where("use_sliding_window"));
  if (c.arch == Arch::mistral || c.arch == Arch::mixtral) {
    const int64_t window = get.operator()<int64_t>("sliding_window", 0, false);
    RLX_CHECK(window == 0 || window >= c.max_position_embeddings,
              "{}: a sliding window of {} tokens, below max_position_embeddings ({}), is not supported (rlx attends to "
              "the whole context; set it to null, or max_position_embeddings to at most the window)",
              where("sliding_window"), window, c.max_position_embeddings);
  }
  if (c.arch == Arch::qwen3_moe) {
    // transformers >= 5 saves the count under its attribute_map's name (Mixtral's), the Hub's
    // checkpoints under num_experts.
    const char* experts =
        j.contains("num_experts") || !j.contains("num_local_experts") ? "num_experts" : "num_local_experts";
    c.num_experts = get.operator()<int64_t>(experts, 0, true);
    c.num_experts_per_tok = get.operator()<int64_t>("num_experts_per_tok", 0, true);
    c.moe_intermediate_size = get.operator()<int64_t>("moe_intermediate_size", 0, true);
    c.norm_topk_prob = get.operator()<bool>("norm_topk_prob", false, false);
    c.decoder_sparse_step = get.operator()<int64_t>("decoder_sparse_step", 1, false);
    c.mlp_only_layers = get.operator()<std::vector<int64_t>>("mlp_only_layers", {}, false);
    c.router_aux_loss_coef = get.operator()<double>("router_aux_loss_coef", 0.001, false);
  } else if (c.arch == Arch::mixtral) {
    c.num_experts = get.operator()<int64_t>("num_local_experts", 0, true);
    c.num_experts_per_tok = get.operator()<int64_t>("num_experts_per_tok", 0, true);
    c.moe_intermediate_size = c.intermediate_size;  // Mixtral's experts are its MLP width
    c.norm_topk_prob = true;
    c.router_aux_loss_coef = get.operator()<double>("router_aux_loss_coef", 0.001, false);
  }
  // transformers >= 5 moves RoPE settings into `rope_parameters`.
  json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
              : j.contains("rope_scaling") ? j["rope_scaling"] : json();
  c.rope_theta = get.operator()<double>("rope_theta", 10000.0, false);
  if (rope.is_object() && rope.contains("rope_theta")) c.rope_theta = rope["rope_theta"].get<double>();
  if (rope.is_object()) {
    std::string rt = rope.value("rope_type", rope.value("type", std::string("default")));
    auto num = [&](const char* k, double fallback) { return rope.contains(k) ? rope[k].get<double>() : fallback; };
    if (rt == "default") {
      c.rope_scaling.type = RopeType::none;
    } else if (rt == "linear") {
      c.rope_scaling.type = RopeType::linear;
      c.rope_scaling.factor = num("factor", 1.0);
    } else if (rt == "llama3") {
      c.rope_scaling.type = RopeType::llama3;
      c.rope_scaling.factor = num("factor", 8.0);
      c.rope_scaling.low_freq_factor = num("low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = num("high_freq_factor", 4.0);
      c.rope_scaling.original_max_position_embeddings =
          static_cast<int64_t>(num("original_max_position_embeddings", 8192));
    } else {
      throw Error(fmt::format("{}: rope type '{}' is not supported (default, linear, llama3)", where("rope_scaling"), rt));
    }
  }
  auto token_id = [&](const char* key) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) return -1;
    if (j[key].is_array()) return j[key].empty() ? -1 : j[key][0].get<int64_t>();  // several eos ids: the first
    return j[key].get<int64_t>();
  };
  c.bos_token_id = token_id("bos_token_id");
  c.eos_token_id = token_id("eos_token_id");
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", source, e.what()));
  }
  return c;
}

namespace {
// transformers' class names of a family: the causal LM, and the sequence classifier.
std::pair<const char*, const char*> hf_classes(Arch a) {
  switch (a) {
    case Arch::llama: return {"LlamaForCausalLM", "LlamaForSequenceClassification"};
    case Arch::qwen2: return {"Qwen2ForCausalLM", "Qwen2ForSequenceClassification"};
    case Arch::qwen3: return {"Qwen3ForCausalLM", "Qwen3ForSequenceClassification"};
    case Arch::mistral: return {"MistralForCausalLM", "MistralForSequenceClassification"};
    case Arch::qwen3_moe: return {"Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification"};
    case Arch::mixtral: return {"MixtralForCausalLM", "MixtralForSequenceClassification"};
  }
  return {"", ""};
}

json rope_scaling_to_hf(const RopeScaling& r) {
  switch (r.type) {
    case RopeType::none: return nullptr;
    case RopeType::linear: return {{"rope_type", "linear"}, {"factor", r.factor}};
    case RopeType::llama3:
      return {{"rope_type", "llama3"},
              {"factor", r.factor},
              {"low_freq_factor", r.low_freq_factor},
              {"high_freq_factor", r.high_freq_factor},
              {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  return nullptr;
}

// The fields only some families have; refuses what the family cannot express.
void family_fields_to_hf(const ModelConfig& c, json& j) {
  const auto family = config::enum_to_string(c.arch);
  RLX_CHECK(c.qk_norm == (c.arch == Arch::qwen3 || c.arch == Arch::qwen3_moe),
            "a {} model {} a q/k norm; this config (qk_norm={}) cannot be saved as {}", family,
            c.qk_norm ? "has no" : "has", c.qk_norm, family);
  if (c.arch == Arch::qwen2) {
    RLX_CHECK(c.qkv_bias && !c.o_bias && !c.mlp_bias,
              "a qwen2 model has q/k/v biases and no output or MLP biases; this config cannot be saved as qwen2");
  } else {
    RLX_CHECK(c.qkv_bias == c.o_bias, "{}'s attention_bias covers q/k/v and o together; qkv_bias={} o_bias={}", family,
              c.qkv_bias, c.o_bias);
    RLX_CHECK(c.arch == Arch::llama || !c.mlp_bias, "a {} model has no MLP biases", family);
    j["attention_bias"] = c.qkv_bias;
  }
  if (c.arch == Arch::llama) {
    j["mlp_bias"] = c.mlp_bias;
    j["pretraining_tp"] = 1;
  }
  if (c.arch == Arch::qwen2 || c.arch == Arch::qwen3 || c.arch == Arch::qwen3_moe) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  if (c.arch == Arch::mistral || c.arch == Arch::mixtral) j["sliding_window"] = nullptr;
  if (c.arch == Arch::qwen3_moe) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = false;
  }
  if (c.arch == Arch::mixtral) {
    RLX_CHECK(c.norm_topk_prob && c.decoder_sparse_step == 1 && c.mlp_only_layers.empty() &&
                  c.moe_intermediate_size == c.intermediate_size,
              "a mixtral model has every layer sparse, experts of intermediate_size and renormalised top-k weights; "
              "this config cannot be saved as mixtral");
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["router_jitter_noise"] = 0.0;
    j["output_router_logits"] = false;
  }
}
}  // namespace

json model_config_to_hf(const ModelConfig& c, at::ScalarType dtype) {
  json j;
  j["architectures"] = {hf_classes(c.arch).first};
  j["model_type"] = config::enum_to_string(c.arch);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["torch_dtype"] = dtype_name_hf(dtype);
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json();
  j["eos_token_id"] = c.eos_token_id >= 0 ? json(c.eos_token_id) : json();
  j["rope_scaling"] = rope_scaling_to_hf(c.rope_scaling);
  family_fields_to_hf(c, j);
  return j;
}

ModelConfig read_hf_config(const fs::path& dir) {
  auto p = dir / "config.json";
  return model_config_from_hf(read_json(p), p.string());
}

std::shared_ptr<Transformer> load_hf(const fs::path& dir, HfLoadOptions options) {
  ModelConfig cfg = read_hf_config(dir);
  detail::HfTensors source(dir, cfg);
  auto model = std::make_shared<Transformer>(cfg, options.dtype, options.device);
  c10::NoGradGuard no_grad;
  for (auto& [name, p] : model->hf_parameters()) {
    if (options.score && name == "lm_head.weight") {  // a classifier has none; unused
      p.zero_();
      continue;
    }
    auto [t, file] = source.read(name, p.sizes());
    RLX_CHECK(t.sizes() == p.sizes(), "{}: tensor '{}' has shape {}, the config needs {}", file.string(), name,
              t.sizes(), p.sizes());
    p.copy_(t);
  }
  if (options.score) {
    auto [t, file] = source.read("score.weight", {1, cfg.hidden_size}, " (not a sequence classifier's directory)");
    RLX_CHECK(t.dim() == 2 && t.size(0) == 1 && t.size(1) == cfg.hidden_size,
              "{}: score.weight has shape {}; a reward model's head is [1, {}] (one label)", file.string(), t.sizes(),
              cfg.hidden_size);
    *options.score = t.reshape({cfg.hidden_size}).to(options.device, at::kFloat);
  }
  for (const auto& [name, file] : source.unused()) {
    // A tied head stored anyway is harmless; RoPE buffers some exporters write are recomputed.
    if (name == "lm_head.weight" && cfg.tie_word_embeddings) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    throw Error(fmt::format("{}: unexpected tensor '{}' (not part of a {} model with this config)", file.string(), name,
                            config::enum_to_string(cfg.arch)));
  }
  return model;
}

void save_hf(const Transformer& model, const fs::path& dir, HfSaveOptions options) {
  fs::create_directories(dir);
  auto config = model_config_to_hf(model.config(), model.dtype());
  auto params = model.hf_parameters();
  if (options.score.defined()) {
    // transformers' *ForSequenceClassification: the body and `score`, one label.
    config["architectures"] = {hf_classes(model.config().arch).second};
    config["id2label"] = {{"0", "LABEL_0"}};
    config["label2id"] = {{"LABEL_0", 0}};
    config["num_labels"] = 1;
    if (!config.contains("pad_token_id") || config["pad_token_id"].is_null())
      config["pad_token_id"] = std::max<int64_t>(model.config().eos_token_id, 0);
    std::erase_if(params, [](const auto& p) { return p.first == "lm_head.weight"; });
    params.emplace_back("score.weight", options.score.detach().reshape({1, -1}).to(at::kCPU, model.dtype()));
  }
  write_json(dir / "config.json", config);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  uint64_t size = 0, total = 0;
  for (auto& [name, t] : params) {
    const uint64_t bytes = static_cast<uint64_t>(t.nbytes());
    if (size > 0 && size + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().emplace_back(name, t);
    size += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};  // transformers requires it
  if (shards.size() == 1) {
    save_safetensors(dir / "model.safetensors", shards[0], meta);
    fs::remove(dir / "model.safetensors.index.json");
    return;
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string file = fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, shards.size());
    save_safetensors(dir / file, shards[i], meta);
    for (auto& [name, _] : shards[i]) index["weight_map"][name] = file;
  }
  write_json(dir / "model.safetensors.index.json", index);
  fs::remove(dir / "model.safetensors");
}

}  // namespace rlx
