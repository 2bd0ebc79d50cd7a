// Hooks: a trainer observes and extends a run without copying the learner's loop. Added in
// trainer_main's register_parts (which runs in every process), they run in the learner:
//
//   rlx::launch::add_hooks({
//       .on_rewards = [](int64_t step, std::vector<double>& rewards, const std::vector<size_t>& groups) {
//         for (auto& r : rewards) r = std::clamp(r, -1.0, 1.0);    // before the advantages
//       },
//       .on_step = [](int64_t step, nlohmann::json& metrics) { metrics["my_metric"] = 1.0; },
//       .on_checkpoint = [](int64_t step, const std::filesystem::path& dir) { upload(dir); }});
//
// Hooks run in the order added. A hook that throws stops the run with its error.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

namespace rlx::launch {

struct Hooks {
  // Every learner rank, before the advantages: the rank's sequences' rewards, in group
  // order (group g holds group_sizes[g] consecutive entries); change them in place. It must
  // give every rank's part the same treatment (it sees only its own part).
  std::function<void(int64_t step, std::vector<double>& rewards, const std::vector<size_t>& group_sizes)> on_rewards;
  // Learner rank 0, after each step: its metrics.jsonl line (add keys; rlx's own are there).
  std::function<void(int64_t step, nlohmann::json& metrics)> on_step;
  // Learner rank 0, after the checkpoint of `step` is committed in `dir`.
  std::function<void(int64_t step, const std::filesystem::path& dir)> on_checkpoint;
};

void add_hooks(Hooks hooks);
// Those added so far (the learner calls them).
const std::vector<Hooks>& hooks();

}  // namespace rlx::launch
