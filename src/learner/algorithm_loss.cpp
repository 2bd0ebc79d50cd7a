#include "rlx/learner/algorithm_loss.hpp"

namespace rlx {

LossFn algorithm_loss(const algo::Algorithm& algorithm) {
  return [&algorithm](const MicroBatch& mb, const TokenOutputs& out, const StepContext& ctx, Metrics& metrics) {
    auto value = [&](const char* name) {
      auto it = mb.values.find(name);
      return it == mb.values.end() ? at::Tensor() : it->second.to(out.logprobs.device());
    };
    algo::LossInputs in;
    in.mask = mb.loss_mask.to(out.logprobs.device());
    in.sequence = mb.sequence.to(out.logprobs.device());
    in.logprobs = out.logprobs;
    in.entropy = out.entropy;
    in.advantages = value("advantages");
    in.old_logprobs = value("old_logprobs");
    in.ref_logprobs = value("ref_logprobs");
    in.behaviour_logprobs = value("behaviour_logprobs");
    const algo::Normalizers norm{.tokens = std::max(ctx.global_loss_tokens, 1.0),
                                 .sequences = std::max(ctx.global_sequences, 1.0),
                                 .max_tokens = algorithm.options().max_tokens};
    return algorithm.loss(in, norm, metrics);
  };
}

void set_advantage(Sequence& seq, double advantage) {
  seq.values["advantages"] = std::vector<float>(seq.tokens.size(), static_cast<float>(advantage));
}

}  // namespace rlx
