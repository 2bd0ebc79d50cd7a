// PPO for language models (Ouyang et al., 2022; Ziegler et al., 2019): a critic's
// values turn each sequence's reward into per-token advantages by GAE (gamma,
// lambda), whitened over the batch. The KL to the reference enters as a per-token
// reward penalty (kl_placement = reward, the classic setting) or as a loss term; its
// coefficient is fixed or adaptive (kl_target). The policy loss is the clipped
// surrogate of PolicyGradient; the critic is a separate network trained on the
// clipped value loss, or a value head whose loss joins the policy's (critic = head).
#include "rlx/algo/algorithm.hpp"
#include "rlx/core/error.hpp"

namespace rlx::algo {

class Ppo : public PolicyGradient, public CriticAdvantages {
 public:
  using PolicyGradient::PolicyGradient;
  std::vector<std::string> value_metric_names() const override { return {"value_loss", "value_clipped", "value"}; }
  at::Tensor value_loss(const LossInputs& in, const Normalizers& norm, MetricSums& metrics) const override {
    return clipped_value_loss(opt_, in, norm, metrics);
  }

  std::vector<TokenTargets> token_advantages(const std::vector<TokenTrajectory>& batch,
                                             const AllReduceSum& all_reduce) const override {
    std::vector<TokenTargets> out;
    for (const auto& t : batch) {
      const int64_t n = t.values.defined() ? t.values.size(0) : 0;
      if (n == 0) {
        out.push_back({at::zeros({0}, at::kDouble), at::zeros({0}, at::kDouble)});
        continue;
      }
      auto rewards = at::zeros({n}, at::kDouble);
      if (opt_.kl_placement == KlPlacement::reward && kl_coef_ > 0) {
        RLX_CHECK(t.old_logprobs.defined() && t.ref_logprobs.defined(),
                  "ppo: a KL penalty in the reward needs old and reference log-probs");
        rewards -= kl_coef_ * kl_penalty(t.old_logprobs.to(at::kDouble), t.ref_logprobs.to(at::kDouble),
                                         opt_.kl_estimator);
      }
      rewards[n - 1] += t.reward;
      auto [adv, ret] = gae(rewards, t.values, opt_.gamma, opt_.gae_lambda);
      out.push_back({adv, ret});
    }
    if (opt_.whiten_batch) {
      std::vector<at::Tensor> parts;
      for (const auto& o : out) parts.push_back(o.advantages);
      auto all = at::cat(parts).contiguous();
      const double* p = all.data_ptr<double>();
      const std::vector<double> values(p, p + all.numel());
      const auto [mean, std] = weighted_mean_std(values, std::vector<double>(values.size(), 1.0), all_reduce);
      for (auto& o : out) o.advantages = (o.advantages - mean) / (std + 1e-8);
    }
    return out;
  }
};

void register_ppo() {
  register_algorithm("ppo", [](AlgoOptions o) {
    return std::make_unique<Ppo>(o);
  });
}

}  // namespace rlx::algo
