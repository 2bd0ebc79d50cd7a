// An algorithm's options (the `algorithm:` section of a run config) and the enums they
// name: torch-free, so reading a config compiles no ATen.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "rlx/core/config.hpp"

namespace rlx::algo {

enum class GroupBaseline {
  mean_std,  // GRPO: (r - mean) / (std + eps), std the unbiased sample std of the group
  mean,      // Dr.GRPO: r - mean (no std: no difficulty re-weighting)
  rloo,      // RLOO: r - mean of the *other* samples = n / (n - 1) * (r - mean)
  none,      // REINFORCE without a baseline: r
};

constexpr std::array<std::pair<GroupBaseline, std::string_view>, 4> enum_names(GroupBaseline) {
  return {{{GroupBaseline::mean_std, "mean_std"}, {GroupBaseline::mean, "mean"}, {GroupBaseline::rloo, "rloo"},
           {GroupBaseline::none, "none"}}};
}

enum class Aggregation {
  token_mean,               // sum over every trained token / trained tokens in the step
  seq_mean_token_sum,       // mean over sequences of each sequence's token sum
  seq_mean_token_mean,      // mean over sequences of each sequence's token mean
  seq_mean_token_sum_norm,  // token sum / (sequences x max_tokens): Dr.GRPO's constant normaliser
};
constexpr std::array<std::pair<Aggregation, std::string_view>, 4> enum_names(Aggregation) {
  return {{{Aggregation::token_mean, "token_mean"},
           {Aggregation::seq_mean_token_sum, "seq_mean_token_sum"},
           {Aggregation::seq_mean_token_mean, "seq_mean_token_mean"},
           {Aggregation::seq_mean_token_sum_norm, "seq_mean_token_sum_norm"}}};
}

struct ClipRange {
  double low = 0.2;        // ratio >= 1 - low
  double high = 0.2;       // ratio <= 1 + high (DAPO clip-higher: high > low)
  double dual_clip = 0.0;  // > 1: for negative advantages the loss is at most dual_clip * |A| (0: off)
};

enum class KlEstimator { k1, k2, k3 };
constexpr std::array<std::pair<KlEstimator, std::string_view>, 3> enum_names(KlEstimator) {
  return {{{KlEstimator::k1, "k1"}, {KlEstimator::k2, "k2"}, {KlEstimator::k3, "k3"}}};
}

// Where the KL to the reference model enters: a loss term (GRPO) or a per-token
// reward penalty -kl_coef * (logp_old - logp_ref) (PPO, Ziegler et al. 2019).
enum class KlPlacement { loss, reward };
constexpr std::array<std::pair<KlPlacement, std::string_view>, 2> enum_names(KlPlacement) {
  return {{{KlPlacement::loss, "loss"}, {KlPlacement::reward, "reward"}}};
}
// PPO's value model: a separate critic network, or a value head on the policy trained
// with the policy loss (loss + vf_coef * value loss).
enum class CriticKind { separate, head };
constexpr std::array<std::pair<CriticKind, std::string_view>, 2> enum_names(CriticKind) {
  return {{{CriticKind::separate, "separate"}, {CriticKind::head, "head"}}};
}

// Correcting the mismatch between the sampler's log-probs (behaviour) and the learner's
// (old, before this step's update), per token rho = exp(old - behaviour) or per sequence
// rho_seq = exp(sum, or mean, of the sequence's log ratios). Each mode weights the policy
// loss without gradient:
//   token_truncate     min(rho, high)                          truncated IS (TIS)
//   token_mask         rho, or 0 where rho leaves [low, high]  masked IS (MIS), per token
//   sequence_truncate  min(rho_seq, high) on every token        sequence-level IS
//   sequence_mask      rho_seq, or 0 for the whole sequence where rho_seq leaves [low, high]
//   icepop             token_mask with a two-sided band, low > 0 (IcePop, Ring-1T: [0.5, 5])
enum class Mismatch { none, token_truncate, token_mask, sequence_truncate, sequence_mask, icepop };
constexpr std::array<std::pair<Mismatch, std::string_view>, 6> enum_names(Mismatch) {
  return {{{Mismatch::none, "none"},
           {Mismatch::token_truncate, "token_truncate"},
           {Mismatch::token_mask, "token_mask"},
           {Mismatch::sequence_truncate, "sequence_truncate"},
           {Mismatch::sequence_mask, "sequence_mask"},
           {Mismatch::icepop, "icepop"}}};
}
// A sequence's ratio: the product of its token ratios (sequence-level IS) or their geometric
// mean (length-independent, as GSPO's).
enum class SequenceRatio { product, geometric };
constexpr std::array<std::pair<SequenceRatio, std::string_view>, 2> enum_names(SequenceRatio) {
  return {{{SequenceRatio::product, "product"}, {SequenceRatio::geometric, "geometric"}}};
}
struct MismatchOptions {
  Mismatch mode = Mismatch::none;
  double low = 0.0;   // the band's lower end (mask modes; 0: one-sided)
  double high = 2.0;  // the truncation cap, or the band's upper end
  SequenceRatio sequence_ratio = SequenceRatio::product;
};

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
  MismatchOptions mismatch;                          // sampler/learner mismatch correction (tis_cap: token_truncate)
  bool whiten_batch = true;                          // REINFORCE++ and PPO: whiten advantages over the whole batch
  KlPlacement kl_placement = KlPlacement::loss;
  double kl_target = 0.0;                            // > 0: adaptive KL coefficient toward this KL per sequence
  double kl_horizon = 10000;                         // the adaptive controller's horizon (sequences)
  double gamma = 1.0;                                // PPO: discount
  double gae_lambda = 0.95;                          // PPO: GAE lambda
  double value_clip = 0.2;                           // PPO: value clipping around the old values; 0 off
  double vf_coef = 0.5;                              // PPO with critic = head: weight of the value loss
  CriticKind critic = CriticKind::separate;
  double critic_lr = 0.0;                            // the separate critic's learning rate (0: learner.lr)
  int64_t epochs = 1;                                // passes over each batch
  int64_t overlong_buffer = 0;                       // DAPO soft overlong penalty over the last N tokens (0: off)
  int64_t max_response_tokens = 0;                   // ... of responses up to this many tokens
  double overlong_factor = 1.0;                      // ... scaled by this
  bool mask_truncated = false;                       // DAPO overlong filtering: samples cut by max_new_tokens train nothing
  int64_t mini_batches = 1;                          // optimizer steps per pass
  std::string teacher;                               // distill: the teacher's HF directory
  bool routing_replay = false;                       // mixture-of-experts: the learner uses the sampler's experts
  std::map<std::string, std::string> options;        // a registered algorithm's own (see option())

  template <class V>
  void visit(V& v) {
    v("name", name, "algorithm: grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gspo, cispo, ppo, sft, or a registered one");
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
    v("tis_cap", tis_cap, "truncated importance sampling cap between sampler and learner; 0 off (the same as "
      "mismatch: token_truncate with mismatch_high)", config::at_least(0));
    v("mismatch", mismatch.mode, "sampler/learner mismatch correction: none, token_truncate (TIS), token_mask (MIS), "
      "sequence_truncate, sequence_mask, icepop (algo/losses.hpp, mismatch_weights)");
    v("mismatch_low", mismatch.low, "the mask modes' band, lower end (0: one-sided; icepop needs > 0)",
      config::at_least(0));
    v("mismatch_high", mismatch.high, "the truncation cap, or the mask modes' band upper end", config::greater_than(0));
    v("mismatch_sequence_ratio", mismatch.sequence_ratio,
      "a sequence's ratio for the sequence modes: product (sequence-level IS) or geometric (mean log ratio)");
    v("whiten_batch", whiten_batch, "REINFORCE++ and PPO: whiten advantages over the whole batch");
    v("kl_placement", kl_placement, "where the KL to the reference enters: loss (GRPO) or reward (PPO)");
    v("kl_target", kl_target, "> 0: adapt kl_coef toward this KL per sequence (Ziegler et al.); 0: fixed",
      config::at_least(0));
    v("kl_horizon", kl_horizon, "the adaptive KL controller's horizon, in sequences", config::greater_than(0));
    v("gamma", gamma, "PPO: discount factor", config::in_range(0, 1));
    v("gae_lambda", gae_lambda, "PPO: GAE lambda", config::in_range(0, 1));
    v("value_clip", value_clip, "PPO: clip values to old +- value_clip in the value loss; 0 off", config::at_least(0));
    v("vf_coef", vf_coef, "PPO with critic = head: the value loss's weight", config::at_least(0));
    v("critic", critic, "PPO's value model: separate (its own network) or head (on the policy)");
    v("critic_lr", critic_lr, "the separate critic's learning rate; 0: learner.lr", config::at_least(0));
    v("epochs", epochs, "passes over each batch (PPO epochs)", config::in_range(1, 64));
    v("mini_batches", mini_batches, "optimizer steps per pass over a batch", config::in_range(1, 4096));
    v("overlong_buffer", overlong_buffer, "DAPO soft overlong penalty: 0 off, else the last N tokens before "
      "max_response_tokens cost up to overlong_factor", config::at_least(0));
    v("max_response_tokens", max_response_tokens, "the response-length limit the overlong penalty refers to",
      config::at_least(0));
    v("overlong_factor", overlong_factor, "the overlong penalty's largest value", config::at_least(0));
    v("mask_truncated", mask_truncated,
      "DAPO's overlong filtering: samples cut by rollout.max_new_tokens (finish \"length\") get no loss; their rewards "
      "still count in their group's advantages (beside the soft overlong penalty, which shapes the reward)");
    v("teacher", teacher, "on-policy distillation (algorithm distill): the teacher's HF directory, frozen and "
      "sharded like the reference model; same tokenizer as the student");
    v("routing_replay", routing_replay,
      "mixture-of-experts models: the learner's forwards use the experts the rollout engine's router chose for each "
      "token (recorded with the trajectory), gate weights from the learner's own router; tokens without a record "
      "route themselves. moe/routing_agreement is reported either way");
    v("options", options, "the algorithm's own options, declared when it registers (a key it does not declare is an "
      "error listing those it does); each value is read as JSON when it parses, else as text");
  }
  void validate() const {
    RLX_CHECK(overlong_buffer == 0 || (max_response_tokens > overlong_buffer),
              "algorithm.max_response_tokens ({}) must exceed algorithm.overlong_buffer ({})", max_response_tokens,
              overlong_buffer);
    RLX_CHECK(clip.dual_clip == 0 || clip.dual_clip > 1, "algorithm.dual_clip must be 0 or > 1, got {}", clip.dual_clip);
    RLX_CHECK(tis_cap == 0 || tis_cap >= 1, "algorithm.tis_cap must be 0 or >= 1, got {}", tis_cap);
    RLX_CHECK(tis_cap == 0 || mismatch.mode == Mismatch::none,
              "algorithm.tis_cap and algorithm.mismatch: choose one (tis_cap is mismatch: token_truncate)");
    RLX_CHECK(mismatch.low < mismatch.high, "algorithm.mismatch_low ({}) must be below algorithm.mismatch_high ({})",
              mismatch.low, mismatch.high);
    RLX_CHECK(mismatch.mode != Mismatch::icepop || mismatch.low > 0,
              "algorithm.mismatch: icepop masks on both sides: set algorithm.mismatch_low > 0 (e.g. 0.5)");
    RLX_CHECK((mismatch.mode != Mismatch::token_truncate && mismatch.mode != Mismatch::sequence_truncate) ||
                  mismatch.high >= 1,
              "algorithm.mismatch_high must be >= 1 to truncate importance weights, got {}", mismatch.high);
  }
};

}  // namespace rlx::algo
