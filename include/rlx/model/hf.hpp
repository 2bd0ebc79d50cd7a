// Hugging Face model directories: config.json <-> ModelConfig, and weights in
// model.safetensors or sharded with model.safetensors.index.json, under HF's
// tensor names, so `transformers` loads what rlx saves and the other way round.
//
//   auto model = rlx::load_hf("Qwen2.5-0.5B/", {.dtype = at::kBFloat16});
//   rlx::save_hf(*model, "out/");            // config.json + model.safetensors
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string_view>

#include "rlx/model/config.hpp"
#include "rlx/model/transformer.hpp"

namespace rlx {

// Reads an HF config.json (model_type llama or qwen2); throws rlx::Error naming the
// field for anything rlx cannot represent faithfully.
ModelConfig model_config_from_hf(const nlohmann::json& j, std::string_view source);
nlohmann::json model_config_to_hf(const ModelConfig& cfg, at::ScalarType dtype);

ModelConfig read_hf_config(const std::filesystem::path& dir);

struct HfLoadOptions {
  at::ScalarType dtype = at::kFloat;  // weights are converted to this
  at::Device device = at::kCPU;
  // A sequence classifier's directory (reward_model.hpp): no LM head expected (an untied
  // one is left zero), and `score.weight` read into *score.
  at::Tensor* score = nullptr;
};
// Loads config.json and every weight; missing, unexpected or mis-shaped tensors are errors
// that name the tensor and the file. A mixture of experts' experts load from the Hub's
// per-expert tensors or from transformers v5's packed ones (`mlp.experts.gate_up_proj`
// [E, 2I, H] and `mlp.experts.down_proj` [E, H, I], or both transposed), whichever the
// directory holds; save_hf writes the Hub's.
std::shared_ptr<Transformer> load_hf(const std::filesystem::path& dir, HfLoadOptions options = {});

struct HfSaveOptions {
  uint64_t max_shard_bytes = 5'000'000'000;  // above this, shards + model.safetensors.index.json
  at::Tensor score;  // defined: a sequence classifier with this head [hidden] and no LM head
};
void save_hf(const Transformer& model, const std::filesystem::path& dir, HfSaveOptions options = {});

}  // namespace rlx
