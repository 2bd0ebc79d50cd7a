// REINFORCE++ (Hu, 2025): the outcome reward as every token's return (gamma 1),
// optionally minus the group mean ("with baseline"), then whitened over the whole
// batch (every rank's samples), not per group.
#include "rlx/algo/algorithm.hpp"

namespace rlx::algo {

class ReinforcePP : public PolicyGradient, public OutcomeAdvantages {
 public:
  ReinforcePP(AlgoOptions o, bool baseline) : PolicyGradient(std::move(o)), baseline_(baseline) {}
  std::vector<std::vector<double>> advantages(const std::vector<std::vector<Sample>>& groups,
                                              const AllReduceSum& all_reduce) const override {
    auto out = group_advantages_of(groups, baseline_ ? GroupBaseline::mean : GroupBaseline::none);
    if (!opt_.whiten_batch) return out;
    // Batch statistics over tokens: each sample's advantage counts once per trained token.
    std::vector<double> values, weights;
    for (size_t i = 0; i < groups.size(); ++i)
      for (size_t j = 0; j < groups[i].size(); ++j) {
        values.push_back(out[i][j]);
        weights.push_back(static_cast<double>(groups[i][j].response_tokens));
      }
    const auto [mean, std] = weighted_mean_std(values, weights, all_reduce);
    for (auto& g : out)
      for (auto& a : g) a = (a - mean) / (std + 1e-8);
    return out;
  }

 private:
  bool baseline_;
};

void register_reinforce_pp() {
  register_algorithm("reinforce_pp", [](const AlgoOptions& o) { return std::make_unique<ReinforcePP>(o, false); });
  register_algorithm("reinforce_pp_baseline",
                     [](const AlgoOptions& o) { return std::make_unique<ReinforcePP>(o, true); });
}

}  // namespace rlx::algo
