// A step's sample statistics (learner/sample_stats.hpp).
#include "rlx/learner/sample_stats.hpp"

#include <cmath>

namespace rlx {

using nlohmann::json;

void SampleStats::add(std::string_view finish, std::string_view metadata) {
  ++samples_;
  if (finish == "length") ++truncated_;
  if (metadata.empty()) return;
  const auto j = json::parse(metadata, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  if (const auto env = j.find("env"); env != j.end() && env->is_object())
    for (const auto& [key, value] : env->items()) {
      if (!value.is_number()) continue;
      if (!env_.contains(key) && env_.size() >= kMaxStepCounters) continue;
      const double v = value.get<double>();
      if (std::isfinite(v)) env_[key] += v;
    }
  const auto e = j.find("reward_env"), m = j.find("reward_model");
  if (e != j.end() && m != j.end() && e->is_number() && m->is_number())
    reward_env_ += e->get<double>(), reward_model_ += m->get<double>(), ++scored_;
}

void SampleStats::add_to(json& line) const {
  if (samples_ == 0) return;
  const auto n = static_cast<double>(samples_);
  line["truncated_fraction"] = static_cast<double>(truncated_) / n;
  for (const auto& [key, sum] : env_) {
    line["env_" + key] = sum;
    line["env_" + key + "_mean"] = sum / n;
  }
  if (scored_ > 0) {
    line["reward_env_mean"] = reward_env_ / static_cast<double>(scored_);
    line["reward_model_mean"] = reward_model_ / static_cast<double>(scored_);
  }
}

}  // namespace rlx
