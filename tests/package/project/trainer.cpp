// A trainer of an outside project: its own environment (a prompt and a reward function),
// its own algorithm with a hyperparameter of its own, on rlx's launcher.
//   ./my_trainer run run.yaml env.name=count_a algorithm.name=scaled_grpo algorithm.options={scale: 2}
#include <rlx/algo/algorithm.hpp>
#include <rlx/env/text_env.hpp>
#include <rlx/launch/main.hpp>

#include <algorithm>

using nlohmann::json;

// GRPO's group advantages, scaled by algorithm.options.scale.
class ScaledGrpo : public rlx::algo::PolicyGradient, public rlx::algo::OutcomeAdvantages {
 public:
  explicit ScaledGrpo(const rlx::algo::AlgoOptions& o)
      : PolicyGradient(o), scale_(rlx::algo::option(o, "scale", 1.0, rlx::config::greater_than(0))) {}
  std::vector<std::vector<double>> advantages(const std::vector<std::vector<rlx::algo::Sample>>& groups,
                                              const rlx::algo::AllReduceSum&) const override {
    std::vector<std::vector<double>> out;
    for (const auto& g : groups) {
      std::vector<double> rewards;
      for (const auto& s : g) rewards.push_back(s.reward);
      out.push_back(rlx::algo::group_advantages(rewards, opt_.baseline));
      for (auto& a : out.back()) a *= scale_;
    }
    return out;
  }

 private:
  double scale_;
};

int main(int argc, char** argv) {
  return rlx::launch::trainer_main(argc, argv, "my_trainer", [] {
    rlx::env::add_text_env({
        .name = "count_a",
        .description = "answer with as many a's as the prompt asks for",
        .prompt = [](const json& task) { return "a x " + std::to_string(task.at("n").get<int>()) + ":"; },
        .reward = [](const json& task, std::string_view answer) {
          return std::count(answer.begin(), answer.end(), 'a') == task.at("n").get<int>() ? 1.0 : 0.0;
        },
        .tasks = [](uint64_t, uint64_t index, const json&) -> json { return {{"n", 1 + index % 3}}; }});
    rlx::algo::register_algorithm(
        "scaled_grpo", [](const rlx::algo::AlgoOptions& o) { return std::make_unique<ScaledGrpo>(o); },
        {{"scale", "advantage scale, > 0 (default 1)"}});
  });
}
