// A Hugging Face checkpoint directory's tensors, found by rlx's parameter names (private to
// src/model; load_hf's reading side).
//
// Mixture-of-experts checkpoints come in two layouts, and both load:
//   - the Hub's, one tensor per expert and projection: Qwen3-MoE
//     `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`, Mixtral
//     `model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight` (w1 gate, w3 up, w2 down)
//     and its router `block_sparse_moe.gate.weight`. transformers v5's save_pretrained
//     writes this by default (save_original_format=True reverses its loading conversions).
//   - transformers v5's in-memory one, which save_pretrained(save_original_format=False),
//     re-saved and newer checkpoints carry: per sparse layer
//     `model.layers.L.mlp.experts.gate_up_proj` [E, 2I, H] (each expert's gate rows, then its
//     up rows) and `model.layers.L.mlp.experts.down_proj` [E, H, I]; Mixtral's router becomes
//     `model.layers.L.mlp.gate.weight`. The transposed orientation some Hub checkpoints of the
//     same names store ([E, H, 2I] and [E, I, H], which v5 turns around on load) is taken
//     too, told apart by the shapes.
//
//   HfTensors src(dir, cfg);
//   auto [t, file] = src.read("model.layers.1.mlp.experts.3.up_proj.weight", {64, 128});
//   for (auto& [name, file] : src.unused()) ...;   // what no read took
#pragma once

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlx/model/config.hpp"
#include "rlx/model/safetensors.hpp"

namespace rlx::detail {

class HfTensors {
 public:
  // Reads model.safetensors.index.json (or lists model.safetensors); shards open on first use.
  HfTensors(const std::filesystem::path& dir, const ModelConfig& cfg);

  // The checkpoint's values of parameter `name` (its HF name, as Transformer::hf_parameters
  // gives it) and the file they came from: a stored tensor, or one expert's slice of a
  // packed one. Throws rlx::Error naming the tensor, the file and each layout looked for
  // when the checkpoint has none of them; `hint` is appended to that message.
  std::pair<at::Tensor, std::filesystem::path> read(const std::string& name, at::IntArrayRef shape,
                                                    std::string_view hint = {});

  // Stored tensors no read() used, with their files.
  std::vector<std::pair<std::string, std::filesystem::path>> unused() const;

 private:
  struct Candidate {
    std::string name;    // the stored tensor
    std::string layout;  // how the message names it
  };
  enum class Packed { none, gate, up, down };
  struct Lookup {
    std::vector<Candidate> names;  // stored under these names, in this order of preference
    std::string packed_layer;      // "model.layers.L" when a packed tensor may hold it
    Packed packed = Packed::none;
    int64_t expert = -1;
  };
  Lookup lookup(const std::string& name) const;
  const SafetensorsFile& file(const std::string& name);
  // Whether layer `layer`'s packed experts are stored transposed ([E, H, 2I], [E, I, H]);
  // decided from both tensors' shapes, once per layer.
  bool packed_transposed(const std::string& layer);
  std::string where() const;

  std::filesystem::path dir_, index_;  // index_ empty: one model.safetensors
  ModelConfig cfg_;
  std::map<std::string, std::filesystem::path> file_of_;  // stored name -> file
  std::map<std::filesystem::path, SafetensorsFile> open_;
  std::map<std::string, bool> transposed_;  // layer -> packed_transposed()
  std::set<std::string> used_;
};

}  // namespace rlx::detail
