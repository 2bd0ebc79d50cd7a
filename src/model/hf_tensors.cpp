#include "model/hf_tensors.hpp"

#include <nlohmann/json.hpp>
#include <regex>

#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/json.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx::detail {

namespace fs = std::filesystem;

HfTensors::HfTensors(const fs::path& dir, const ModelConfig& cfg) : dir_(dir), cfg_(cfg) {
  if (fs::exists(dir / "model.safetensors.index.json")) {
    index_ = dir / "model.safetensors.index.json";
    constexpr uint64_t kMaxIndexBytes = 64 << 20;  // a weight map of many thousand experts fits
    auto index = parse_json(read_file(index_, kMaxIndexBytes), index_.string());
    RLX_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), "{}: no 'weight_map' object",
              index_.string());
    for (auto& [name, file] : index["weight_map"].items()) {
      RLX_CHECK(file.is_string(), "{}: weight_map['{}'] is not a file name", index_.string(), name);
      fs::path f = file.get<std::string>();
      RLX_CHECK(f.filename() == f, "{}: weight_map['{}'] = '{}' is not a plain file name", index_.string(), name,
                f.string());
      file_of_[name] = dir / f;
    }
    return;
  }
  const auto path = dir / "model.safetensors";
  RLX_CHECK(fs::exists(path), "{}: neither model.safetensors nor model.safetensors.index.json", dir.string());
  auto f = SafetensorsFile::open(path);
  for (const auto& e : f.header().entries) file_of_[e.name] = path;
  open_.emplace(path, std::move(f));
}

std::string HfTensors::where() const { return (index_.empty() ? dir_ / "model.safetensors" : index_).string(); }

const SafetensorsFile& HfTensors::file(const std::string& name) {
  const auto& path = file_of_.at(name);
  auto it = open_.find(path);
  if (it == open_.end()) it = open_.emplace(path, SafetensorsFile::open(path)).first;
  return it->second;
}

HfTensors::Lookup HfTensors::lookup(const std::string& name) const {
  Lookup out;
  out.names.push_back({name, "its name"});
  if (!is_moe(cfg_.arch)) return out;
  // A sparse layer's router, or one projection of one expert (Qwen3-MoE's and Mixtral's names).
  static const std::regex kSparse(
      R"(^(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.(?:gate\.weight|experts\.(\d+)\.(\w+)\.weight)$)");
  std::smatch m;
  if (!std::regex_match(name, m, kSparse)) return out;
  const std::string layer = m[1].str();
  if (!m[2].matched) {  // the router: Mixtral's moves from block_sparse_moe to mlp in transformers v5
    if (cfg_.arch == Arch::mixtral) {
      out.names[0].layout = "the Hub's name";
      out.names.push_back({layer + ".mlp.gate.weight", "transformers v5's name"});
    }
    return out;
  }
  const std::string proj = m[3].str();
  out.names[0].layout = "the Hub's per-expert layout";
  out.packed_layer = layer;
  out.expert = std::stoll(m[2].str());
  out.packed = proj == "gate_proj" || proj == "w1" ? Packed::gate
               : proj == "up_proj" || proj == "w3" ? Packed::up
                                                   : Packed::down;
  return out;
}

namespace {
std::string packed_name(const std::string& layer, bool down) {
  return layer + (down ? ".mlp.experts.down_proj" : ".mlp.experts.gate_up_proj");
}
}  // namespace

bool HfTensors::packed_transposed(const std::string& layer) {
  if (auto it = transposed_.find(layer); it != transposed_.end()) return it->second;
  const int64_t E = cfg_.num_experts, I = cfg_.moe_intermediate_size, H = cfg_.hidden_size;
  struct Want {
    std::string name;
    std::vector<int64_t> plain, turned;  // transformers v5's orientation, and the transposed one
  };
  const Want wants[] = {{packed_name(layer, false), {E, 2 * I, H}, {E, H, 2 * I}},
                        {packed_name(layer, true), {E, H, I}, {E, I, H}}};
  int fits = 3;  // bit 0: transformers v5's orientation fits every packed tensor; bit 1: the transposed one
  std::string seen;
  for (const auto& w : wants) {
    if (!file_of_.count(w.name)) continue;
    const SafetensorsEntry* e = file(w.name).find(w.name);
    RLX_CHECK(e != nullptr, "{}: no tensor named '{}', which {} places there", file_of_.at(w.name).string(), w.name,
              where());
    const int f = (e->shape == w.plain ? 1 : 0) | (e->shape == w.turned ? 2 : 0);
    RLX_CHECK(f != 0, "{}: packed experts '{}' have shape {}; this config needs {} (transformers v5) or {} (transposed)",
              file_of_.at(w.name).string(), w.name, at::IntArrayRef(e->shape), at::IntArrayRef(w.plain),
              at::IntArrayRef(w.turned));
    fits &= f;
    seen += fmt::format("{}'{}' {}", seen.empty() ? "" : ", ", w.name, at::IntArrayRef(e->shape));
  }
  RLX_CHECK(fits != 0, "{}: the packed experts of {} disagree on their orientation: {}", where(), layer, seen);
  // Square shapes fit both: transformers v5's own orientation, which is what it writes.
  return transposed_[layer] = fits == 2;
}

std::pair<at::Tensor, fs::path> HfTensors::read(const std::string& name, at::IntArrayRef shape, std::string_view hint) {
  const Lookup l = lookup(name);
  for (const auto& c : l.names) {
    if (!file_of_.count(c.name)) continue;
    used_.insert(c.name);
    return {file(c.name).tensor(c.name), file_of_.at(c.name)};
  }
  const int64_t E = cfg_.num_experts, I = cfg_.moe_intermediate_size, H = cfg_.hidden_size;
  if (l.packed != Packed::none) {
    const bool down = l.packed == Packed::down;
    const auto packed = packed_name(l.packed_layer, down);
    if (file_of_.count(packed)) {
      const bool turned = packed_transposed(l.packed_layer);
      auto t = file(packed).tensor(packed)[l.expert];  // [2I, H] or [H, 2I]; down [H, I] or [I, H]
      if (down) {
        if (turned) t = t.t();
      } else {
        const int64_t at_row = l.packed == Packed::up ? I : 0;  // gate rows first, then up
        t = turned ? t.narrow(1, at_row, I).t() : t.narrow(0, at_row, I);
      }
      used_.insert(packed);
      return {t, file_of_.at(packed)};
    }
  }
  std::string looked;
  if (l.names.size() > 1 || l.packed != Packed::none) {
    for (const auto& c : l.names) looked += fmt::format("{}'{}' ({})", looked.empty() ? "; looked for " : ", ", c.name, c.layout);
    if (l.packed != Packed::none) {
      const bool down = l.packed == Packed::down;
      const auto plain = down ? std::vector<int64_t>{E, H, I} : std::vector<int64_t>{E, 2 * I, H};
      const auto turned = down ? std::vector<int64_t>{E, I, H} : std::vector<int64_t>{E, H, 2 * I};
      looked += fmt::format(" and '{}' {} or {} (transformers v5's packed layout, or transposed)",
                            packed_name(l.packed_layer, down), at::IntArrayRef(plain), at::IntArrayRef(turned));
    }
  }
  throw Error(fmt::format("{}: missing tensor '{}' of shape {}{}{}", where(), name, shape, looked, hint));
}

std::vector<std::pair<std::string, fs::path>> HfTensors::unused() const {
  std::vector<std::pair<std::string, fs::path>> out;
  for (const auto& [name, file] : file_of_)
    if (!used_.count(name)) out.emplace_back(name, file);
  return out;
}

}  // namespace rlx::detail
