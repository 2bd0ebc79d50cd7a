// What a step's samples say beyond their rewards, for its metrics line, from each
// trajectory's finish reason and metadata (rl/worker.hpp, to_trajectory_group):
//   truncated_fraction                  the share of samples cut by max_new_tokens (finish "length")
//   env_<key>, env_<key>_mean           an environment counter's sum over the step's samples
//                                       and its mean per sample (math: env_errors_unparsed, ...)
//   reward_env_mean, reward_model_mean  with a reward model, the means of the reward's two parts
// Metadata that is not a JSON object of that shape is skipped (a user's own worker may send
// anything there); at most kMaxStepCounters environment counters are kept per step.
//
//   rlx::SampleStats stats;
//   for (const auto& s : group.samples) stats.add(s.finish, s.metadata);
//   stats.add_to(line);   // line["env_errors_unparsed"] == 3, line["truncated_fraction"] == 0.25, ...
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace rlx {

class SampleStats {
 public:
  static constexpr size_t kMaxStepCounters = 64;
  void add(std::string_view finish, std::string_view metadata);
  void add_to(nlohmann::json& line) const;

 private:
  int64_t samples_ = 0, truncated_ = 0;
  std::map<std::string, double> env_;
  double reward_env_ = 0, reward_model_ = 0;
  int64_t scored_ = 0;
};

}  // namespace rlx
