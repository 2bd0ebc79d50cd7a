// On-policy distillation (Agarwal et al., 2024, GKD; Thinking Machines, 2025): the student
// samples, a frozen teacher (algorithm.teacher, an HF directory) scores the sampled tokens,
// and each token's advantage is the negative reverse KL estimate log p_teacher - log p_student
// (the student's log-probs before the update), times distill_coef. reward_coef > 0 adds the
// group advantages of the environment's reward (GRPO's, options.baseline), so a run can
// distil and learn from the reward at once. The rest is PolicyGradient's clipped surrogate.
#include "rlx/algo/algorithm.hpp"

namespace rlx::algo {

class Distill : public PolicyGradient, public OutcomeAdvantages {
 public:
  explicit Distill(AlgoOptions o)
      : PolicyGradient(o),
        distill_coef_(option<double>(o, "distill_coef", 1.0, config::greater_than(0))),
        reward_coef_(option<double>(o, "reward_coef", 0.0, config::at_least(0))) {
    if (o.teacher.empty()) throw ConfigError("algorithm.teacher: algorithm distill needs the teacher's HF directory");
    if (o.kl_coef != 0 || o.kl_target != 0)
      throw ConfigError("algorithm distill: the teacher's KL is the advantage; kl_coef and kl_target must be 0");
  }
  bool needs_teacher() const override { return true; }
  std::vector<std::vector<double>> advantages(const std::vector<std::vector<Sample>>& groups,
                                              const AllReduceSum&) const override {
    auto out = group_advantages_of(groups, opt_.baseline);
    for (auto& g : out)
      for (auto& a : g) a *= reward_coef_;
    return out;
  }
  at::Tensor loss(const LossInputs& in, const Normalizers& norm, MetricSums& metrics) const override {
    RLX_CHECK(in.teacher_logprobs.defined(), "distill: the batch has no teacher log-probs");
    RLX_CHECK(in.old_logprobs.defined(), "distill: the batch has no old log-probs");
    auto reverse_kl = (in.old_logprobs - in.teacher_logprobs).detach();  // per sampled token
    LossInputs d = in;
    d.advantages = in.advantages - distill_coef_ * reverse_kl;
    metrics.add("teacher_kl", (reverse_kl * in.mask).sum());
    return PolicyGradient::loss(d, norm, metrics);
  }
  std::vector<std::string> metric_names() const override {
    auto names = PolicyGradient::metric_names();
    names.push_back("teacher_kl");
    return names;
  }

 private:
  double distill_coef_, reward_coef_;
};

void register_distill() {
  register_algorithm("distill", [](const AlgoOptions& o) { return std::make_unique<Distill>(o); },
                     {{"distill_coef", "the weight of the per-token reverse KL to the teacher in the advantage (1)"},
                      {"reward_coef", "the weight of the reward's group advantages (0: distillation alone)"}});
}

}  // namespace rlx::algo
