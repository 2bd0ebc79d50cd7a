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

#include "rlx/algo/options.hpp"

#include <array>
#include <string>
#include <string_view>
#include <utility>

namespace rlx::algo {

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


struct PolicyLoss {
  at::Tensor loss;     // [R, T] per-token loss
  at::Tensor clipped;  // [R, T] 1 where the clipped surrogate was the one taken (no gradient there)
  at::Tensor ratio;    // [R, T] pi / pi_old, detached
};

// PPO's clipped surrogate, -min(r A, clip(r) A), from log-probs and an optional
// per-token log-ratio override (GSPO passes its sequence-level ratio).
PolicyLoss clipped_policy_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                               const ClipRange& clip, const at::Tensor& log_ratio = {});

// CISPO's per-token loss (MiniMax-M1, Chen et al., 2025): -sg(clip(r, 1 - low, 1 + high)) A log pi,
// r = pi / pi_old. The importance weight is clipped, never the token dropped: every token
// keeps the gradient -w A of REINFORCE weighted by its clipped ratio w. `clipped` is 1 where
// the weight was clipped (the token still trains); dual_clip does not apply (an error).
PolicyLoss cispo_policy_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                             const ClipRange& clip);

// GSPO's per-token log ratio: the sequence's mean log ratio (as a value) plus
// logp - sg(logp), so its gradient is the token's own (Zheng et al., 2025).
at::Tensor gspo_log_ratio(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& mask,
                          const at::Tensor& sequence);

// Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1, k2, k3).
at::Tensor kl_penalty(const at::Tensor& logp, const at::Tensor& ref_logp, KlEstimator estimator);

// PPO's clipped value loss: 0.5 max((v - R)^2, (v_old + clip(v - v_old, +-clip) - R)^2).
at::Tensor clipped_value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                              double clip);

// Per-token weights correcting the sampler/learner mismatch (options.hpp's Mismatch), without
// gradient: weights multiply the per-token policy loss; kept is 0 where a mask mode dropped
// the token (or its sequence), else 1; log_ratio is each token's log(old / behaviour).
// With rho = exp(old - behaviour): token_truncate min(rho, high) (TIS); token_mask rho, or 0
// outside [low, high] (masked IS); sequence_truncate / sequence_mask the same on the
// sequence's ratio (the product of its token ratios, or their geometric mean); icepop a
// two-sided token band (low > 0). Masked tokens keep their place in the step's normaliser.
struct MismatchWeights {
  at::Tensor weights;
  at::Tensor kept;
  at::Tensor log_ratio;
};
MismatchWeights mismatch_weights(const at::Tensor& old_logp, const at::Tensor& behaviour_logp, const at::Tensor& mask,
                                 const at::Tensor& sequence, const MismatchOptions& options);

}  // namespace rlx::algo
