#include "rlx/rollout/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "rlx/core/error.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/cuda/sampling_rule.hpp"
#if RLX_WITH_CUDA
#include "rollout/sampling_device.hpp"
#endif


namespace rlx {

void SamplingParams::validate(std::string_view who, int64_t vocab_size, bool has_tokenizer) const {
  RLX_CHECK(!std::isnan(temperature) && !std::isnan(top_p) && !std::isnan(min_p), "{}: sampling parameters are NaN", who);
  config::check_bounds(*this, who);
  RLX_CHECK(temperature == 0 || (temperature >= kMinTemperature && std::isfinite(temperature)),
            "{}: temperature is {}; it must be 0 (greedy) or a finite number >= {} (below it the sampler's fp32 arithmetic "
            "overflows)",
            who, temperature, kMinTemperature);
  for (TokenId t : stop_token_ids)
    RLX_CHECK(t >= 0 && t < vocab_size, "{}: stop_token_ids has {}, outside the vocabulary [0, {})", who, t, vocab_size);
  RLX_CHECK(logprobs >= 0 && logprobs <= kMaxLogprobs, "{}: logprobs is {}; it must be in [0, {}]", who, logprobs,
            kMaxLogprobs);
  RLX_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= kMaxLogprobs,
            "{}: prompt_logprobs is {}; it must be -1 (none) or in [0, {}]", who, prompt_logprobs, kMaxLogprobs);
  if (stop_strings.empty()) return;
  RLX_CHECK(has_tokenizer, "{}: stop_strings need a tokenizer to decode tokens, and this engine has none", who);
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    const auto why = text::stop_string_problem(stop_strings[i]);
    RLX_CHECK(why.empty(), "{}: stop_strings[{}] {}", who, i, why);
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

// One row under the rule of cuda/sampling_rule.hpp, sequentially: the reference
// the GPU kernel is tested against, and the CPU sampler.
class RuleRow {
 public:
  RuleRow(const float* x, int64_t n, float temperature, int64_t top_k, double top_p, float min_p) : n_(n) {
    const float t = temperature == 0.0f ? 1.0f : temperature;
    z_.resize(static_cast<size_t>(n));
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      z_[i] = x[i] / t;
      if (z_[i] > m) m = z_[i], argmax_ = i;
    }
    w_.resize(z_.size());
    uint64_t units = 0;
    for (int64_t i = 0; i < n; ++i) units += hd::mass_units(w_[i] = std::exp(z_[i] - m));
    log_total_ = hd::log_total_of_units(units);
    m_ = m;
    if (temperature == 0.0f) return;
    min_p_ = min_p;
    uint32_t key_k = 0, key_p = 0;
    auto all = [&](int64_t i, uint32_t& k) { return k = hd::order_key(z_[i]), true; };
    if (top_k > 0 && top_k < n) key_k = hd::radix_select(n, static_cast<uint64_t>(top_k), all, [](int64_t) { return uint64_t{1}; });
    if (top_p < 1.0) {
      uint64_t kept = 0;
      for (int64_t i = 0; i < n; ++i)
        if (hd::order_key(z_[i]) >= key_k) kept += hd::mass_units(w_[i]);
      key_p = hd::radix_select(
          n, hd::top_p_need(top_p, kept), [&](int64_t i, uint32_t& k) { return (k = hd::order_key(z_[i])) >= key_k; },
          [&](int64_t i) { return hd::mass_units(w_[i]); });
    }
    key_min_ = std::max(key_k, key_p);
  }

  int64_t argmax() const { return argmax_; }
  // log_softmax(x / T)[token]
  float logprob(int64_t token) const { return z_[token] - m_ - log_total_; }
  // The token's mass after truncation (0: dropped).
  uint64_t kept_mass(int64_t i) const {
    return hd::order_key(z_[i]) >= key_min_ && w_[i] >= min_p_ ? hd::mass_units(w_[i]) : 0;
  }
  // The first token in vocabulary order whose running kept mass exceeds floor(u * S).
  int64_t draw(double u) const {
    std::vector<uint64_t> kept(static_cast<size_t>(n_));
    uint64_t total = 0;
    for (int64_t i = 0; i < n_; ++i) total += kept[static_cast<size_t>(i)] = kept_mass(i);
    if (total == 0) return argmax_;  // no mass (logits not finite, or a T outside the rule): greedy
    const uint64_t target = hd::draw_target(u, total);
    uint64_t run = 0;
    for (int64_t i = 0; i < n_; ++i)
      if ((run += kept[static_cast<size_t>(i)]) > target) return i;
    RLX_ASSERT(false, "sampling: no token reached the draw target {} of {}", target, total);
    return argmax_;
  }

 private:
  int64_t n_, argmax_ = 0;
  std::vector<float> z_, w_;
  float m_ = 0, log_total_ = 0, min_p_ = 0;
  uint32_t key_min_ = 0;
};

at::Tensor rows_fp32(const at::Tensor& logits) { return logits.to(at::kCPU, at::kFloat).contiguous(); }

// Greedy as the kernel decides it, on the fp32 temperature (a T that rounds to 0 is greedy).
bool greedy_fp32(const SamplingParams& p) { return static_cast<float>(p.temperature) == 0.0f; }

}  // namespace

SampledRow sample_row(const float* logits, int64_t vocab, const SamplingParams& p, double uniform) {
  const RuleRow row(logits, vocab, static_cast<float>(p.temperature), p.top_k, p.top_p, static_cast<float>(p.min_p));
  const int64_t token = greedy_fp32(p) ? row.argmax() : row.draw(uniform);
  return {token, row.logprob(token)};
}

Sampled sample(const at::Tensor& logits, const SamplingBatch& b) {
  RLX_ASSERT(logits.dim() == 2 && static_cast<size_t>(logits.size(0)) == b.size(), "sample: {} rows, {} params",
             logits.size(0), b.size());
#if RLX_WITH_CUDA
  if (logits.is_cuda()) return cuda::sample_on_device(logits, b);
#endif
  const auto x = rows_fp32(logits);
  const int64_t rows = x.size(0), vocab = x.size(1);
  auto tokens = at::empty({rows}, at::kLong);
  auto logprobs = at::empty({rows}, at::kFloat);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t i = static_cast<size_t>(r);
    SamplingParams p{.temperature = b.temperature[i], .top_k = b.top_k[i], .top_p = b.top_p[i], .min_p = b.min_p[i]};
    const auto s = sample_row(x.data_ptr<float>() + r * vocab, vocab, p, b.uniform[i]);
    tokens.data_ptr<int64_t>()[r] = s.token;
    logprobs.data_ptr<float>()[r] = s.logprob;
  }
  return {tokens.to(logits.device()), logprobs.to(logits.device())};
}

at::Tensor sampling_distribution(const at::Tensor& logits_row, const SamplingParams& p) {
  const auto x = rows_fp32(logits_row);
  const int64_t vocab = x.numel();
  auto out = at::zeros({vocab}, at::kDouble);
  auto* probs = out.data_ptr<double>();
  const RuleRow row(x.data_ptr<float>(), vocab, static_cast<float>(p.temperature), p.top_k, p.top_p,
                    static_cast<float>(p.min_p));
  double total = 0;
  if (!greedy_fp32(p))
    for (int64_t i = 0; i < vocab; ++i) total += probs[i] = static_cast<double>(row.kept_mass(i));
  if (total == 0) {  // greedy, or a row without mass (the draw then takes the argmax too)
    out.zero_();
    probs[row.argmax()] = 1.0;
    return out;
  }
  return out / total;
}

namespace {
// log_softmax(logits / T) in fp32, T 0 read as 1 (greedy records the plain distribution).
at::Tensor scaled_log_softmax(const at::Tensor& logits, double temperature) {
  auto x = logits.to(at::kFloat);
  if (temperature > 0 && temperature != 1.0) x = x / temperature;
  return at::log_softmax(x, -1);
}
}  // namespace

std::vector<std::vector<TokenLogprob>> top_logprobs(const at::Tensor& logits, const std::vector<double>& temperature,
                                                    const std::vector<int64_t>& k, const std::vector<TokenLogprob>& sampled) {
  RLX_CHECK(logits.dim() == 2 && static_cast<size_t>(logits.size(0)) == k.size() && temperature.size() == k.size() &&
                (sampled.empty() || sampled.size() == k.size()),
            "top_logprobs: {} rows of logits, {} temperatures, {} counts, {} sampled tokens",
            logits.dim() == 2 ? logits.size(0) : -1, temperature.size(), k.size(), sampled.size());
  std::vector<std::vector<TokenLogprob>> out(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    if (k[i] <= 0) continue;
    const auto row = logits[static_cast<int64_t>(i)].to(at::kFloat);
    const double t = temperature[i] > 0 ? temperature[i] : 1.0;
    const auto [best, ids] = at::topk(row, std::min<int64_t>(k[i], row.numel()));  // on the logits' device
    at::Tensor lp;
    if (sampled.empty()) {
      lp = scaled_log_softmax(row, temperature[i]).index_select(0, ids);
    } else {
      const float z = row[sampled[i].token].item<float>();
      lp = (best - z) / t + sampled[i].logprob;
    }
    const auto v = lp.to(at::kCPU).contiguous();
    const auto id = ids.to(at::kCPU, at::kLong).contiguous();
    for (int64_t j = 0; j < v.numel(); ++j)
      out[i].push_back({static_cast<TokenId>(id.data_ptr<int64_t>()[j]), v.data_ptr<float>()[j]});
    // A fixed order among equal log-probs: the lower id first.
    std::sort(out[i].begin(), out[i].end(), [](const TokenLogprob& a, const TokenLogprob& b) {
      return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
    });
    if (sampled.empty()) continue;
    for (auto& a : out[i])
      if (a.token == sampled[i].token) a.logprob = sampled[i].logprob;  // exactly, not up to rounding
  }
  return out;
}

std::vector<float> target_logprobs(const at::Tensor& logits, const std::vector<int64_t>& targets, double temperature) {
  RLX_CHECK(logits.dim() == 2 && static_cast<size_t>(logits.size(0)) == targets.size(),
            "target_logprobs: {} rows of logits for {} targets", logits.dim() == 2 ? logits.size(0) : -1, targets.size());
  if (targets.empty()) return {};
  const auto idx = at::tensor(targets, at::TensorOptions().dtype(at::kLong)).to(logits.device()).unsqueeze(1);
  const auto lp = scaled_log_softmax(logits, temperature).gather(1, idx).squeeze(1).to(at::kCPU).contiguous();
  return {lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel()};
}

}  // namespace rlx
