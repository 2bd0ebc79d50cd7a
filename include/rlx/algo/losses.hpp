// Per-token policy-gradient losses and their aggregation. Every function takes and
// returns [R, T] tensors aligned with a micro-batch's targets; aggregate() turns a
// per-token loss into the micro-batch's share of the step's loss using step-wide
// (all micro-batches, all ranks) normalisers, so gradients do not depend on how a
// batch is split.
//
//   auto pg = rlx::algo::clipped_policy_loss(logp, old_logp, adv, {.low = 0.2, .high = 0.28});
//   auto loss = rlx::algo::aggregate(pg.loss, mask, sequence, Aggregation::token_mean, norm);
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <string>
#include <string_view>
#include <utility>

namespace rlx::algo {

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
Aggregation aggregation_from_string(const std::string& s);

// Step-wide counts (over every micro-batch and rank).
struct Normalizers {
  double tokens = 1;      // trained tokens
  double sequences = 1;   // sequences
  double max_tokens = 1;  // the constant of seq_mean_token_sum_norm (the response-length limit)
};

// per_token, mask [R, T]; sequence [R, T] int64 (which sequence each token belongs to,
// -1 for padding; a sequence never spans micro-batches). Returns a scalar.
at::Tensor aggregate(const at::Tensor& per_token, const at::Tensor& mask, const at::Tensor& sequence, Aggregation mode,
                     const Normalizers& norm);

struct ClipRange {
  double low = 0.2;        // ratio >= 1 - low
  double high = 0.2;       // ratio <= 1 + high (DAPO clip-higher: high > low)
  double dual_clip = 0.0;  // > 1: for negative advantages the loss is at most dual_clip * |A| (0: off)
};

struct PolicyLoss {
  at::Tensor loss;     // [R, T] per-token loss
  at::Tensor clipped;  // [R, T] 1 where the clipped surrogate was the one taken (no gradient there)
  at::Tensor ratio;    // [R, T] pi / pi_old, detached
};

// PPO's clipped surrogate, -min(r A, clip(r) A), from log-probs and an optional
// per-token log-ratio override (GSPO passes its sequence-level ratio).
PolicyLoss clipped_policy_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                               const ClipRange& clip, const at::Tensor& log_ratio = {});

// GSPO's per-token log ratio: the sequence's mean log ratio (as a value) plus
// logp - sg(logp), so its gradient is the token's own (Zheng et al., 2025).
at::Tensor gspo_log_ratio(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& mask,
                          const at::Tensor& sequence);

enum class KlEstimator { k1, k2, k3 };
constexpr std::array<std::pair<KlEstimator, std::string_view>, 3> enum_names(KlEstimator) {
  return {{{KlEstimator::k1, "k1"}, {KlEstimator::k2, "k2"}, {KlEstimator::k3, "k3"}}};
}
// Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1, k2, k3).
at::Tensor kl_penalty(const at::Tensor& logp, const at::Tensor& ref_logp, KlEstimator estimator);

// PPO's clipped value loss: 0.5 max((v - R)^2, (v_old + clip(v - v_old, +-clip) - R)^2).
at::Tensor clipped_value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                              double clip);

// Truncated importance-sampling weights between the learner's and the sampler's
// log-probs: min(exp(old_logp - behaviour_logp), cap), without gradient.
at::Tensor truncated_is_weights(const at::Tensor& old_logp, const at::Tensor& behaviour_logp, double cap);

}  // namespace rlx::algo
