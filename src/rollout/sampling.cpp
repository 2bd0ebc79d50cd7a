#include "rlx/rollout/sampling.hpp"

#include <cmath>

#include "rlx/core/error.hpp"
#include "rlx/core/rng.hpp"


namespace rlx {

void SamplingParams::validate(std::string_view who, int64_t vocab_size, bool has_tokenizer) const {
  RLX_CHECK(!std::isnan(temperature) && !std::isnan(top_p) && !std::isnan(min_p), "{}: sampling parameters are NaN", who);
  config::check_bounds(*this, who);
  for (TokenId t : stop_token_ids)
    RLX_CHECK(t >= 0 && t < vocab_size, "{}: stop_token_ids has {}, outside the vocabulary [0, {})", who, t, vocab_size);
  if (stop_strings.empty()) return;
  RLX_CHECK(has_tokenizer, "{}: stop_strings need a tokenizer to decode tokens, and this engine has none", who);
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    const auto& s = stop_strings[i];
    RLX_CHECK(!s.empty(), "{}: stop_strings[{}] is empty", who, i);
    RLX_CHECK(s.size() <= 1024, "{}: stop_strings[{}] is {} bytes; at most 1024", who, i, s.size());
    RLX_CHECK(text::is_valid_utf8(s), "{}: stop_strings[{}] is not valid UTF-8", who, i);
  }
}

double sampling_uniform(uint64_t seed, std::string_view request_id, int64_t sample, int64_t position) {
  return philox_uniform(seed, hash_name(request_id), static_cast<uint64_t>(sample), static_cast<uint64_t>(position));
}

void SamplingBatch::add(const SamplingParams& p, double u) {
  temperature.push_back(p.temperature);
  top_k.push_back(p.top_k);
  top_p.push_back(p.top_p);
  min_p.push_back(p.min_p);
  uniform.push_back(u);
}

namespace {

at::Tensor column(const std::vector<double>& v, at::ScalarType dtype, at::Device device) {
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(device, dtype).unsqueeze(1);
}

// Probabilities after top-k, top-p and min-p, in descending order of probability, with
// that order: {kept [S, V] fp64 (zeros where dropped; not renormalised), order [S, V]}.
std::pair<at::Tensor, at::Tensor> truncate(const at::Tensor& logp, const SamplingBatch& b) {
  const auto device = logp.device();
  const int64_t V = logp.size(1);
  auto [sorted_logp, order] = logp.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true);
  auto probs = sorted_logp.to(at::kDouble).exp();
  auto rank = at::arange(V, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
  std::vector<double> top_k(b.top_k.begin(), b.top_k.end());
  auto k = column(top_k, at::kLong, device);
  auto keep = (k == 0) | (rank < k);
  auto topk = probs * keep;
  auto renorm = topk / topk.sum(-1, /*keepdim=*/true);
  auto before = renorm.cumsum(-1) - renorm;  // probability of the more likely tokens
  auto top_p = column(b.top_p, at::kDouble, device);
  keep = keep & ((top_p >= 1.0) | (before < top_p));
  auto min_p = column(b.min_p, at::kDouble, device);
  keep = keep & (probs >= min_p * probs.narrow(1, 0, 1));
  keep.narrow(1, 0, 1).fill_(true);  // the most likely token always survives
  return {probs * keep, order};
}

// Index of the first cdf entry above u * total, per row.
at::Tensor inverse_cdf(const at::Tensor& probs, const at::Tensor& u) {
  auto cdf = probs.cumsum(-1);
  auto target = u * cdf.narrow(1, cdf.size(1) - 1, 1);
  return (cdf <= target).sum(-1, /*keepdim=*/true).clamp_max(probs.size(1) - 1);
}

}  // namespace

Sampled sample(const at::Tensor& logits, const SamplingBatch& b) {
  RLX_ASSERT(logits.dim() == 2 && static_cast<size_t>(logits.size(0)) == b.size(), "sample: {} rows, {} params",
             logits.size(0), b.size());
  const auto device = logits.device();
  auto x = logits.to(at::kFloat);
  bool any_random = false, any_truncated = false;
  std::vector<double> temp(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const bool greedy = b.temperature[i] == 0.0;
    temp[i] = greedy ? 1.0 : b.temperature[i];
    any_random |= !greedy;
    any_truncated |= !greedy && (b.top_k[i] > 0 || b.top_p[i] < 1.0 || b.min_p[i] > 0.0);
  }
  auto logp = at::log_softmax(x / column(temp, at::kFloat, device), -1);
  at::Tensor tokens = x.argmax(-1, /*keepdim=*/true);
  if (any_random) {
    auto u = column(b.uniform, at::kDouble, device);
    at::Tensor drawn;
    if (any_truncated) {
      auto [kept, order] = truncate(logp, b);
      drawn = order.gather(1, inverse_cdf(kept, u));
    } else {
      drawn = inverse_cdf(logp.to(at::kDouble).exp(), u);
    }
    auto greedy = column(b.temperature, at::kDouble, device) == 0.0;
    tokens = at::where(greedy, tokens, drawn);
  }
  return {tokens.squeeze(1), logp.gather(1, tokens).squeeze(1)};
}

at::Tensor sampling_distribution(const at::Tensor& logits_row, const SamplingParams& p) {
  SamplingBatch b;
  b.add(p, 0.0);
  auto x = logits_row.to(at::kFloat).unsqueeze(0);
  auto logp = at::log_softmax(x / (p.greedy() ? 1.0 : p.temperature), -1);
  if (p.greedy()) {
    auto out = at::zeros({x.size(1)}, at::TensorOptions().dtype(at::kDouble).device(x.device()));
    out.index_put_({x.argmax(-1)}, 1.0);
    return out;
  }
  auto [kept, order] = truncate(logp, b);
  auto probs = at::zeros_like(kept).scatter_(1, order, kept);
  return (probs / probs.sum()).squeeze(0);
}

}  // namespace rlx
