// GSPO (Zheng et al., 2025): GRPO's group advantages with a sequence-level
// importance ratio (the geometric mean of the token ratios), clipped per sequence.
// Its clip ranges are small (the paper: 3e-4 / 4e-4) and its aggregation is
// seq_mean_token_mean; both come from the options.
#include "rlx/algo/algorithm.hpp"

namespace rlx::algo {

class Gspo : public PolicyGradient, public GroupAdvantages {
 public:
  explicit Gspo(const AlgoOptions& o) : PolicyGradient(o), GroupAdvantages(o.baseline) {}

 protected:
  at::Tensor log_ratio(const LossInputs& in) const override {
    return gspo_log_ratio(in.logprobs, in.old_logprobs, in.mask, in.sequence);
  }
};

void register_gspo() {
  register_algorithm("gspo", [](const AlgoOptions& o) { return std::make_unique<Gspo>(o); });
}

}  // namespace rlx::algo
