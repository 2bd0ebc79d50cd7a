#include "rlx/algo/losses.hpp"

#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"

namespace rlx::algo {

Aggregation aggregation_from_string(const std::string& s) { return config::parse_enum<Aggregation>(s, "aggregation"); }

namespace {
// Per-sequence sums of x over the micro-batch: {sums [S], sequence slot per token [R*T]}.
std::pair<at::Tensor, at::Tensor> per_sequence_sum(const at::Tensor& x, const at::Tensor& sequence) {
  auto ids = sequence.reshape({-1});
  auto [uniq, inverse] = at::_unique(ids.clamp_min(-1), /*sorted=*/true, /*return_inverse=*/true);
  auto sums = at::zeros({uniq.size(0)}, x.options());
  sums = sums.index_add(0, inverse, x.reshape({-1}));
  // Slot of the padding id (-1), if present, is 0 since uniq is sorted; callers mask it.
  return {sums, uniq};
}

// Each token's sequence sum (or mean over the sequence's masked tokens) of x * mask, without
// gradient: [R, T] like x.
at::Tensor per_sequence_value(const at::Tensor& x, const at::Tensor& mask, const at::Tensor& sequence, bool mean) {
  auto m = mask.to(x.scalar_type());
  auto [sums, uniq] = per_sequence_sum((x * m).detach(), sequence);
  if (mean) sums = sums / per_sequence_sum(m, sequence).first.clamp_min(1);
  auto inverse = std::get<1>(at::_unique(sequence.reshape({-1}).clamp_min(-1), true, true));
  return sums.index_select(0, inverse).view_as(x);
}
}  // namespace

at::Tensor aggregate(const at::Tensor& per_token, const at::Tensor& mask, const at::Tensor& sequence, Aggregation mode,
                     const Normalizers& norm) {
  RLX_CHECK(per_token.sizes() == mask.sizes() && sequence.sizes() == mask.sizes(),
            "aggregate: per-token loss, mask and sequence ids must have the same shape");
  RLX_CHECK(norm.tokens > 0 && norm.sequences > 0 && norm.max_tokens > 0, "aggregate: normalisers must be positive");
  auto m = mask.to(per_token.scalar_type());
  auto masked = per_token * m;
  switch (mode) {
    case Aggregation::token_mean: return masked.sum() / norm.tokens;
    case Aggregation::seq_mean_token_sum: return masked.sum() / norm.sequences;
    case Aggregation::seq_mean_token_sum_norm: return masked.sum() / (norm.sequences * norm.max_tokens);
    case Aggregation::seq_mean_token_mean: {
      auto [sums, uniq] = per_sequence_sum(masked, sequence);
      auto [counts, unused] = per_sequence_sum(m, sequence);
      auto real = (uniq >= 0).to(per_token.scalar_type());
      return (sums / counts.clamp_min(1) * real).sum() / norm.sequences;
    }
  }
  RLX_ASSERT(false, "unknown aggregation");
  return {};
}

PolicyLoss clipped_policy_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& adv,
                               const ClipRange& clip, const at::Tensor& log_ratio) {
  RLX_CHECK(clip.low >= 0 && clip.low < 1 && clip.high >= 0, "clip range: low {} must be in [0, 1), high {} >= 0",
            clip.low, clip.high);
  RLX_CHECK(clip.dual_clip == 0 || clip.dual_clip > 1, "dual clip must be 0 (off) or > 1, got {}", clip.dual_clip);
  auto lr = log_ratio.defined() ? log_ratio : logp - old_logp;
  auto ratio = at::exp(lr);
  auto surr1 = ratio * adv;
  auto surr2 = at::clamp(ratio, 1.0 - clip.low, 1.0 + clip.high) * adv;
  auto loss = -at::min(surr1, surr2);
  PolicyLoss out;
  out.clipped = (surr2 < surr1).to(at::kFloat);
  if (clip.dual_clip > 1) {
    auto capped = at::min(loss, -adv * clip.dual_clip);
    out.clipped = at::where(adv < 0, at::max(out.clipped, (capped < loss).to(at::kFloat)), out.clipped);
    loss = at::where(adv < 0, capped, loss);
  }
  out.loss = loss;
  out.ratio = ratio.detach();
  return out;
}

PolicyLoss cispo_policy_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& adv,
                             const ClipRange& clip) {
  RLX_CHECK(clip.low >= 0 && clip.low < 1 && clip.high >= 0, "clip range: low {} must be in [0, 1), high {} >= 0",
            clip.low, clip.high);
  RLX_CHECK(clip.dual_clip == 0, "cispo: dual clip does not apply (the weight is clipped, not the surrogate); got {}",
            clip.dual_clip);
  // exp of a log ratio bounded as verl does: the clip takes it into range anyway.
  const auto ratio = at::exp(at::clamp(logp.detach() - old_logp, -20.0, 20.0));
  const auto weight = at::clamp(ratio, 1.0 - clip.low, 1.0 + clip.high);
  PolicyLoss out;
  out.loss = -weight * adv * logp;
  out.clipped = (weight != ratio).to(at::kFloat);
  out.ratio = ratio;
  return out;
}

at::Tensor gspo_log_ratio(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& mask,
                          const at::Tensor& sequence) {
  return per_sequence_value(logp - old_logp, mask, sequence, /*mean=*/true) + logp - logp.detach();
}

at::Tensor kl_penalty(const at::Tensor& logp, const at::Tensor& ref_logp, KlEstimator estimator) {
  auto log_ratio = ref_logp - logp;  // log(pi_ref / pi)
  switch (estimator) {
    case KlEstimator::k1: return -log_ratio;
    case KlEstimator::k2: return 0.5 * log_ratio.pow(2);
    case KlEstimator::k3: return at::exp(log_ratio) - log_ratio - 1.0;
  }
  RLX_ASSERT(false, "unknown KL estimator");
  return {};
}

at::Tensor clipped_value_loss(const at::Tensor& v, const at::Tensor& v_old, const at::Tensor& ret, double clip) {
  RLX_CHECK(clip > 0, "value clip must be > 0, got {}", clip);
  auto clipped = v_old + at::clamp(v - v_old, -clip, clip);
  return 0.5 * at::max((v - ret).pow(2), (clipped - ret).pow(2));
}

MismatchWeights mismatch_weights(const at::Tensor& old_logp, const at::Tensor& behaviour_logp, const at::Tensor& mask,
                                 const at::Tensor& sequence, const MismatchOptions& o) {
  RLX_CHECK(old_logp.sizes() == behaviour_logp.sizes() && mask.sizes() == old_logp.sizes() &&
                sequence.sizes() == old_logp.sizes(),
            "mismatch weights: old and behaviour log-probs, mask and sequence ids must have the same shape");
  RLX_CHECK(o.low >= 0 && o.low < o.high, "mismatch band [{}, {}] is empty", o.low, o.high);
  MismatchWeights out;
  out.log_ratio = (old_logp - behaviour_logp).detach().to(at::kFloat);
  const bool by_sequence = o.mode == Mismatch::sequence_truncate || o.mode == Mismatch::sequence_mask;
  // A sequence's log ratio: the sum (product of ratios) or mean (geometric mean) over its trained tokens.
  auto lr = by_sequence ? per_sequence_value(out.log_ratio, mask, sequence, o.sequence_ratio == SequenceRatio::geometric)
                        : out.log_ratio;
  // Clamped before exp: a product over a long sequence overflows fp32 (its weight is then the cap, or masked).
  auto rho = at::exp(lr.clamp(-80, 80));
  switch (o.mode) {
    case Mismatch::none:
      out.weights = at::ones_like(rho);
      out.kept = at::ones_like(rho);
      break;
    case Mismatch::token_truncate:
    case Mismatch::sequence_truncate:
      RLX_CHECK(o.high >= 1, "mismatch truncation cap must be >= 1, got {}", o.high);
      out.weights = rho.clamp_max(o.high);
      out.kept = at::ones_like(rho);
      break;
    case Mismatch::token_mask:
    case Mismatch::sequence_mask:
    case Mismatch::icepop:
      RLX_CHECK(o.mode != Mismatch::icepop || o.low > 0, "icepop masks on both sides: its band's low end must be > 0");
      out.kept = ((rho >= o.low) & (rho <= o.high)).to(at::kFloat);
      out.weights = rho * out.kept;
      break;
  }
  out.weights = out.weights.to(old_logp.scalar_type());
  return out;
}

}  // namespace rlx::algo
