// Atomic, verified, sharded checkpoints of a learner group.
//
// A checkpoint is a directory `step_NNNNNNNN/` under the checkpoint root:
//   rank-R-of-W.safetensors  this rank's master shards and AdamW moments, per unit,
//                            with its random stream in the metadata
//   learner.json             step, group size, model config (HF), unit layout,
//                            options, and references (the hub's saved state, ...)
//   MANIFEST.json            every file's size and xxh64; written last
// It is written into `.partial-step_NNNNNNNN/`, fsynced, and renamed into place,
// so a crash at any point leaves the previous checkpoints intact; leftover
// partial directories are removed by the next save or load. The newest
// `keep_last` checkpoints are kept.
//
// Loading verifies every file against the manifest before reading anything; a
// corrupt or incomplete checkpoint is reported and the previous one is used.
// A checkpoint written by a group of another size is resharded on load.
//
//   rlx::save_checkpoint(learner, {.root = "runs/x/checkpoints"}, {{"hub_state", path}});
//   if (auto loaded = rlx::load_latest_checkpoint(learner, {.root = ...})) resume at loaded->step;
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "rlx/learner/learner.hpp"

namespace rlx {

struct CheckpointOptions {
  std::filesystem::path root;  // the directory holding step_N/ checkpoints
  int keep_last = 3;           // complete checkpoints kept (>= 1)
};

// Writes a checkpoint of the learner's current step (collective: every rank calls it).
// Returns the checkpoint's directory.
std::filesystem::path save_checkpoint(Learner& learner, const CheckpointOptions& options,
                                      const nlohmann::json& references = nlohmann::json::object());

struct LoadedCheckpoint {
  std::filesystem::path dir;
  int64_t step = 0;
  nlohmann::json references;
  std::vector<std::string> skipped;  // newer checkpoints that failed verification, with the reason
};

// Loads the newest checkpoint that verifies (collective). nullopt when there is none.
std::optional<LoadedCheckpoint> load_latest_checkpoint(Learner& learner, const CheckpointOptions& options);

struct CheckpointFile {
  std::string name;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

struct CheckpointInfo {
  std::filesystem::path dir;
  bool ok = false;
  std::string problem;  // why it is not ok
  int64_t step = -1;
  int world_size = 0;
  nlohmann::json learner;  // learner.json
  std::vector<CheckpointFile> files;
};

// Checks one checkpoint directory against its manifest (sizes and checksums).
CheckpointInfo verify_checkpoint(const std::filesystem::path& dir);
// step_N directories under root, newest first.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& root);

// Gathers the full fp32 parameters and writes an HF directory on rank 0 (collective).
// With LoRA the adapters are merged in (W + scale * B A).
void export_hf(Learner& learner, const std::filesystem::path& dir, at::ScalarType dtype = at::kFloat);
// A LoRA learner's adapters as PEFT writes them (collective; rank 0 writes): `dir`/
// adapter_config.json (peft_type LORA, r, lora_alpha, lora_dropout, target_modules,
// base_model_name_or_path = `base_model`) and `dir`/adapter_model.safetensors (fp32;
// "base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight", ...).
void export_peft_adapter(Learner& learner, const std::filesystem::path& dir, const std::string& base_model);

}  // namespace rlx
