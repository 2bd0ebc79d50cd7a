// The algorithm interface: an algorithm turns the rewards of a batch of sample
// groups into advantages, and turns per-token log-probs (policy, old, reference,
// behaviour) into a loss plus named metric sums. Algorithms are chosen by name;
// the bundled ones (algorithms/) register themselves exactly as a user's would:
//
//   class MyAlgo : public rlx::algo::PolicyGradient, public rlx::algo::OutcomeAdvantages { ... };
//   rlx::algo::register_algorithm("my_algo", [](const rlx::algo::AlgoOptions& o) {
//     return std::make_unique<MyAlgo>(o);
//   }, {{"beta", "my algorithm's beta, >= 0 (default 0.1)"}});
//   auto algo = rlx::algo::make_algorithm({.name = "grpo"});
//
// An algorithm's own hyperparameters are `algorithm.options` in a config (options: {beta:
// 0.3}): declared when it registers (a key it does not declare is an error naming the key,
// with the declared ones and their docs), read in its constructor with option():
//
//   beta_ = rlx::algo::option(o, "beta", 0.1, rlx::config::at_least(0));
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rlx/algo/advantages.hpp"
#include "rlx/algo/losses.hpp"
#include "rlx/algo/options.hpp"
#include "rlx/core/config.hpp"
#include "rlx/core/metric_sums.hpp"

namespace rlx::algo {


// One sample (response) of a group.
struct Sample {
  double reward = 0;
  int64_t response_tokens = 0;
};

// The per-token inputs of a micro-batch's loss: [R, T], aligned with its targets.
// Undefined tensors were not provided.
struct LossInputs {
  at::Tensor mask;                // float, 1 where the token is trained
  at::Tensor sequence;            // int64, the sequence of each token (-1 padding)
  at::Tensor logprobs;            // the policy's, with gradient
  at::Tensor entropy;             // per token, without gradient unless options().entropy_coef > 0
  at::Tensor advantages;          // per token
  at::Tensor old_logprobs;        // the policy before this step's updates (PPO ratio)
  at::Tensor ref_logprobs;        // the frozen reference model's
  at::Tensor teacher_logprobs;    // a distillation teacher's (Algorithm::needs_teacher())
  at::Tensor behaviour_logprobs;  // the sampler's
  at::Tensor values;              // the value head's, with gradient (PPO with critic = head, or the critic)
  at::Tensor old_values;          // the values before this batch's updates (value clipping)
  at::Tensor returns;             // per token: the value targets (PPO)
};

// One sequence's trained tokens, in order, for per-token advantages (PPO): [n] each.
struct TokenTrajectory {
  double reward = 0;        // the sequence's reward, given at its last trained token
  at::Tensor values;        // V(s_t) from the critic
  at::Tensor old_logprobs;  // the policy's before this batch's updates
  at::Tensor ref_logprobs;  // the reference model's (when the KL goes into the reward)
};
struct TokenTargets {
  at::Tensor advantages;  // [n]
  at::Tensor returns;     // [n] value targets
};

// Named numbers: a step's sums once read (MetricSums::values()), and their means.
using Metrics = std::map<std::string, double>;

// Each group's advantages from its samples' rewards (advantages.hpp's group_advantages).
std::vector<std::vector<double>> group_advantages_of(const std::vector<std::vector<Sample>>& groups, GroupBaseline baseline);

// An algorithm: the loss of a micro-batch and what the learner must give it. How it makes
// advantages is one of the two interfaces below, which it also derives from: from each
// group's rewards (OutcomeAdvantages: GRPO, RLOO, REINFORCE++, GSPO, CISPO, SFT) or from a critic's
// values (CriticAdvantages: PPO). make_algorithm() refuses one with neither or both.
class OutcomeAdvantages;
class CriticAdvantages;
class Algorithm {
 public:
  explicit Algorithm(AlgoOptions options) : opt_(std::move(options)) {}
  virtual ~Algorithm() = default;
  const AlgoOptions& options() const { return opt_; }

  // The micro-batch's share of the step's loss; adds to `metrics` (names from metric_names()).
  virtual at::Tensor loss(const LossInputs& in, const Normalizers& norm, MetricSums& metrics) const = 0;
  virtual std::vector<std::string> metric_names() const = 0;
  virtual bool needs_reference() const { return opt_.kl_coef > 0 || opt_.kl_target > 0; }
  virtual bool needs_old_logprobs() const { return true; }
  // On-policy distillation: a frozen teacher (options().teacher) scores the sampled tokens.
  virtual bool needs_teacher() const { return false; }

  // How it makes advantages: exactly one of these is not null.
  const OutcomeAdvantages* outcome() const;
  const CriticAdvantages* critic() const;
  bool needs_critic() const { return critic() != nullptr; }

  // The KL coefficient in force (adaptive when options().kl_target > 0), and the
  // controller's update after a batch whose mean KL per sequence was `kl` over
  // `sequences` sequences. The coefficient is state: save it with the run.
  double kl_coef() const { return kl_coef_; }
  void set_kl_coef(double c) { kl_coef_ = c; }
  void observe_kl(double kl, double sequences);

  // Step-wide sums (Learner StepResult::metrics) into means: per-token sums divided by
  // the token count (clip fraction, ratio, KL, entropy, ...), losses as they are.
  static Metrics means(const Metrics& sums);

 protected:
  AlgoOptions opt_;
  double kl_coef_ = opt_.kl_coef;
};

// Advantages from the rewards of each prompt's group of samples.
class OutcomeAdvantages {
 public:
  virtual ~OutcomeAdvantages() = default;
  // One advantage per sample, for every group of the rank's batch. `all_reduce` sums
  // across ranks for batch-wide statistics.
  virtual std::vector<std::vector<double>> advantages(const std::vector<std::vector<Sample>>& groups,
                                                      const AllReduceSum& all_reduce) const = 0;
};

// Advantages from each group's rewards by a group baseline (GRPO, GSPO, CISPO: their
// options().baseline), group_advantages_of.
class GroupAdvantages : public OutcomeAdvantages {
 public:
  explicit GroupAdvantages(GroupBaseline baseline) : baseline_(baseline) {}
  std::vector<std::vector<double>> advantages(const std::vector<std::vector<Sample>>& groups,
                                              const AllReduceSum&) const override {
    return group_advantages_of(groups, baseline_);
  }

 private:
  GroupBaseline baseline_;
};

// Advantages from a critic's values, and the critic's loss (a separate network, or a value
// head on the policy: algorithm.critic).
class CriticAdvantages {
 public:
  virtual ~CriticAdvantages() = default;
  // Per-token advantages and value targets, one entry per sequence. `all_reduce` sums
  // across ranks.
  virtual std::vector<TokenTargets> token_advantages(const std::vector<TokenTrajectory>& batch,
                                                     const AllReduceSum& all_reduce) const = 0;
  virtual at::Tensor value_loss(const LossInputs& in, const Normalizers& norm, MetricSums& metrics) const = 0;
  virtual std::vector<std::string> value_metric_names() const = 0;
};

// The clipped value loss (options.value_clip; 0: plain squared error) over the trained
// tokens, adding value_loss, value and value_clipped to `metrics`: what PPO's critic uses.
at::Tensor clipped_value_loss(const AlgoOptions& options, const LossInputs& in, const Normalizers& norm,
                              MetricSums& metrics);

// What a batch looked like, summed over every rank: reward mean/std, advantage
// mean/std/min/max, response length mean/max. rewards, advantages (one per trained
// token, or per sample) and response lengths are this rank's.
Metrics batch_metrics(const std::vector<double>& rewards, const std::vector<double>& advantages,
                      const std::vector<int64_t>& response_lengths, const AllReduceSum& all_reduce,
                      const std::function<void(std::vector<double>&)>& all_reduce_max = {});

// The clipped-surrogate family (GRPO, RLOO, REINFORCE++, GSPO, CISPO, PPO): ratio clipping
// (asymmetric, dual-clip), optional KL-in-loss, entropy bonus and truncated IS.
// Subclasses add how they make advantages and, optionally, the log ratio.
class PolicyGradient : public Algorithm {
 public:
  using Algorithm::Algorithm;
  at::Tensor loss(const LossInputs& in, const Normalizers& norm, MetricSums& metrics) const override;
  std::vector<std::string> metric_names() const override;

 protected:
  // The per-token policy loss before mismatch weights, KL and entropy: PPO's clipped
  // surrogate on log_ratio() by default (CISPO's clipped-weight REINFORCE overrides it).
  virtual PolicyLoss policy_loss(const LossInputs& in) const {
    return clipped_policy_loss(in.logprobs, in.old_logprobs, in.advantages, opt_.clip, log_ratio(in));
  }
  // The per-token log ratio pi / pi_old; undefined: logp - old_logp.
  virtual at::Tensor log_ratio(const LossInputs& in) const { return {}; }
};

using AlgorithmFactory = std::function<std::unique_ptr<Algorithm>(const AlgoOptions&)>;
// One key of an algorithm's own options (algorithm.options.KEY) and what it means.
struct AlgoOption {
  std::string key, doc;
};
void register_algorithm(const std::string& name, AlgorithmFactory factory, std::vector<AlgoOption> options = {});
// The options `name` declared when it registered (empty for an unknown name).
std::vector<AlgoOption> algorithm_options(const std::string& name);

// The value of algorithm.options.KEY as T (double, int64_t, bool or std::string), or
// `fallback` when the config does not set it; a value of the wrong type or outside `bounds`
// is a ConfigError naming algorithm.options.KEY.
template <class T>
T option(const AlgoOptions& o, const std::string& key, T fallback, config::Bounds bounds = {});
// The algorithm options.name names; an unknown name, or a key of options.options that the
// algorithm did not declare, is a ConfigError suggesting the closest.
std::unique_ptr<Algorithm> make_algorithm(const AlgoOptions& options);
std::vector<std::string> algorithm_names();

// Registers the algorithms in algorithms/ (idempotent).
void register_bundled_algorithms();

}  // namespace rlx::algo
