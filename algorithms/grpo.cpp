// GRPO (Shao et al., 2024): advantages normalised within each prompt's group,
// (r - mean) / std; with baseline "mean" it is Dr.GRPO (Liu et al., 2025), which
// pairs with the seq_mean_token_sum_norm aggregation. Clip-higher and dual-clip
// come from options.clip; KL to the reference from options.kl_coef.
#include "rlx/algo/algorithm.hpp"

namespace rlx::algo {

class Grpo : public PolicyGradient, public GroupAdvantages {
 public:
  explicit Grpo(const AlgoOptions& o) : PolicyGradient(o), GroupAdvantages(o.baseline) {}
};

void register_grpo() {
  register_algorithm("grpo", [](const AlgoOptions& o) { return std::make_unique<Grpo>(o); });
  register_algorithm("dr_grpo", [](AlgoOptions o) {
    o.baseline = GroupBaseline::mean;
    return std::make_unique<Grpo>(o);
  });
  register_algorithm("rloo", [](AlgoOptions o) {
    o.baseline = GroupBaseline::rloo;
    return std::make_unique<Grpo>(o);
  });
}

}  // namespace rlx::algo
