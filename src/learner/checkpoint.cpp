#include "rlx/learner/checkpoint.hpp"

#include <c10/core/GradMode.h>
#include <cstdlib>
#include <algorithm>
#include <functional>
#include <map>

#include "rlx/core/error.hpp"
#include "rlx/core/fault.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/safetensors.hpp"

namespace rlx {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;
constexpr uint64_t kMaxJsonBytes = 64 << 20;

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string rank_file(int rank, int world) { return fmt::format("rank-{:05d}-of-{:05d}.safetensors", rank, world); }

void remove_partials(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind(".partial-", 0) == 0) {
      rlx::remove_tree(e.path(), ec);
      if (ec) log::warn("checkpoint: cannot remove the partial {}: {}", e.path().string(), ec.message());
    }
  }
}

json units_json(Learner& l) {
  json units = json::array();
  for (auto* u : l.model().trained_units()) {
    json slots = json::array();
    for (const auto& s : u->slots) slots.push_back(s.name);
    units.push_back({{"name", u->name},
                     {"numel", u->numel},
                     {"padded", u->padded},
                     {"shard_numel", u->shard_numel},
                     {"slots", slots}});
  }
  return units;
}

// The order of a saved unit's parameters in its flat tensors: its "slots", or for a checkpoint
// written before units laid their biases last (none recorded), the module's order.
std::vector<std::string> saved_slot_order(const json& saved, dist::ShardedTransformer& model,
                                          const dist::ShardedUnit& u) {
  if (saved.contains("slots")) return saved.at("slots").get<std::vector<std::string>>();
  std::map<std::string, size_t> place;
  for (auto& [name, p] : model.module().hf_parameters()) place.emplace(name, place.size());
  for (auto& [name, p] : model.module().lora_parameters()) place.emplace(name, place.size());
  std::vector<std::string> names;
  for (const auto& s : u.slots) names.push_back(s.name);
  std::stable_sort(names.begin(), names.end(), [&](const auto& a, const auto& b) { return place.at(a) < place.at(b); });
  return names;
}

// The adapters a checkpoint's units belong to (null without LoRA).
json lora_json(const LoraSpec& lora) {
  if (!lora.enabled()) return nullptr;
  return {{"rank", lora.rank}, {"alpha", lora.alpha}, {"dropout", lora.dropout}, {"targets", lora.targets}};
}

// Restores one unit's three flat tensors from the saved shards: each parameter's elements from
// where the checkpoint's flat layout had them (`saved_order`: its parameters' names in flat
// order), resharding when the group size differs. `shards(k)` returns old rank k's [param,
// exp_avg, exp_avg_sq].
void restore_unit(dist::ShardedUnit& u, AdamW::Slot& slot, int rank, int old_world, int64_t old_shard,
                  const std::vector<std::string>& saved_order,
                  const std::function<std::vector<at::Tensor>(int)>& shards, const fs::path& dir) {
  c10::NoGradGuard no_grad;
  RLX_CHECK(old_shard > 0 && old_world > 0, "checkpoint {}: unit {} has {} ranks' shards of {} elements", dir.string(),
            u.name, old_world, old_shard);
  std::map<std::string, int64_t> numel, saved_at;
  for (const auto& s : u.slots) numel.emplace(s.name, s.numel);
  int64_t at = 0;
  for (const auto& name : saved_order) {
    auto it = numel.find(name);
    RLX_CHECK(it != numel.end(), "checkpoint {}: unit {} holds {}, which this model's unit has not", dir.string(),
              u.name, name);
    RLX_CHECK(!saved_at.contains(name), "checkpoint {}: unit {} lists {} twice", dir.string(), u.name, name);
    saved_at.emplace(name, at);
    at += it->second;
  }
  RLX_CHECK(saved_at.size() == u.slots.size(), "checkpoint {}: unit {} holds {} parameters, this model's {}",
            dir.string(), u.name, saved_at.size(), u.slots.size());
  std::vector<at::Tensor> targets{u.shard, slot.exp_avg, slot.exp_avg_sq};
  for (auto& t : targets) t.zero_();
  std::map<int, std::vector<at::Tensor>> old;  // old rank k's three tensors, read once
  const int64_t begin = static_cast<int64_t>(rank) * u.shard_numel, end = begin + u.shard_numel;
  for (const auto& s : u.slots) {
    // This rank's part of the parameter, [lo, hi) of the flat, from the saved flat's
    // [from, from + hi - lo), which old rank k held within [k old_shard, (k + 1) old_shard).
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    for (int64_t x = lo; x < hi;) {
      const int64_t from = saved_at.at(s.name) + (x - s.offset);
      const int k = static_cast<int>(from / old_shard);
      RLX_CHECK(k < old_world, "checkpoint {}: unit {} past its shards", dir.string(), u.name);
      const int64_t n = std::min(hi - x, static_cast<int64_t>(k + 1) * old_shard - from);
      auto it = old.find(k);
      if (it == old.end()) it = old.emplace(k, shards(k)).first;
      for (size_t i = 0; i < targets.size(); ++i)
        targets[i]
            .narrow(0, x - begin, n)
            .copy_(it->second[i].narrow(0, from - static_cast<int64_t>(k) * old_shard, n));
      x += n;
    }
  }
}

}  // namespace

std::vector<fs::path> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0 || !e.is_directory()) continue;
    char* end = nullptr;
    const long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (*end != '\0' || step < 0) continue;
    found.emplace_back(step, e.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

CheckpointInfo verify_checkpoint(const fs::path& dir) {
  CheckpointInfo info;
  info.dir = dir;
  try {
    const auto manifest_path = dir / "MANIFEST.json";
    RLX_CHECK(fs::exists(manifest_path), "no MANIFEST.json (an incomplete checkpoint)");
    json manifest;
    try {
      manifest = json::parse(read_file(manifest_path, kMaxJsonBytes));
    } catch (const json::exception& e) {
      throw Error(fmt::format("MANIFEST.json is not valid JSON: {}", e.what()));
    }
    RLX_CHECK(manifest.is_object() && manifest.value("format", "") == "rlx-checkpoint" &&
                  manifest.value("version", 0) == kFormatVersion && manifest.contains("files") &&
                  manifest["files"].is_array(),
              "MANIFEST.json is not an rlx checkpoint manifest of version {}", kFormatVersion);
    info.step = manifest.value("step", int64_t{-1});
    info.world_size = manifest.value("world_size", 0);
    for (const auto& f : manifest["files"]) {
      CheckpointFile cf{f.at("name").get<std::string>(), f.at("bytes").get<uint64_t>(),
                        std::stoull(f.at("xxh64").get<std::string>(), nullptr, 16)};
      RLX_CHECK(cf.name.find('/') == std::string::npos && cf.name != ".." && !cf.name.empty(),
                "MANIFEST.json names a file outside the checkpoint: {:?}", cf.name);
      info.files.push_back(cf);
    }
    bool has_learner = false;
    for (const auto& cf : info.files) {
      const auto p = dir / cf.name;
      std::error_code ec;
      const auto size = fs::file_size(p, ec);
      RLX_CHECK(!ec, "{} is missing", cf.name);
      RLX_CHECK(size == cf.bytes, "{} has {} bytes, the manifest says {} (truncated or replaced)", cf.name, size,
                cf.bytes);
      const uint64_t h = file_xxh64(p);
      RLX_CHECK(h == cf.xxh64, "{} has checksum {:016x}, the manifest says {:016x} (corrupted)", cf.name, h, cf.xxh64);
      has_learner = has_learner || cf.name == "learner.json";
    }
    RLX_CHECK(has_learner, "the manifest lists no learner.json");
    info.learner = json::parse(read_file(dir / "learner.json", kMaxJsonBytes));
    for (int r = 0; r < info.world_size; ++r) {
      const auto name = rank_file(r, info.world_size);
      RLX_CHECK(std::any_of(info.files.begin(), info.files.end(), [&](const auto& f) { return f.name == name; }),
                "the manifest lists no {}", name);
    }
    info.ok = true;
  } catch (const std::exception& e) {
    info.ok = false;
    info.problem = e.what();
  }
  return info;
}

fs::path save_checkpoint(Learner& learner, const CheckpointOptions& o, const json& references) {
  RLX_CHECK(!o.root.empty(), "checkpoint: no directory given");
  RLX_CHECK(o.keep_last >= 1, "checkpoint.keep_last must be >= 1, got {}", o.keep_last);
  auto& comm = learner.comm();
  const int rank = comm.rank(), world = comm.size();
  const int64_t step = learner.step_count();
  const auto final_dir = o.root / step_name(step);
  const auto partial = o.root / (".partial-" + step_name(step));
  if (rank == 0) {
    fs::create_directories(o.root);
    remove_partials(o.root);
    fs::create_directories(partial);
  }
  comm.barrier("checkpoint: start");

  std::vector<std::pair<std::string, at::Tensor>> tensors;
  // The trained units only: with LoRA the adapters (the base is the run's model.path).
  const auto units = learner.model().trained_units();
  auto& slots = learner.optimizer().slots();
  for (size_t i = 0; i < units.size(); ++i) {
    tensors.emplace_back(units[i]->name + ".param", units[i]->shard.detach());
    tensors.emplace_back(units[i]->name + ".exp_avg", slots[i].exp_avg);
    tensors.emplace_back(units[i]->name + ".exp_avg_sq", slots[i].exp_avg_sq);
  }
  if (learner.value_head().defined()) {  // replicated: every rank's file holds it
    const auto& slot = slots[units.size()];
    tensors.emplace_back("value_head.param", learner.value_head().detach());
    tensors.emplace_back("value_head.exp_avg", slot.exp_avg);
    tensors.emplace_back("value_head.exp_avg_sq", slot.exp_avg_sq);
  }
  save_safetensors(partial / rank_file(rank, world), tensors,
                   {{"rank", std::to_string(rank)},
                    {"world_size", std::to_string(world)},
                    {"step", std::to_string(step)},
                    {"rng", learner.rng().serialize()}});
  fault::crash_at(fault::Point::checkpoint_shards, {.rank = rank, .step = step});
  comm.barrier("checkpoint: shards written");
  // A crash here: rank 0 commits the checkpoint without this rank.
  fault::crash_at(fault::Point::checkpoint_shards_agreed, {.rank = rank, .step = step});

  if (rank == 0) {
    const auto& opt = learner.options();
    json lj = {{"format", "rlx-learner"},
               {"version", kFormatVersion},
               {"step", step},
               {"world_size", world},
               {"model", model_config_to_hf(learner.model().config(), at::kFloat)},
               {"units", units_json(learner)},
               {"lora", lora_json(learner.model().lora())},
               {"optimizer",
                {{"lr", opt.optimizer.lr},
                 {"beta1", opt.optimizer.beta1},
                 {"beta2", opt.optimizer.beta2},
                 {"eps", opt.optimizer.eps},
                 {"weight_decay", opt.optimizer.weight_decay},
                 {"step", learner.optimizer().step_count()}}},
               {"max_grad_norm", opt.max_grad_norm},
               {"value_head", learner.value_head().defined()},
               {"references", references}};
    write_file_atomic(partial / "learner.json", lj.dump(2));
    json files = json::array();
    std::vector<std::string> names{"learner.json"};
    for (int r = 0; r < world; ++r) names.push_back(rank_file(r, world));
    for (const auto& n : names)
      files.push_back({{"name", n}, {"bytes", fs::file_size(partial / n)}, {"xxh64", fmt::format("{:016x}", file_xxh64(partial / n))}});
    json manifest = {{"format", "rlx-checkpoint"}, {"version", kFormatVersion}, {"step", step}, {"world_size", world},
                     {"files", files}};
    write_file_atomic(partial / "MANIFEST.json", manifest.dump(2));
    fsync_path(partial);
    fault::crash_at(fault::Point::checkpoint_manifest, {.rank = rank, .step = step});
    std::error_code ec;
    if (fs::exists(final_dir)) rlx::remove_tree(final_dir);  // the same step saved again
    fs::rename(partial, final_dir);
    fsync_path(o.root);
    fault::crash_at(fault::Point::checkpoint_renamed, {.rank = rank, .step = step});
    auto all = list_checkpoints(o.root);
    int kept = 0;
    for (const auto& d : all) {
      if (!verify_checkpoint(d).ok && d != final_dir) continue;  // damaged ones do not count as kept
      if (++kept > o.keep_last) rlx::remove_tree(d, ec);
    }
  }
  comm.barrier("checkpoint: committed");
  return final_dir;
}

std::optional<LoadedCheckpoint> load_latest_checkpoint(Learner& learner, const CheckpointOptions& o) {
  auto& comm = learner.comm();
  const int rank = comm.rank(), world = comm.size();
  comm.barrier("checkpoint load: start");
  if (rank == 0) remove_partials(o.root);
  LoadedCheckpoint out;
  for (const auto& dir : list_checkpoints(o.root)) {
    auto info = verify_checkpoint(dir);
    if (!info.ok) {
      out.skipped.push_back(fmt::format("{}: {}", dir.string(), info.problem));
      if (rank == 0) log::warn("checkpoint {} is not usable ({}); trying the previous one", dir.string(), info.problem);
      continue;
    }
    const auto& lj = info.learner;
    const auto units = learner.model().trained_units();
    const json saved_lora = lj.value("lora", json(nullptr)), lora = lora_json(learner.model().lora());
    RLX_CHECK(saved_lora == lora, "checkpoint {}: it holds {}, this run trains {} (model.lora)", dir.string(),
              saved_lora.is_null() ? "every weight" : "LoRA adapters " + saved_lora.dump(),
              lora.is_null() ? "every weight" : "LoRA adapters " + lora.dump());
    const auto& saved_units = lj.at("units");
    RLX_CHECK(saved_units.size() == units.size(), "checkpoint {}: {} units, this model has {}", dir.string(),
              saved_units.size(), units.size());
    for (size_t i = 0; i < units.size(); ++i)
      RLX_CHECK(saved_units[i].at("name") == units[i]->name && saved_units[i].at("numel") == units[i]->numel,
                "checkpoint {}: unit {} ({}, {} parameters) does not match this model's {} ({} parameters)",
                dir.string(), i, saved_units[i].at("name").get<std::string>(), saved_units[i].at("numel").get<int64_t>(),
                units[i]->name, units[i]->numel);
    const int old_world = info.world_size;
    std::map<int, SafetensorsFile> files;
    auto file = [&](int k) -> SafetensorsFile& {
      auto it = files.find(k);
      if (it == files.end()) it = files.emplace(k, SafetensorsFile::open(dir / rank_file(k, old_world))).first;
      return it->second;
    };
    auto& slots = learner.optimizer().slots();
    for (size_t i = 0; i < units.size(); ++i) {
      const int64_t old_shard = saved_units[i].at("shard_numel").get<int64_t>();
      const auto& name = units[i]->name;
      restore_unit(
          *units[i], slots[i], rank, old_world, old_shard, saved_slot_order(saved_units[i], learner.model(), *units[i]),
          [&](int k) {
            auto& f = file(k);
            return std::vector<at::Tensor>{f.tensor(name + ".param"), f.tensor(name + ".exp_avg"),
                                           f.tensor(name + ".exp_avg_sq")};
          },
          dir);
    }
    const bool saved_head = lj.value("value_head", false);
    RLX_CHECK(saved_head == learner.value_head().defined(), "checkpoint {}: {} a value head, this learner {}",
              dir.string(), saved_head ? "has" : "has no", saved_head ? "has none" : "has one");
    if (saved_head) {
      c10::NoGradGuard no_grad;
      auto& f = file(old_world == world ? rank : 0);
      auto& slot = slots[units.size()];
      learner.value_head().copy_(f.tensor("value_head.param"));
      slot.exp_avg.copy_(f.tensor("value_head.exp_avg"));
      slot.exp_avg_sq.copy_(f.tensor("value_head.exp_avg_sq"));
    }
    const int64_t step = lj.at("step").get<int64_t>();
    learner.optimizer().set_step_count(lj.at("optimizer").at("step").get<int64_t>());
    // The random stream continues where this rank's left off (a new rank starts a fresh one).
    if (old_world == world) {
      const auto& meta = file(rank).header().metadata;
      auto it = meta.find("rng");
      RLX_CHECK(it != meta.end(), "checkpoint {}: {} has no rng state", dir.string(), rank_file(rank, old_world));
      learner.rng() = RngStream::deserialize(it->second);
    }
    out.dir = dir;
    out.step = step;
    out.references = lj.value("references", json::object());
    comm.barrier("checkpoint load: done");
    return out;
  }
  comm.barrier("checkpoint load: none");
  return std::nullopt;
}

void export_hf(Learner& learner, const fs::path& dir, at::ScalarType dtype) {
  auto params = learner.model().gather_parameters();
  if (learner.comm().rank() == 0) {
    Transformer model(learner.model().config(), dtype, at::kCPU);
    std::map<std::string, at::Tensor> by_name(params.begin(), params.end());
    c10::NoGradGuard no_grad;
    for (auto& [name, p] : model.hf_parameters()) p.copy_(by_name.at(name));
    save_hf(model, dir);
  }
  learner.comm().barrier("export: written");
}

void export_peft_adapter(Learner& learner, const fs::path& dir, const std::string& base_model) {
  const auto& lora = learner.model().lora();
  RLX_CHECK(lora.enabled(), "export_peft_adapter: the learner trains no adapters");
  auto adapters = learner.model().gather_lora_parameters();
  if (learner.comm().rank() == 0) {
    fs::create_directories(dir);
    for (auto& [name, t] : adapters) name = "base_model.model." + name;  // PEFT's prefix
    save_safetensors(dir / "adapter_model.safetensors", adapters, {{"format", "pt"}});
    const json config = {{"peft_type", "LORA"},
                         {"task_type", "CAUSAL_LM"},
                         {"base_model_name_or_path", base_model},
                         {"r", lora.rank},
                         {"lora_alpha", lora.alpha},
                         {"lora_dropout", lora.dropout},
                         {"target_modules", lora.targets},
                         {"bias", "none"},
                         {"fan_in_fan_out", false},
                         {"inference_mode", true},
                         {"init_lora_weights", true},
                         {"use_rslora", false},
                         {"modules_to_save", nullptr}};
    write_file_atomic(dir / "adapter_config.json", config.dump(2));
  }
  learner.comm().barrier("export: adapter written");
}

}  // namespace rlx
