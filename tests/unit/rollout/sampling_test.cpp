#include "rlx/rollout/sampling.hpp"

#include <cmath>
#include <limits>

#include "../helpers.hpp"

using Catch::Matchers::Contains;
using rlx::SamplingParams;

namespace {
// Draws `n` tokens from one logits row with counter-based uniforms; returns frequencies.
std::vector<double> frequencies(const at::Tensor& logits, const SamplingParams& p, int64_t n) {
  const int64_t V = logits.size(0);
  std::vector<double> counts(static_cast<size_t>(V), 0.0);
  const int64_t chunk = 4096;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t m = std::min(chunk, n - start);
    rlx::SamplingBatch b;
    for (int64_t i = 0; i < m; ++i) b.add(p, rlx::sampling_uniform(7, "freq", 0, start + i));
    auto out = rlx::sample(logits.unsqueeze(0).expand({m, V}), b);
    auto t = out.tokens.accessor<int64_t, 1>();
    for (int64_t i = 0; i < m; ++i) counts[static_cast<size_t>(t[i])] += 1.0;
  }
  for (auto& c : counts) c /= static_cast<double>(n);
  return counts;
}

// Every frequency within 6 standard errors of its probability (plus a tiny slack): with
// the fixed seed the outcome is fixed, and a correct sampler is far inside the bound.
void check_matches(const std::vector<double>& freq, const at::Tensor& target, int64_t n) {
  auto t = target.accessor<double, 1>();
  for (size_t i = 0; i < freq.size(); ++i) {
    const double p = t[static_cast<int64_t>(i)];
    const double se = std::sqrt(p * (1 - p) / static_cast<double>(n));
    INFO("token " << i << " p=" << p << " freq=" << freq[i]);
    if (p == 0.0) CHECK(freq[i] == 0.0);
    else CHECK(std::abs(freq[i] - p) <= 6 * se + 1e-9);
  }
}
}  // namespace

TEST_CASE("sampling: the truncated distributions are the documented ones", "[rollout]") {
  // probabilities 0.4, 0.3, 0.2, 0.1 (in a shuffled vocabulary order)
  auto logits = at::tensor({0.2, 0.4, 0.1, 0.3}, at::TensorOptions().dtype(at::kDouble)).log().to(at::kFloat);
  auto dist = [&](SamplingParams p) { return rlx::sampling_distribution(logits, p); };
  auto near = [](const at::Tensor& a, std::vector<double> b) {
    return at::allclose(a, at::tensor(b, at::TensorOptions().dtype(at::kDouble)), 1e-6, 1e-7);
  };
  CHECK(near(dist({}), {0.2, 0.4, 0.1, 0.3}));
  CHECK(near(dist({.top_k = 2}), {0, 4.0 / 7, 0, 3.0 / 7}));
  // top-p 0.65: 0.4 (before 0) and 0.3 (before 0.4) kept; 0.2 (before 0.7) dropped.
  CHECK(near(dist({.top_p = 0.65}), {0, 4.0 / 7, 0, 3.0 / 7}));
  CHECK(near(dist({.top_p = 0.7}), {0, 4.0 / 7, 0, 3.0 / 7}));
  CHECK(near(dist({.top_p = 0.71}), {2.0 / 9, 4.0 / 9, 0, 3.0 / 9}));
  // min-p 0.45: keep p >= 0.18.
  CHECK(near(dist({.min_p = 0.45}), {2.0 / 9, 4.0 / 9, 0, 3.0 / 9}));
  // top-k 3 then top-p on the renormalised (4/9, 3/9, 2/9): 0.5 keeps the first two.
  CHECK(near(dist({.top_k = 3, .top_p = 0.5}), {0, 4.0 / 7, 0, 3.0 / 7}));
  // Temperature 2 flattens: p ~ sqrt(p).
  auto s = at::tensor({0.2, 0.4, 0.1, 0.3}, at::TensorOptions().dtype(at::kDouble)).sqrt();
  CHECK(at::allclose(dist({.temperature = 2.0}), s / s.sum(), 1e-6, 1e-7));
  CHECK(near(dist({.temperature = 0.0}), {0, 1, 0, 0}));
}

TEST_CASE("sampling: frequencies match the target distribution (fixed seed, 6-sigma bound)", "[rollout]") {
  at::manual_seed(11);
  auto logits = at::randn({40}) * 1.5;
  const int64_t n = 200000;
  for (SamplingParams p : {SamplingParams{}, SamplingParams{.temperature = 0.7, .top_k = 10},
                           SamplingParams{.temperature = 1.3, .top_p = 0.8}, SamplingParams{.min_p = 0.1},
                           SamplingParams{.top_k = 20, .top_p = 0.9, .min_p = 0.05}}) {
    INFO("T=" << p.temperature << " top_k=" << p.top_k << " top_p=" << p.top_p << " min_p=" << p.min_p);
    check_matches(frequencies(logits, p, n), rlx::sampling_distribution(logits, p), n);
  }
}

TEST_CASE("sampling: log-probs are log_softmax(logits / T) before truncation, greedy takes the first maximum", "[rollout]") {
  at::manual_seed(5);
  auto logits = at::randn({3, 50});
  logits[2][7] = 10.0;
  logits[2][9] = 10.0;
  rlx::SamplingBatch b;
  b.add({.temperature = 0.5, .top_k = 3}, 0.3);
  b.add({.temperature = 1.0, .top_p = 0.5}, 0.9);
  b.add({.temperature = 0.0}, 0.5);
  auto out = rlx::sample(logits, b);
  auto tok = out.tokens.accessor<int64_t, 1>();
  CHECK(tok[2] == 7);
  const double temps[] = {0.5, 1.0, 1.0};
  for (int64_t r = 0; r < 3; ++r) {
    auto expect = at::log_softmax(logits[r] / temps[r], -1)[tok[r]].item<float>();
    CHECK(out.logprobs[r].item<float>() == Approx(expect).margin(1e-6));
  }
  // top-k 3 keeps only the three largest logits of row 0.
  auto top3 = std::get<1>(logits[0].topk(3));
  CHECK((top3 == tok[0]).any().item<bool>());
}

TEST_CASE("sampling: uniforms depend only on seed, request, sample and position", "[rollout]") {
  const double u = rlx::sampling_uniform(1, "req", 0, 10);
  CHECK(u == rlx::sampling_uniform(1, "req", 0, 10));
  CHECK(u != rlx::sampling_uniform(2, "req", 0, 10));
  CHECK(u != rlx::sampling_uniform(1, "req2", 0, 10));
  CHECK(u != rlx::sampling_uniform(1, "req", 1, 10));
  CHECK(u != rlx::sampling_uniform(1, "req", 0, 11));
  CHECK(u >= 0.0);
  CHECK(u < 1.0);
}

TEST_CASE("sampling: bad parameters name the request and the field", "[rollout]") {
  using rlx::test::error_of;
  auto err = [](SamplingParams p, bool tok = true) { return error_of([&] { p.validate("request 'r1'", 100, tok); }); };
  CHECK_THAT(err({.top_p = 1.5}), Contains("request 'r1'") && Contains("top_p = 1.5") && Contains("(0, 1]"));
  CHECK_THAT(err({.top_p = 0.0}), Contains("top_p"));
  CHECK_THAT(err({.max_new_tokens = 0}), Contains("max_new_tokens = 0"));
  CHECK_THAT(err({.max_new_tokens = -3}), Contains("max_new_tokens = -3"));
  CHECK_THAT(err({.temperature = -1}), Contains("temperature"));
  CHECK_THAT(err({.temperature = std::nan("")}), Contains("NaN"));
  CHECK_THAT(err({.n = 0}), Contains("n = 0"));
  CHECK_THAT(err({.stop_token_ids = {5, 100}}), Contains("stop_token_ids has 100"));
  CHECK_THAT(err({.stop_strings = {"\xff\xfe"}}), Contains("stop_strings[0] is not valid UTF-8"));
  CHECK_THAT(err({.stop_strings = {"ok", ""}}), Contains("stop_strings[1] is empty"));
  CHECK_THAT(err({.stop_strings = {"ok"}}, false), Contains("need a tokenizer"));
  CHECK(err({.temperature = 0.7, .top_k = 5, .top_p = 0.9, .min_p = 0.1, .stop_strings = {"\n\n"}}).empty());
}

TEST_CASE("sampling: a temperature is 0 or at least 0.01; the sampler never fails on one", "[rollout]") {
  using rlx::test::error_of;
  auto err = [](double t) { return error_of([&] { SamplingParams{.temperature = t}.validate("request 'r1'", 100, true); }); };
  // 1e-39 overflows every logit / T in fp32 (the draw found no mass), 1e-300 rounds to an fp32
  // 0 (it sampled at T = 1): refused, naming the request and the bound.
  for (double t : {1e-39, 1e-300, 0.005})
    CHECK_THAT(err(t), Contains("request 'r1': temperature is") && Contains("0.01"));
  // An infinite one is out of every field's bounds (config::check_bounds names it).
  CHECK_THAT(err(std::numeric_limits<double>::infinity()), Contains("request 'r1'") && Contains("temperature = inf"));
  CHECK(err(0.0).empty());
  CHECK(err(SamplingParams::kMinTemperature).empty());
  CHECK(err(2.0).empty());

  // Unchecked parameters reach the sampler only through a bug; it still answers, greedily.
  const auto logits = at::tensor({-1.0f, 3.0f, -2.0f, -0.5f, -4.0f});
  for (double t : {1e-39, 1e-300}) {
    INFO("T = " << t);
    const SamplingParams p{.temperature = t, .top_p = 0.9};
    for (double u : {0.0, 0.5, 0.999}) CHECK(rlx::sample_row(logits.data_ptr<float>(), 5, p, u).token == 1);  // the first maximum
    CHECK(rlx::sampling_distribution(logits, p)[1].item<double>() == 1.0);
    rlx::SamplingBatch b;
    b.add(p, 0.5);
    CHECK(rlx::sample(logits.unsqueeze(0), b).tokens[0].item<int64_t>() == 1);
  }
}
