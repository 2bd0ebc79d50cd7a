// CISPO (MiniMax-M1, Chen et al., 2025): GRPO's group advantages with a REINFORCE-style
// token loss, each token weighted by its importance ratio clipped to [1 - clip_low,
// 1 + clip_high] under a stop-gradient (losses.hpp's cispo_policy_loss). Unlike PPO's clip, a
// token past the range still trains, at the capped weight: low-probability tokens that fork
// a reasoning chain keep their gradient. MiniMax tunes only the upper end (clip_low near
// 1 sets no lower bound); the loss is averaged over the step's tokens (token_mean).
#include "rlx/algo/algorithm.hpp"

namespace rlx::algo {

class Cispo : public PolicyGradient, public GroupAdvantages {
 public:
  explicit Cispo(const AlgoOptions& o) : PolicyGradient(o), GroupAdvantages(o.baseline) {}

 protected:
  PolicyLoss policy_loss(const LossInputs& in) const override {
    return cispo_policy_loss(in.logprobs, in.old_logprobs, in.advantages, opt_.clip);
  }
};

void register_cispo() {
  register_algorithm("cispo", [](const AlgoOptions& o) {
    RLX_CHECK(o.clip.dual_clip == 0, "algorithm cispo: dual_clip does not apply (it clips the weight, not the surrogate)");
    return std::make_unique<Cispo>(o);
  });
}

}  // namespace rlx::algo
