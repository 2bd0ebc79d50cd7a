// The algorithm interface: an algorithm turns the rewards of a batch of sample
// groups into advantages, and turns per-token log-probs (policy, old, reference,
// behaviour) into a loss plus named metric sums. Algorithms are chosen by name;
// the bundled ones (algorithms/) register themselves exactly as a user's would:
//
//   class MyAlgo : public rlx::algo::PolicyGradient { ... };
//   rlx::algo::register_algorithm("my_algo", [](const rlx::algo::AlgoOptions& o) {
//     return std::make_unique<MyAlgo>(o);
//   });
//   auto algo = rlx::algo::make_algorithm({.name = "grpo"});
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rlx/algo/advantages.hpp"
#include "rlx/algo/losses.hpp"
#include "rlx/core/config.hpp"

namespace rlx::algo {

struct AlgoOptions {
  std::string name = "grpo";
  GroupBaseline baseline = GroupBaseline::mean_std;  // group advantages (grpo: mean_std; Dr.GRPO: mean)
  Aggregation aggregation = Aggregation::token_mean;
  ClipRange clip;                                    // PPO-style ratio clipping
  double kl_coef = 0.0;                              // KL to the reference model in the loss (0: none)
  KlEstimator kl_estimator = KlEstimator::k3;
  double entropy_coef = 0.0;                         // entropy bonus (0: none)
  double max_tokens = 1024;                          // seq_mean_token_sum_norm's constant
  double tis_cap = 0.0;                              // truncated IS between sampler and learner (0: off)
  bool whiten_batch = true;                          // REINFORCE++: whiten advantages over the whole batch

  template <class V>
  void visit(V& v) {
    v("name", name, "algorithm: grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gspo, sft, or a registered one");
    v("baseline", baseline, "group advantage baseline (grpo: mean_std; Dr.GRPO: mean)");
    v("aggregation", aggregation, "how per-token losses become the step's loss (normalised over the whole step)");
    v("clip_low", clip.low, "ratio clip below: ratio >= 1 - clip_low", config::in_range(0, 0.999));
    v("clip_high", clip.high, "ratio clip above: ratio <= 1 + clip_high (DAPO clip-higher: > clip_low)",
      config::at_least(0));
    v("dual_clip", clip.dual_clip, "dual-clip constant c > 1 for negative advantages; 0 off", config::at_least(0));
    v("kl_coef", kl_coef, "KL-to-reference coefficient in the loss; 0: no reference model", config::at_least(0));
    v("kl_estimator", kl_estimator, "KL estimator: k1, k2 or k3");
    v("entropy_coef", entropy_coef, "entropy bonus coefficient", config::at_least(0));
    v("max_tokens", max_tokens, "the constant of seq_mean_token_sum_norm (the response-length limit)",
      config::greater_than(0));
    v("tis_cap", tis_cap, "truncated importance sampling cap between sampler and learner; 0 off", config::at_least(0));
    v("whiten_batch", whiten_batch, "REINFORCE++: whiten advantages over the whole batch");
  }
  void validate() const {
    RLX_CHECK(clip.dual_clip == 0 || clip.dual_clip > 1, "algorithm.dual_clip must be 0 or > 1, got {}", clip.dual_clip);
    RLX_CHECK(tis_cap == 0 || tis_cap >= 1, "algorithm.tis_cap must be 0 or >= 1, got {}", tis_cap);
  }
};

// One sample (response) of a group.
struct Sample {
  double reward = 0;
  int64_t response_tokens = 0;
};

// A batch's sums across every rank (for batch-wide statistics): sums `values` in place.
using AllReduceSum = std::function<void(std::vector<double>& values)>;

// The per-token inputs of a micro-batch's loss: [R, T], aligned with its targets.
// Undefined tensors were not provided.
struct LossInputs {
  at::Tensor mask;                // float, 1 where the token is trained
  at::Tensor sequence;            // int64, the sequence of each token (-1 padding)
  at::Tensor logprobs;            // the policy's, with gradient
  at::Tensor entropy;             // when needs_entropy()
  at::Tensor advantages;          // per token
  at::Tensor old_logprobs;        // the policy before this step's updates (PPO ratio)
  at::Tensor ref_logprobs;        // the frozen reference model's
  at::Tensor behaviour_logprobs;  // the sampler's
};

using Metrics = std::map<std::string, double>;

class Algorithm {
 public:
  explicit Algorithm(AlgoOptions options) : opt_(std::move(options)) {}
  virtual ~Algorithm() = default;
  const AlgoOptions& options() const { return opt_; }

  // One advantage per sample, for every group of the rank's batch. `all_reduce` sums
  // across ranks for batch-wide statistics.
  virtual std::vector<std::vector<double>> advantages(const std::vector<std::vector<Sample>>& groups,
                                                      const AllReduceSum& all_reduce) const = 0;
  // The micro-batch's share of the step's loss; adds to `metrics` (names from metric_names()).
  virtual at::Tensor loss(const LossInputs& in, const Normalizers& norm, Metrics& metrics) const = 0;
  virtual std::vector<std::string> metric_names() const = 0;
  virtual bool needs_reference() const { return opt_.kl_coef > 0; }
  virtual bool needs_entropy() const { return opt_.entropy_coef > 0; }
  virtual bool needs_old_logprobs() const { return true; }

 protected:
  AlgoOptions opt_;
};

// The clipped-surrogate family (GRPO, RLOO, REINFORCE++, GSPO): ratio clipping
// (asymmetric, dual-clip), optional KL-in-loss, entropy bonus and truncated IS.
// Subclasses choose the advantages and, optionally, the log ratio.
class PolicyGradient : public Algorithm {
 public:
  using Algorithm::Algorithm;
  at::Tensor loss(const LossInputs& in, const Normalizers& norm, Metrics& metrics) const override;
  std::vector<std::string> metric_names() const override;

 protected:
  // The per-token log ratio pi / pi_old; undefined: logp - old_logp.
  virtual at::Tensor log_ratio(const LossInputs& in) const { return {}; }
};

using AlgorithmFactory = std::function<std::unique_ptr<Algorithm>(const AlgoOptions&)>;
void register_algorithm(const std::string& name, AlgorithmFactory factory);
// The algorithm options.name names; an unknown name is a ConfigError suggesting the closest.
std::unique_ptr<Algorithm> make_algorithm(const AlgoOptions& options);
std::vector<std::string> algorithm_names();

// Registers the algorithms in algorithms/ (idempotent).
void register_bundled_algorithms();

}  // namespace rlx::algo
