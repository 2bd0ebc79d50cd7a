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

at::Tensor gspo_log_ratio(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& mask,
                          const at::Tensor& sequence) {
  auto m = mask.to(logp.scalar_type());
  auto token_lr = (logp - old_logp) * m;
  auto [sums, uniq] = per_sequence_sum(token_lr.detach(), sequence);
  auto [counts, unused] = per_sequence_sum(m, sequence);
  auto seq_mean = sums / counts.clamp_min(1);
  auto ids = sequence.reshape({-1});
  auto inverse = std::get<1>(at::_unique(ids, true, true));
  auto per_token = seq_mean.index_select(0, inverse).view_as(logp);
  return per_token + logp - logp.detach();
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

at::Tensor truncated_is_weights(const at::Tensor& old_logp, const at::Tensor& behaviour_logp, double cap) {
  RLX_CHECK(cap >= 1, "truncated importance sampling cap must be >= 1, got {}", cap);
  return at::exp(old_logp - behaviour_logp).clamp_max(cap).detach();
}

}  // namespace rlx::algo
