#include "rlx/algo/algorithm.hpp"
#include "rlx/algo/mismatch_metrics.hpp"

#include <catch2/catch.hpp>
#include <fmt/ranges.h>

#include <cstdlib>
#include <functional>
#include <iostream>

#include "../helpers.hpp"
#include "../test_models.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/learner/algorithm_loss.hpp"
#include "rlx/learner/reference.hpp"
#include "rlx/rollout/engine.hpp"

using namespace rlx::algo;

namespace {
at::Tensor t(std::vector<double> v) { return at::tensor(v, at::kDouble).unsqueeze(0); }

// Central differences of a scalar function of x against autograd, in float64.
void check_gradient(const std::function<at::Tensor(const at::Tensor&)>& f, at::Tensor x) {
  x = x.to(at::kDouble).detach().requires_grad_(true);
  auto y = f(x);
  y.backward();
  auto analytic = x.grad().clone();
  const double h = 1e-6;
  auto flat = x.detach().reshape({-1});
  for (int64_t i = 0; i < flat.numel(); ++i) {
    auto plus = flat.clone(), minus = flat.clone();
    plus[i] += h;
    minus[i] -= h;
    const double numeric =
        (f(plus.view_as(x)).item<double>() - f(minus.view_as(x)).item<double>()) / (2 * h);
    INFO("element " << i);
    CHECK(analytic.reshape({-1})[i].item<double>() == Approx(numeric).margin(1e-6).epsilon(1e-5));
  }
}
}  // namespace

TEST_CASE("group advantages: GRPO, Dr.GRPO, RLOO, none (hand-computed)", "[algo]") {
  // rewards {1, 0, 0, 1}: mean 0.5; unbiased variance (4 x 0.25) / 3 = 1/3, std 0.57735.
  auto grpo = group_advantages({1, 0, 0, 1}, GroupBaseline::mean_std);
  CHECK(grpo[0] == Approx(0.5 / std::sqrt(1.0 / 3.0)).epsilon(1e-5));  // 0.866
  CHECK(grpo[1] == Approx(-0.866025).epsilon(1e-5));
  auto dr = group_advantages({1, 0, 0, 1}, GroupBaseline::mean);
  CHECK(dr[0] == Approx(0.5));
  CHECK(dr[2] == Approx(-0.5));
  // RLOO: r_0 - mean(others) = 1 - (0 + 0 + 1) / 3 = 0.6667.
  auto rloo = group_advantages({1, 0, 0, 1}, GroupBaseline::rloo);
  CHECK(rloo[0] == Approx(2.0 / 3.0));
  CHECK(rloo[1] == Approx(0.0 - 2.0 / 3.0));
  CHECK(group_advantages({3, 3, 3}, GroupBaseline::mean_std) == std::vector<double>{0, 0, 0});  // no signal
  CHECK(group_advantages({5}, GroupBaseline::rloo) == std::vector<double>{0});
  CHECK(group_advantages({2, -1}, GroupBaseline::none) == std::vector<double>{2, -1});
  CHECK_THROWS_WITH(group_baseline_from_string("std"), Catch::Contains("mean_std"));
}

TEST_CASE("GAE, discounted returns, whitening and the overlong penalty (hand-computed)", "[algo]") {
  // gamma 0.9, lambda 0.8; rewards [0, 0, 1], values [0.5, 0.6, 0.7], terminal value 0:
  // t2: delta = 1 - 0.7 = 0.3, A = 0.3; t1: delta = 0.9 x 0.7 - 0.6 = 0.03, A = 0.03 + 0.72 x 0.3 = 0.246;
  // t0: delta = 0.9 x 0.6 - 0.5 = 0.04, A = 0.04 + 0.72 x 0.246 = 0.21712.
  auto [adv, ret] = gae(at::tensor({0.0, 0.0, 1.0}, at::kDouble), at::tensor({0.5, 0.6, 0.7}, at::kDouble), 0.9, 0.8);
  CHECK(adv[0].item<double>() == Approx(0.21712));
  CHECK(adv[1].item<double>() == Approx(0.246));
  CHECK(adv[2].item<double>() == Approx(0.3));
  CHECK(ret[0].item<double>() == Approx(0.71712));
  CHECK(ret[2].item<double>() == Approx(1.0));
  // gamma 0.5 over [1, 0, 2]: [1 + 0.5 x 1, 0 + 0.5 x 2, 2] = [1.5, 1, 2].
  auto g = discounted_returns(at::tensor({1.0, 0.0, 2.0}, at::kDouble), 0.5);
  CHECK(at::allclose(g, at::tensor({1.5, 1.0, 2.0}, at::kDouble)));
  auto w = whiten(at::tensor({1.0, 2.0, 3.0, 100.0}, at::kDouble), at::tensor({1.0, 1.0, 1.0, 0.0}, at::kDouble));
  CHECK(w[0].item<double>() == Approx(-1.0).epsilon(1e-6));  // mean 2, std 1
  CHECK(w[3].item<double>() == 0.0);                         // masked
  // max 100, buffer 20: no penalty to 80, -0.5 at 90, -1 at 100 and beyond.
  CHECK(overlong_penalty(80, 100, 20) == 0.0);
  CHECK(overlong_penalty(90, 100, 20) == Approx(-0.5));
  CHECK(overlong_penalty(100, 100, 20) == Approx(-1.0));
  CHECK(overlong_penalty(130, 100, 20) == -1.0);
}

TEST_CASE("the clipped surrogate: symmetric, clip-higher, dual-clip (hand-computed)", "[algo]") {
  auto logr = [](double r) { return std::log(r); };
  // ratio 1.5, A = 2: min(3, 1.2 x 2) = 2.4 -> loss -2.4, clipped.
  // ratio 0.5, A = 2: min(1, 0.8 x 2 = 1.6) = 1 -> loss -1, not clipped.
  // ratio 0.5, A = -1: min(-0.5, -0.8) = -0.8 -> loss 0.8, clipped.
  auto pg = clipped_policy_loss(t({logr(1.5), logr(0.5), logr(0.5)}), t({0, 0, 0}), t({2, 2, -1}), {.low = 0.2, .high = 0.2});
  CHECK(pg.loss[0][0].item<double>() == Approx(-2.4));
  CHECK(pg.loss[0][1].item<double>() == Approx(-1.0));
  CHECK(pg.loss[0][2].item<double>() == Approx(0.8));
  CHECK(at::equal(pg.clipped, at::tensor({1.0f, 0.0f, 1.0f}).unsqueeze(0)));
  // Clip-higher (0.28): ratio 1.25, A = 1 stays unclipped: loss -1.25.
  auto high = clipped_policy_loss(t({logr(1.25)}), t({0}), t({1}), {.low = 0.2, .high = 0.28});
  CHECK(high.loss[0][0].item<double>() == Approx(-1.25));
  CHECK(high.clipped[0][0].item<float>() == 0.0f);
  // Dual-clip c = 3: ratio 5, A = -1: -min(-5, -1.2) = 5, capped at 3 x |A| = 3.
  auto dual = clipped_policy_loss(t({logr(5)}), t({0}), t({-1}), {.low = 0.2, .high = 0.2, .dual_clip = 3});
  CHECK(dual.loss[0][0].item<double>() == Approx(3.0));
  CHECK_THROWS_WITH(clipped_policy_loss(t({0}), t({0}), t({1}), {.dual_clip = 0.5}), Catch::Contains("dual clip"));
}

TEST_CASE("KL estimators, value loss (hand-computed)", "[algo]") {
  // pi = 0.5, pi_ref = 0.25: log(pi_ref / pi) = -log 2.
  // k1 = log 2 = 0.693147; k2 = 0.5 (log 2)^2 = 0.240227; k3 = 0.5 + log 2 - 1 = 0.193147.
  auto lp = t({std::log(0.5)}), ref = t({std::log(0.25)});
  CHECK(kl_penalty(lp, ref, KlEstimator::k1).item<double>() == Approx(0.693147));
  CHECK(kl_penalty(lp, ref, KlEstimator::k2).item<double>() == Approx(0.240227));
  CHECK(kl_penalty(lp, ref, KlEstimator::k3).item<double>() == Approx(0.193147));
  CHECK(kl_penalty(lp, lp, KlEstimator::k3).item<double>() == 0.0);
  // v 1, v_old 0, R 2, clip 0.5: max((1 - 2)^2, (0.5 - 2)^2) / 2 = 1.125.
  CHECK(clipped_value_loss(t({1}), t({0}), t({2}), 0.5).item<double>() == Approx(1.125));
}

TEST_CASE("mismatch correction modes (hand-computed)", "[algo]") {
  // Sequence 0: token ratios old/behaviour 4, 0.5, 1.25 (the last not trained); sequence 1:
  // ratios 1.5, 0.2; then padding. Trained ratios of sequence 0: 4 x 0.5 = 2 (product),
  // sqrt(2) = 1.41421 (geometric mean); sequence 1: 1.5 x 0.2 = 0.3, sqrt(0.3) = 0.547723.
  auto behaviour = t({0, 0, 0, 0, 0, 0});
  auto old = t({std::log(4.0), std::log(0.5), std::log(1.25), std::log(1.5), std::log(0.2), 3.0});
  auto mask = t({1, 1, 0, 1, 1, 0});
  auto seq = at::tensor({0, 0, 0, 1, 1, -1}, at::kLong).unsqueeze(0);
  auto w = [&](Mismatch mode, double low, double high, SequenceRatio r = SequenceRatio::product) {
    auto out = mismatch_weights(old, behaviour, mask, seq, {.mode = mode, .low = low, .high = high, .sequence_ratio = r});
    std::vector<double> weights, kept;
    for (int64_t i = 0; i < 5; ++i) {  // the padding position is not asserted
      weights.push_back(out.weights[0][i].item<double>());
      kept.push_back(out.kept[0][i].item<double>());
    }
    return std::pair{weights, kept};
  };
  auto near = [](const std::vector<double>& a, std::vector<double> b) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-6));
  };
  // TIS: min(rho, 2).
  near(w(Mismatch::token_truncate, 0, 2).first, {2, 0.5, 1.25, 1.5, 0.2});
  // Masked IS per token, band [0.3, 2]: 4 and 0.2 dropped, the rest keep rho.
  auto [tm, tk] = w(Mismatch::token_mask, 0.3, 2);
  near(tm, {0, 0.5, 1.25, 1.5, 0});
  near(tk, {0, 1, 1, 1, 0});
  // IcePop, band [0.5, 5]: only 0.2 leaves it.
  near(w(Mismatch::icepop, 0.5, 5).first, {4, 0.5, 1.25, 1.5, 0});
  // Sequence-level IS (product), truncated at 1.5: sequence 0's 2 -> 1.5; sequence 1's 0.3 stays.
  near(w(Mismatch::sequence_truncate, 0, 1.5).first, {1.5, 1.5, 1.5, 0.3, 0.3});
  // Geometric mean, truncated at 10: sqrt 2 and sqrt 0.3.
  near(w(Mismatch::sequence_truncate, 0, 10, SequenceRatio::geometric).first,
       {1.41421356, 1.41421356, 1.41421356, 0.54772256, 0.54772256});
  // Sequence mask, band [0.5, 3]: sequence 1 (0.3) is dropped whole.
  auto [sm, sk] = w(Mismatch::sequence_mask, 0.5, 3);
  near(sm, {2, 2, 2, 0, 0});
  near(sk, {1, 1, 1, 0, 0});
  // none: weights 1, nothing dropped; the log ratios are reported either way.
  auto none = mismatch_weights(old, behaviour, mask, seq, {});
  CHECK(none.weights.sum().item<double>() == Approx(6.0));
  CHECK(none.log_ratio[0][0].item<double>() == Approx(std::log(4.0)));
  CHECK_THROWS_WITH(mismatch_weights(old, behaviour, mask, seq, {.mode = Mismatch::icepop, .low = 0, .high = 5}),
                    Catch::Contains("icepop"));
  CHECK_THROWS_WITH(mismatch_weights(old, behaviour, mask, seq, {.mode = Mismatch::token_truncate, .low = 0, .high = 0.5}),
                    Catch::Contains(">= 1"));
}

TEST_CASE("metric sums: tensors kept as added (detached copies), host numbers, vectors by name, read at once",
          "[algo]") {
  rlx::MetricSums sums;
  auto x = t({1.5, 2.5}).requires_grad_();
  auto total = x.sum();
  sums.add("a", total);
  sums.add("a", 0.25);
  auto bins = t({1, 2, 3});
  sums.add({"b0", "b1", "b2"}, bins);
  sums.add({"b0", "b1", "b2"}, bins);
  bins.mul_(100);  // the sums hold copies: a later change of the caller's tensor is not counted
  sums.add("c", at::tensor(7, at::kLong));
  CHECK(sums.names() == std::vector<std::string>{"a", "b0", "b1", "b2", "c"});
  const auto v = sums.values();
  CHECK(v.at("a") == 4.25);
  CHECK(v.at("b0") == 2);
  CHECK(v.at("b2") == 6);
  CHECK(v.at("c") == 7);
  CHECK_FALSE(total.grad_fn() == nullptr);  // the loss's graph untouched
  CHECK(rlx::MetricSums{}.values().empty());
  CHECK_THROWS_WITH(sums.add("d", t({1, 2})), Catch::Contains("\"d\"") && Catch::Contains("[1, 2]"));
  CHECK_THROWS_WITH(sums.add(std::vector<std::string>{"e"}, t({1, 2})), Catch::Contains("1 names for a tensor of 2"));
}

TEST_CASE("mismatch metrics: ratio quantiles from summed bins, masked fraction in the step's metrics", "[algo]") {
  // 100 tokens at ratio 1 (log 0), 1 token at e^2 (bin (1, 3]), one masked out.
  std::vector<double> lr(100, 0.0);
  lr.push_back(2.0);
  lr.push_back(-5.0);
  std::vector<double> m(101, 1.0);
  m.push_back(0.0);
  rlx::MetricSums added;
  add_mismatch_histogram(t(lr), t(m), added);
  add_mismatch_histogram(t({0.0}), t({1.0}), added);  // a second micro-batch adds up
  auto sums = added.values();
  double total = 0;
  for (const auto& n : mismatch_bin_names()) total += sums[n];
  CHECK(total == 102);
  CHECK(mismatch_ratio_quantile(sums, 0.5) == Approx(1.0).margin(1e-3));  // inside (-1e-4, 1e-4]
  CHECK(mismatch_ratio_quantile(sums, 1.0) > std::exp(1.0));             // the e^2 token's bin
  CHECK(mismatch_ratio_quantile(sums, 1.0) <= std::exp(3.0));
  CHECK(std::isnan(mismatch_ratio_quantile({}, 0.5)));
  // Through a loss: an icepop band that drops one token of four.
  AlgoOptions o;
  o.mismatch = {.mode = Mismatch::icepop, .low = 0.5, .high = 2};
  register_bundled_algorithms();
  auto algo = make_algorithm(o);
  LossInputs in;
  in.mask = t({1, 1, 1, 1});
  in.sequence = at::tensor({0, 0, 1, 1}, at::kLong).unsqueeze(0);
  in.logprobs = t({-1, -1, -1, -1}).requires_grad_();
  in.old_logprobs = t({-1, -1, -1, -1});
  in.behaviour_logprobs = t({-1, -1, -1, -1 - std::log(4.0)});  // the last token's ratio is 4
  in.advantages = t({1, 1, -1, -1});
  rlx::MetricSums sums2;
  auto loss = algo->loss(in, {.tokens = 4, .sequences = 2, .max_tokens = 4}, sums2);
  loss.backward();
  CHECK(in.logprobs.grad()[0][3].item<double>() == 0.0);  // dropped: no gradient
  CHECK(in.logprobs.grad()[0][2].item<double>() != 0.0);
  auto means = Algorithm::means(sums2.values());
  CHECK(means["mismatch_masked_fraction"] == Approx(0.25));
  CHECK(means["mismatch_weight_mean"] == Approx(0.75));
  CHECK(means.contains("mismatch_ratio_p50"));
  CHECK_FALSE(means.contains("mismatch_lr_bin_00"));
  // A mismatch mode without the sampler's log-probs is refused, naming the mode.
  in.behaviour_logprobs = at::Tensor();
  rlx::MetricSums unused;
  CHECK_THROWS_WITH(algo->loss(in, {.tokens = 4, .sequences = 2, .max_tokens = 4}, unused), Catch::Contains("icepop"));
}

TEST_CASE("aggregation modes (hand-computed)", "[algo]") {
  // Tokens 1, 2 (sequence 0), 3 (sequence 1), then padding.
  auto x = t({1, 2, 3, 4}), mask = t({1, 1, 1, 0});
  auto seq = at::tensor({0, 0, 1, -1}, at::kLong).unsqueeze(0);
  const Normalizers norm{.tokens = 3, .sequences = 2, .max_tokens = 10};
  CHECK(aggregate(x, mask, seq, Aggregation::token_mean, norm).item<double>() == Approx(2.0));          // 6 / 3
  CHECK(aggregate(x, mask, seq, Aggregation::seq_mean_token_sum, norm).item<double>() == Approx(3.0));  // 6 / 2
  CHECK(aggregate(x, mask, seq, Aggregation::seq_mean_token_mean, norm).item<double>() ==
        Approx(2.25));  // (1.5 + 3) / 2
  CHECK(aggregate(x, mask, seq, Aggregation::seq_mean_token_sum_norm, norm).item<double>() == Approx(0.3));  // 6 / 20
  CHECK_THROWS_WITH(aggregation_from_string("mean"), Catch::Contains("token_mean"));
}

TEST_CASE("GSPO's ratio is the sequence's geometric mean, with the token's own gradient", "[algo]") {
  auto lp = t({-1.0, -2.0, -3.0}).requires_grad_(true);
  auto old = t({-1.5, -2.5, -2.0});
  auto seq = at::tensor({4, 4, 9}, at::kLong).unsqueeze(0);
  auto lr = gspo_log_ratio(lp, old, t({1, 1, 1}), seq);
  CHECK(lr[0][0].item<double>() == Approx(0.5));   // mean(0.5, 0.5)
  CHECK(lr[0][1].item<double>() == Approx(0.5));
  CHECK(lr[0][2].item<double>() == Approx(-1.0));  // its own
  lr.sum().backward();
  CHECK(at::allclose(lp.grad(), at::ones_like(lp)));
}

TEST_CASE("finite-difference gradients of every loss", "[algo]") {
  auto adv = t({1.5, -0.7, 0.3, 2.0}), old = t({-1.0, -2.0, -0.5, -1.2}), mask = t({1, 1, 1, 0});
  auto seq = at::tensor({0, 0, 1, -1}, at::kLong).unsqueeze(0);
  const Normalizers norm{.tokens = 3, .sequences = 2, .max_tokens = 8};
  auto logp = t({-1.05, -1.9, -0.45, -1.1});  // ratios near 1: inside the clip range
  for (auto mode : {Aggregation::token_mean, Aggregation::seq_mean_token_mean, Aggregation::seq_mean_token_sum_norm}) {
    check_gradient(
        [&](const at::Tensor& x) {
          return aggregate(clipped_policy_loss(x, old, adv, {.low = 0.2, .high = 0.28}).loss, mask, seq, mode, norm);
        },
        logp);
  }
  check_gradient([&](const at::Tensor& x) { return kl_penalty(x, old, KlEstimator::k3).sum(); }, logp);
  check_gradient([&](const at::Tensor& x) { return kl_penalty(x, old, KlEstimator::k2).sum(); }, logp);
  check_gradient([&](const at::Tensor& x) { return clipped_value_loss(x, old, adv, 10.0).sum(); }, logp);
  // GSPO's gradient is the sequence objective's exactly when the advantage is the
  // sequence's (as GSPO defines it) and tokens are averaged within the sequence.
  auto seq_adv = t({1.5, 1.5, 0.3, 0.3});
  check_gradient(
      [&](const at::Tensor& x) {
        return aggregate(
            clipped_policy_loss(x, old, seq_adv, {.low = 0.5, .high = 0.5}, gspo_log_ratio(x, old, mask, seq)).loss,
            mask, seq, Aggregation::seq_mean_token_mean, norm);
      },
      logp);
}

TEST_CASE("algorithms are chosen by name, an unknown name suggests the closest", "[algo]") {
  register_bundled_algorithms();
  auto names = algorithm_names();
  for (const char* n : {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo", "sft"})
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
  CHECK_THROWS_WITH(make_algorithm({.name = "grpoo"}), Catch::Contains("did you mean \"grpo\""));
  auto rloo = make_algorithm({.name = "rloo"});
  CHECK(rloo->outcome()->advantages({{{.reward = 1}, {.reward = 0}, {.reward = 0}, {.reward = 1}}}, {})[0][0] ==
        Approx(2.0 / 3.0));
  // REINFORCE++ whitens over the batch (token-weighted), across ranks through all_reduce.
  auto rpp = make_algorithm({.name = "reinforce_pp"});
  int calls = 0;
  auto adv = rpp->outcome()->advantages({{{.reward = 1, .response_tokens = 2}, {.reward = 0, .response_tokens = 2}},
                              {{.reward = 3, .response_tokens = 4}}},
                             [&](std::vector<double>&) { ++calls; });
  CHECK(calls == 1);
  double mean = (2 * adv[0][0] + 2 * adv[0][1] + 4 * adv[1][0]) / 8;
  CHECK(mean == Approx(0.0).margin(1e-9));
}

TEST_CASE("every aggregation gives the same loss and gradients however the batch is split", "[algo]") {
  register_bundled_algorithms();
  auto comm = rlx::dist::single_process();
  const auto cfg = rlx::test::test_model({.vocab = 23, .hidden = 8, .intermediate = 10});
  rlx::RngStream rng(3, 0);
  std::vector<rlx::Sequence> batch;
  for (int i = 0; i < 7; ++i) {
    rlx::Sequence s;
    const int64_t len = rng.uniform_int(4, 12);
    for (int64_t k = 0; k < len; ++k) {
      s.tokens.push_back(rng.uniform_int(0, 22));
      s.loss_mask.push_back(k >= 2);
    }
    rlx::set_advantage(s, rng.uniform() - 0.5);
    s.values["old_logprobs"] = std::vector<float>(static_cast<size_t>(len), -3.0f);
    batch.push_back(s);
  }
  for (auto mode : {Aggregation::token_mean, Aggregation::seq_mean_token_sum, Aggregation::seq_mean_token_mean,
                    Aggregation::seq_mean_token_sum_norm}) {
    auto algo = make_algorithm({.name = "grpo", .aggregation = mode, .kl_coef = 0, .max_tokens = 12});
    std::vector<rlx::StepResult> results;
    for (int64_t budget : {12, 24, 200}) {
      rlx::LearnerOptions o;
      o.optimizer.lr = 0;
      o.packing = {.micro_batch_tokens = budget, .row_tokens = 12};
      rlx::Learner learner(cfg, *comm, o);
      learner.init_weights(5);
      results.push_back(learner.step(batch, rlx::algorithm_loss(*algo), algo->metric_names()));
    }
    INFO("aggregation " << static_cast<int>(mode));
    CHECK(results[0].micro_batches > results[2].micro_batches);
    for (const auto& r : results) {
      CHECK(r.loss == Approx(results[2].loss).epsilon(1e-6));
      CHECK(r.grad_norm == Approx(results[2].grad_norm).epsilon(1e-6));
      CHECK(r.metrics.at("tokens") == results[2].metrics.at("tokens"));
    }
  }
}

TEST_CASE("the learner's recomputed log-probs of engine samples equal the sampler's (CPU fp32)", "[algo]") {
  const auto cfg = rlx::test::test_model({.vocab = 31, .hidden = 16, .heads = 2, .head_dim = 8, .intermediate = 24});
  auto model = std::make_shared<rlx::Transformer>(cfg);
  model->init_weights(21);
  rlx::Engine engine(model, {.block_size = 4, .kv_cache_blocks = 64});
  std::vector<rlx::GenerationRequest> requests;
  for (int i = 0; i < 3; ++i)
    requests.push_back({.id = fmt::format("p{}", i),
                        .prompt = {1 + i, 5, 7 + i},
                        .params = {.temperature = 1.0, .max_new_tokens = 9, .n = 4, .ignore_eos = true},
                        .seed = 17});
  auto results = engine.generate(requests);
  std::vector<rlx::Sequence> seqs;
  std::vector<std::vector<float>> behaviour;
  std::vector<size_t> prompt_len;
  for (const auto& r : results)
    for (const auto& s : r.samples) {
      rlx::Sequence q;
      for (auto t : r.prompt) q.tokens.push_back(t), q.loss_mask.push_back(0);
      for (auto t : s.tokens) q.tokens.push_back(t), q.loss_mask.push_back(1);
      seqs.push_back(q);
      behaviour.push_back(s.logprobs);
      prompt_len.push_back(r.prompt.size());
    }
  auto comm = rlx::dist::single_process();
  rlx::Learner learner(cfg, *comm, {.packing = {.micro_batch_tokens = 1024, .row_tokens = 64}});
  learner.load_from(*model);
  auto mbs = rlx::pack_micro_batches(seqs, learner.options().packing);  // packed: sequences share rows
  double worst = 0;
  int64_t compared = 0;
  for (const auto& mb : mbs) {
    auto logp = learner.logprobs(mb);
    auto sq = mb.sequence.accessor<int64_t, 2>();
    auto mask = mb.loss_mask.accessor<float, 2>();
    std::vector<int64_t> seen(seqs.size(), 0);
    for (int64_t r = 0; r < logp.size(0); ++r)
      for (int64_t t = 0; t < logp.size(1); ++t) {
        if (mask[r][t] == 0) continue;
        const auto s = static_cast<size_t>(sq[r][t]);
        const float b = behaviour[s][static_cast<size_t>(seen[s]++)];
        worst = std::max(worst, std::abs(static_cast<double>(logp[r][t].item<float>() - b)));
        ++compared;
      }
  }
  INFO("largest |learner - sampler| " << worst << " over " << compared << " tokens");
  CHECK(compared == 3 * 4 * 9);
  CHECK(worst <= 1e-6);  // float rounding: the KV-cache path multiplies other shapes
}

namespace {
// The toy task of the RL runs below: emit token 3. Reward = the fraction of a
// response's 6 tokens that are 3; a fresh model emits it about 1 time in 16.
struct ToyTask {
  rlx::ModelConfig cfg = rlx::test::test_model({.vocab = 16, .hidden = 16, .layers = 1, .heads = 2, .head_dim = 8, .intermediate = 24});
  std::shared_ptr<rlx::Transformer> model = std::make_shared<rlx::Transformer>(cfg);
  rlx::Engine engine;
  uint64_t stream = 0;  // added to every step's sampling seed
  // Seed 0 is the task the single-run tests use; seed k > 0 starts from other weights and
  // samples other tokens, for tests that measure an effect over runs.
  explicit ToyTask(uint64_t seed = 0)
      : engine((model->init_weights(8 + seed), model), {.block_size = 4, .kv_cache_blocks = 256}), stream(seed * 100003) {}

  // One batch of 4 prompts x 8 samples: the sequences, rewards and group sizes.
  double sample(int step, std::vector<rlx::Sequence>& seqs, std::vector<double>& rewards, std::vector<size_t>& groups) {
    std::vector<rlx::GenerationRequest> requests;
    for (int p = 0; p < 4; ++p)
      requests.push_back({.id = fmt::format("s{}p{}", step, p),
                          .prompt = {1, 2 + p},
                          .params = {.max_new_tokens = 6, .n = 8, .ignore_eos = true},
                          .seed = static_cast<uint64_t>(step) + stream});
    double total = 0;
    for (const auto& r : engine.generate(requests)) {
      groups.push_back(r.samples.size());
      for (const auto& s : r.samples) {
        rewards.push_back(static_cast<double>(std::count(s.tokens.begin(), s.tokens.end(), 3)) / 6.0);
        total += rewards.back();
        rlx::Sequence q;
        std::vector<float> behaviour;
        for (auto t : r.prompt) q.tokens.push_back(t), q.loss_mask.push_back(0), behaviour.push_back(0);
        for (size_t i = 0; i < s.tokens.size(); ++i)
          q.tokens.push_back(s.tokens[i]), q.loss_mask.push_back(1), behaviour.push_back(s.logprobs[i]);
        q.values["behaviour_logprobs"] = behaviour;
        seqs.push_back(q);
      }
    }
    return total / static_cast<double>(rewards.size());
  }

  // One RL step: a batch sampled with seed `step`, trained on, the new weights in the engine
  // as version `version`. Returns the batch's mean reward and the step's metrics.
  std::pair<double, rlx::algo::Metrics> train(int step, int64_t version, Algorithm& algo, const rlx::TrainModels& m) {
    std::vector<rlx::Sequence> seqs;
    std::vector<double> rewards;
    std::vector<size_t> groups;
    const double reward = sample(step, seqs, rewards, groups);
    auto metrics = rlx::train_on_batch(algo, m, seqs, rewards, groups);
    engine.update_weights(version, m.policy.model().gather_parameters());
    return {reward, metrics};
  }
};

// A learning test is a statistical claim. One run's outcome depends on every rounding on
// the way (a CPU's vector width, its BLAS kernel), and a few dozen noisy steps amplify that
// into a different trajectory, as a different seed would. So the effect is measured over
// independent runs (seeds), and the test asserts its mean against a bound set several
// standard errors below the mean measured here; each test states both. The per-run values
// print with RLX_TEST_EFFECTS=1.
struct Effect {
  std::vector<double> runs;
  double mean = 0, sd = 0;
  double se() const { return sd / std::sqrt(static_cast<double>(runs.size())); }
  std::string describe() const {
    return fmt::format("mean {:.4f}, sd {:.4f}, se {:.4f} over {} runs: {:.3f}", mean, sd, se(), runs.size(), fmt::join(runs, " "));
  }
};

Effect measure(std::string_view what, int runs, const std::function<double(uint64_t seed)>& run) {
  Effect e;
  for (int k = 1; k <= runs; ++k) e.runs.push_back(run(static_cast<uint64_t>(k)));
  for (double v : e.runs) e.mean += v / runs;
  for (double v : e.runs) e.sd += (v - e.mean) * (v - e.mean) / (runs - 1);
  e.sd = std::sqrt(e.sd);
  if (std::getenv("RLX_TEST_EFFECTS")) std::cerr << what << ": " << e.describe() << "\n";
  return e;
}

double mean_of(const std::vector<double>& v, size_t from, size_t n) {
  double m = 0;
  for (size_t i = from; i < from + n; ++i) m += v[i] / static_cast<double>(n);
  return m;
}

rlx::LearnerOptions toy_options(double lr) {
  rlx::LearnerOptions o;
  o.optimizer.lr = lr;
  o.packing = {.micro_batch_tokens = 512, .row_tokens = 16};
  return o;
}
}  // namespace

TEST_CASE("a short GRPO run on a toy task improves its reward (over seeds)", "[algo][numerics]") {
  register_bundled_algorithms();
  auto grpo = make_algorithm({.name = "grpo"});
  // The gain in mean reward, last 3 of 16 steps over the first 3.
  const auto gain = measure("GRPO reward gain", 6, [&](uint64_t seed) {
    ToyTask task(seed);
    auto comm = rlx::dist::single_process();
    rlx::Learner learner(task.cfg, *comm, toy_options(2e-2));
    learner.load_from(*task.model);
    std::vector<double> r;
    for (int step = 0; step < 16; ++step) r.push_back(task.train(step, step + 1, *grpo, {.policy = learner}).first);
    return mean_of(r, 13, 3) - mean_of(r, 0, 3);
  });
  INFO("reward gain " << gain.describe());
  // Measured under the default, avx2 and avx512 capabilities and three OpenBLAS kernel
  // families (identical): mean 0.852, sd 0.035, se 0.015 over 6 runs (0.78 to 0.88). The
  // bound is 17 standard errors below the mean.
  CHECK(gain.mean > 0.6);
}

TEST_CASE("the frozen reference model: its log-probs align with the tokens, and KL is 0 against itself", "[algo]") {
  register_bundled_algorithms();
  auto comm = rlx::dist::single_process();
  const auto cfg = rlx::test::test_model({.vocab = 23, .hidden = 8, .intermediate = 10});
  rlx::Transformer init(cfg);
  init.init_weights(9);
  rlx::ReferenceModel ref(cfg, *comm);
  ref.load_from(init);
  std::vector<rlx::Sequence> seqs;
  for (int i = 0; i < 5; ++i) {
    rlx::Sequence s;
    for (int k = 0; k < 4 + i; ++k) s.tokens.push_back((3 * i + 5 * k) % 23), s.loss_mask.push_back(k >= 1);
    rlx::set_advantage(s, i - 2.0);
    s.values["old_logprobs"] = std::vector<float>(s.tokens.size(), -3.0f);
    seqs.push_back(s);
  }
  const rlx::PackOptions packing{.micro_batch_tokens = 64, .row_tokens = 16};
  ref.annotate(seqs, packing);
  // Against the plain model, one sequence at a time: token k's log-prob from position k - 1.
  for (const auto& s : seqs) {
    auto ids = at::tensor(s.tokens, at::kLong).unsqueeze(0);
    auto logp = rlx::gather_logprobs(init.forward({.tokens = ids}).narrow(1, 0, ids.size(1) - 1), ids.narrow(1, 1, ids.size(1) - 1));
    const auto& got = s.values.at("ref_logprobs");
    CHECK(got[0] == 0.0f);
    for (int64_t k = 1; k < ids.size(1); ++k) CHECK(got[static_cast<size_t>(k)] == Approx(logp[0][k - 1].item<float>()).margin(1e-6));
  }
  // A policy that starts from the same weights has KL 0 to it at the first step.
  rlx::Learner learner(cfg, *comm, {.packing = packing});
  learner.load_from(init);
  auto algo = make_algorithm({.name = "grpo", .kl_coef = 0.1});
  CHECK(algo->needs_reference());
  auto r = learner.step(seqs, rlx::algorithm_loss(*algo), algo->metric_names());
  CHECK(r.metrics.at("tokens") > 0);
  CHECK(std::abs(r.metrics.at("kl")) < 1e-9);
  // Without the reference log-probs the error names what is missing.
  for (auto& s : seqs) s.values.erase("ref_logprobs");
  CHECK_THROWS_WITH(learner.step(seqs, rlx::algorithm_loss(*algo), algo->metric_names()),
                    Catch::Contains("reference model"));
}

TEST_CASE("PPO's per-token advantages: GAE over the reward at the last token, KL in the reward (hand-computed)", "[algo]") {
  register_bundled_algorithms();
  // gamma 1, lambda 0.5, no whitening; values [0.5, 0.2], reward 1 at the last token:
  // t1: delta = 1 - 0.2 = 0.8, A = 0.8; t0: delta = 0 + 0.2 - 0.5 = -0.3, A = -0.3 + 0.5 x 0.8 = 0.1;
  // returns = A + V = [0.6, 1.0].
  auto ppo = make_algorithm({.name = "ppo", .whiten_batch = false, .gamma = 1.0, .gae_lambda = 0.5});
  REQUIRE(ppo->needs_critic());
  const auto v = at::tensor({0.5, 0.2}, at::kDouble);
  auto out = ppo->critic()->token_advantages({{.reward = 1.0, .values = v}}, {});
  CHECK(out[0].advantages[0].item<double>() == Approx(0.1));
  CHECK(out[0].advantages[1].item<double>() == Approx(0.8));
  CHECK(out[0].returns[0].item<double>() == Approx(0.6));
  CHECK(out[0].returns[1].item<double>() == Approx(1.0));
  // KL in the reward, coefficient 0.1, k1 = old - ref = [0.2, -0.1]: rewards [-0.02, 1 + 0.01].
  // t1: delta = 1.01 - 0.2 = 0.81; t0: delta = -0.02 + 0.2 - 0.5 = -0.32, A = -0.32 + 0.405 = 0.085.
  auto kl = make_algorithm({.name = "ppo", .kl_coef = 0.1, .kl_estimator = KlEstimator::k1, .whiten_batch = false,
                            .kl_placement = KlPlacement::reward, .gamma = 1.0, .gae_lambda = 0.5});
  out = kl->critic()->token_advantages({{.reward = 1.0,
                               .values = v,
                               .old_logprobs = at::tensor({-1.0, -2.0}, at::kDouble),
                               .ref_logprobs = at::tensor({-1.2, -1.9}, at::kDouble)}},
                             {});
  CHECK(out[0].advantages[1].item<double>() == Approx(0.81));
  CHECK(out[0].advantages[0].item<double>() == Approx(0.085));
  // Whitened over the batch (two sequences): mean 0, unbiased std 1 over all tokens.
  auto w = make_algorithm({.name = "ppo"});
  out = w->critic()->token_advantages({{.reward = 1.0, .values = v}, {.reward = 0.0, .values = at::tensor({0.3}, at::kDouble)}}, {});
  auto all = at::cat({out[0].advantages, out[1].advantages});
  CHECK(all.mean().item<double>() == Approx(0.0).margin(1e-9));
  CHECK(all.std().item<double>() == Approx(1.0).epsilon(1e-6));
  CHECK(w->outcome() == nullptr);  // PPO makes no advantages from outcomes alone

}

TEST_CASE("the adaptive KL controller moves the coefficient toward the target, by at most 20% per horizon", "[algo]") {
  register_bundled_algorithms();
  auto a = make_algorithm({.name = "ppo", .kl_coef = 0.1, .kl_target = 1.0, .kl_horizon = 1000});
  a->observe_kl(2.0, 100);  // error clipped to +0.2: x (1 + 0.2 x 100 / 1000) = x 1.02
  CHECK(a->kl_coef() == Approx(0.102));
  a->observe_kl(0.9, 1000);  // error -0.1: x 0.9
  CHECK(a->kl_coef() == Approx(0.102 * 0.9));
  auto fixed = make_algorithm({.name = "ppo", .kl_coef = 0.1});
  fixed->observe_kl(5.0, 1000);
  CHECK(fixed->kl_coef() == 0.1);
}

TEST_CASE("batch metrics and step means (hand-computed)", "[algo]") {
  // rewards {1, 0, 0, 1}: mean 0.5, population std 0.5; advantages {2, -1} over lengths {3, 5}.
  auto m = batch_metrics({1, 0, 0, 1}, {2, -1}, {3, 5}, {});
  CHECK(m["reward_mean"] == 0.5);
  CHECK(m["reward_std"] == Approx(0.5));
  CHECK(m["advantage_mean"] == 0.5);
  CHECK(m["advantage_max"] == 2);
  CHECK(m["advantage_min"] == -1);
  CHECK(m["response_length_mean"] == 4);
  CHECK(m["response_length_max"] == 5);
  // Sums over 10 tokens: 2 clipped -> clip fraction 0.2; the step loss stays as it is.
  auto means = Algorithm::means({{"tokens", 10}, {"clipped_tokens", 2}, {"ratio", 10.5}, {"pg_loss", -0.3}});
  CHECK(means["clip_fraction"] == Approx(0.2));
  CHECK(means["ratio"] == Approx(1.05));
  CHECK(means["pg_loss"] == -0.3);
}

TEST_CASE("a short PPO run on a toy task improves its reward (over seeds, separate critic and value head)", "[algo][numerics]") {
  register_bundled_algorithms();
  for (auto critic_kind : {CriticKind::separate, CriticKind::head}) {
    const bool head = critic_kind == CriticKind::head;
    INFO("critic " << (head ? "head" : "separate"));
    rlx::algo::Metrics last;
    // The gain in mean reward, last 3 of 14 steps over the first 3.
    const auto gain = measure(head ? "PPO reward gain (value head)" : "PPO reward gain (separate critic)", 5, [&](uint64_t seed) {
      ToyTask task(seed);
      auto comm = rlx::dist::single_process();
      auto po = toy_options(2e-2);
      po.value_head = head;
      rlx::Learner policy(task.cfg, *comm, po);
      policy.load_from(*task.model);
      auto co = toy_options(2e-2);
      co.policy_head = false;
      co.value_head = true;
      rlx::Learner critic(task.cfg, *comm, co);
      critic.load_from(*task.model);
      rlx::ReferenceModel reference(task.cfg, *comm);
      reference.load_from(*task.model);
      auto ppo = make_algorithm({.name = "ppo",
                                 .kl_coef = 0.01,
                                 .kl_placement = KlPlacement::reward,
                                 .critic = critic_kind,
                                 .epochs = 2,
                                 .mini_batches = 2});
      std::vector<double> r;
      for (int step = 0; step < 14; ++step) {
        std::vector<rlx::Sequence> seqs;
        std::vector<double> rewards;
        std::vector<size_t> groups;
        r.push_back(task.sample(step, seqs, rewards, groups));
        last = rlx::train_on_batch(*ppo, {.policy = policy, .critic = &critic, .reference = &reference}, seqs, rewards, groups);
        task.engine.update_weights(step + 1, policy.model().gather_parameters());
      }
      return mean_of(r, 11, 3) - mean_of(r, 0, 3);
    });
    INFO("reward gain " << gain.describe());
    // Measured under the default, avx2 and avx512 capabilities: separate critic mean 0.885,
    // sd 0.017, se 0.008; value head mean 0.888, sd 0.020, se 0.009 (5 runs each, 0.86 to
    // 0.91). The bound is over 30 standard errors below the means.
    CHECK(gain.mean > 0.6);
    CHECK(last["optimizer_steps"] == 4);      // 2 epochs x 2 mini-batches
    CHECK(last["mismatch_kl"] < 1e-3);        // the learner's old log-probs are the sampler's
    CHECK(last.count("value_mean") + last.count("critic_value_mean") == 1);
    CHECK(std::isfinite(last["kl"]));
  }
}

TEST_CASE("one GRPO update per batch takes the step's own log-probs as the old ones: the same update as a pass of its own", "[algo]") {
  register_bundled_algorithms();
  ToyTask task;
  auto comm = rlx::dist::single_process();
  rlx::Learner a(task.cfg, *comm, toy_options(2e-2)), b(task.cfg, *comm, toy_options(2e-2));
  a.load_from(*task.model);
  b.load_from(*task.model);
  auto grpo = make_algorithm({.name = "grpo"});
  for (int step = 0; step < 3; ++step) {
    std::vector<rlx::Sequence> seqs;
    std::vector<double> rewards;
    std::vector<size_t> groups;
    task.sample(step, seqs, rewards, groups);
    auto with_pass = seqs;
    b.annotate(with_pass, "old_logprobs", "");  // what train_on_batch did before: a forward of its own
    auto ma = rlx::train_on_batch(*grpo, {.policy = a}, seqs, rewards, groups);
    auto mb = rlx::train_on_batch(*grpo, {.policy = b}, with_pass, rewards, groups);
    CHECK(seqs[0].values.count("old_logprobs") == 0);  // no pass was made
    CHECK(ma["ratio"] == 1.0);
    CHECK(ma["clip_fraction"] == 0.0);
    CHECK(ma["loss"] == mb["loss"]);
    CHECK(ma["grad_norm"] == mb["grad_norm"]);
  }
  auto pa = a.model().gather_parameters(), pb = b.model().gather_parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(at::equal(pa[i].second, pb[i].second));
}

TEST_CASE("train_on_batch shapes rewards with the overlong penalty before the advantages", "[algo]") {
  register_bundled_algorithms();
  CHECK_THROWS_WITH(make_algorithm({.name = "grpo", .overlong_buffer = 8, .max_response_tokens = 8}),
                    Catch::Contains("max_response_tokens"));
  auto comm = rlx::dist::single_process();
  const auto cfg = rlx::test::test_model({.vocab = 16, .hidden = 8, .intermediate = 10});
  rlx::Learner learner(cfg, *comm, toy_options(0.0));
  learner.init_weights(3);
  // Two responses with reward 1, of 4 and 10 tokens; limit 10, buffer 4: penalties 0 (at most
  // 6 tokens) and -1 x factor 0.5, so the shaped rewards are {1, 0.5}: mean 0.75, sample std
  // sqrt(0.125), GRPO's advantages +-0.25 / 0.35355 = +-0.7071.
  std::vector<rlx::Sequence> seqs(2);
  for (size_t i = 0; i < 2; ++i) {
    seqs[i].tokens = {1, 2};
    seqs[i].loss_mask = {0, 0};
    for (int k = 0; k < (i == 0 ? 4 : 10); ++k) seqs[i].tokens.push_back(3 + k), seqs[i].loss_mask.push_back(1);
  }
  auto grpo = make_algorithm({.name = "grpo", .overlong_buffer = 4, .max_response_tokens = 10, .overlong_factor = 0.5});
  auto m = rlx::train_on_batch(*grpo, {.policy = learner}, seqs, {1.0, 1.0}, {2});
  CHECK(seqs[0].values.at("advantages")[2] == Approx(0.25 / std::sqrt(0.125)).epsilon(1e-4));
  CHECK(seqs[1].values.at("advantages")[2] == Approx(-0.25 / std::sqrt(0.125)).epsilon(1e-4));
  CHECK(m["overlong_penalty_mean"] == Approx(-0.25));
  CHECK(m["reward_mean"] == 1.0);  // the raw rewards
}

namespace {
// A user's algorithm with a hyperparameter of its own: GRPO's advantages scaled by `scale`.
class ScaledGrpo final : public rlx::algo::PolicyGradient, public rlx::algo::OutcomeAdvantages {
 public:
  explicit ScaledGrpo(const AlgoOptions& o)
      : PolicyGradient(o),
        scale_(rlx::algo::option(o, "scale", 1.0, rlx::config::greater_than(0))),
        tag_(rlx::algo::option<std::string>(o, "tag", "none")),
        clamp_(rlx::algo::option(o, "clamp", false)),
        every_(rlx::algo::option<int64_t>(o, "every", 1, rlx::config::in_range(1, 10))) {}
  std::vector<std::vector<double>> advantages(const std::vector<std::vector<rlx::algo::Sample>>& groups,
                                              const rlx::algo::AllReduceSum&) const override {
    std::vector<std::vector<double>> out;
    for (const auto& g : groups) out.emplace_back(g.size(), scale_);
    return out;
  }
  double scale_;
  std::string tag_;
  bool clamp_;
  int64_t every_;
};

struct AlgoSection {
  AlgoOptions algorithm;
  template <class V>
  void visit(V& v) {
    v("algorithm", algorithm, "");
  }
};
}  // namespace

TEST_CASE("algorithm.options: a registered algorithm's own hyperparameters, declared, typed and checked", "[algo]") {
  register_bundled_algorithms();
  rlx::algo::register_algorithm(
      "scaled_grpo", [](const AlgoOptions& o) { return std::make_unique<ScaledGrpo>(o); },
      {{"scale", "advantage scale, > 0 (default 1)"}, {"tag", "a label"}, {"clamp", "a switch"}, {"every", "1..10"}});
  REQUIRE(rlx::algo::algorithm_options("scaled_grpo").size() == 4);
  CHECK(rlx::algo::algorithm_options("grpo").empty());
  // From a config file, as a user writes it.
  auto cfg = rlx::config::load_string<AlgoSection>(
      "algorithm: {name: scaled_grpo, options: {scale: 2.5, tag: hello, clamp: true, every: 3}}");
  auto a = rlx::algo::make_algorithm(cfg.algorithm);
  auto* s = dynamic_cast<ScaledGrpo*>(a.get());
  REQUIRE(s);
  CHECK(s->scale_ == 2.5);
  CHECK(s->tag_ == "hello");
  CHECK(s->clamp_);
  CHECK(s->every_ == 3);
  CHECK(dynamic_cast<ScaledGrpo&>(*rlx::algo::make_algorithm({.name = "scaled_grpo"})).scale_ == 1.0);  // default
  // Undeclared keys, wrong types and out-of-range values name the key.
  CHECK_THROWS_WITH(rlx::algo::make_algorithm({.name = "scaled_grpo", .options = {{"scal", "2"}}}),
                    Catch::Contains("algorithm.options.scal") && Catch::Contains("did you mean \"scale\"") &&
                        Catch::Contains("advantage scale"));
  CHECK_THROWS_WITH(rlx::algo::make_algorithm({.name = "grpo", .options = {{"scale", "2"}}}),
                    Catch::Contains("algorithm.options.scale") && Catch::Contains("it takes none"));
  CHECK_THROWS_WITH(rlx::algo::make_algorithm({.name = "scaled_grpo", .options = {{"scale", "big"}}}),
                    Catch::Contains("algorithm.options.scale") && Catch::Contains("not a number"));
  CHECK_THROWS_WITH(rlx::algo::make_algorithm({.name = "scaled_grpo", .options = {{"scale", "0"}}}),
                    Catch::Contains("algorithm.options.scale") && Catch::Contains("> 0"));
  CHECK_THROWS_WITH(rlx::algo::make_algorithm({.name = "scaled_grpo", .options = {{"every", "2.5"}}}),
                    Catch::Contains("algorithm.options.every") && Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(rlx::algo::make_algorithm({.name = "scaled_grpo", .options = {{"clamp", "yes"}}}),
                    Catch::Contains("algorithm.options.clamp") && Catch::Contains("true or false"));
}

namespace {
// An algorithm that says nothing of how it makes advantages.
class NoAdvantages final : public rlx::algo::PolicyGradient {
 public:
  using PolicyGradient::PolicyGradient;
};
}  // namespace

TEST_CASE("the algorithm registry: a duplicate name is an error naming it, an algorithm without advantages is refused",
          "[algo]") {
  register_bundled_algorithms();
  CHECK_THROWS_WITH(rlx::algo::register_algorithm("grpo", [](const AlgoOptions& o) { return std::make_unique<ScaledGrpo>(o); }),
                    Catch::Contains("\"grpo\" is already registered"));
  CHECK(dynamic_cast<ScaledGrpo*>(rlx::algo::make_algorithm({.name = "grpo"}).get()) == nullptr);  // the first stays
  rlx::algo::register_algorithm("no_advantages", [](const AlgoOptions& o) { return std::make_unique<NoAdvantages>(o); });
  CHECK_THROWS_WITH(rlx::algo::make_algorithm({.name = "no_advantages"}),
                    Catch::Contains("no_advantages") && Catch::Contains("OutcomeAdvantages"));
  // Environments alike.
  rlx::env::register_bundled();
  CHECK_THROWS_WITH(rlx::env::Registry::global().add("arithmetic", "again", [](const rlx::env::Context&) {
                      return std::unique_ptr<rlx::env::Env>();
                    }),
                    Catch::Contains("'arithmetic' is already registered"));
}

TEST_CASE("on-policy distillation: the advantage is the teacher's log-prob less the student's (hand-computed, finite differences)",
          "[algo]") {
  register_bundled_algorithms();
  AlgoOptions o{.name = "distill"};
  o.teacher = "teacher-dir";
  o.options = {{"reward_coef", "0.5"}, {"distill_coef", "2"}};
  auto d = make_algorithm(o);
  CHECK(d->needs_teacher());
  CHECK_FALSE(d->needs_reference());
  // Group advantages of the reward, scaled by reward_coef: rewards 1, 0 -> +-0.7071 x 0.5.
  auto adv = d->outcome()->advantages({{{.reward = 1}, {.reward = 0}}}, nullptr);
  CHECK(adv[0][0] == Approx(0.5 * std::sqrt(0.5)));
  CHECK(adv[0][1] == Approx(-0.5 * std::sqrt(0.5)));
  // Tokens: student (old) log-probs -1, -2; teacher's -0.5, -3. Per-token advantage
  // A = 1 - 2 (old - teacher) = 2, -1; on-policy ratio 1: loss = -(2 - 1) / 2 = -0.5; its
  // gradient in the log-probs -A / 2 = -1, 0.5; teacher_kl = ((-0.5) + 1) / 2 = 0.25.
  LossInputs in;
  in.mask = t({1, 1, 0});
  in.sequence = at::tensor({0, 0, -1}, at::kLong).unsqueeze(0);
  in.logprobs = t({-1, -2, -3}).requires_grad_();
  in.old_logprobs = t({-1, -2, -3});
  in.teacher_logprobs = t({-0.5, -3, -9});
  in.advantages = t({1, 1, 1});
  const Normalizers norm{.tokens = 2, .sequences = 1, .max_tokens = 4};
  rlx::MetricSums sums;
  auto loss = d->loss(in, norm, sums);
  CHECK(loss.item<double>() == Approx(-0.5));
  loss.backward();
  CHECK(in.logprobs.grad()[0][0].item<double>() == Approx(-1.0));
  CHECK(in.logprobs.grad()[0][1].item<double>() == Approx(0.5));
  CHECK(Algorithm::means(sums.values())["teacher_kl"] == Approx(0.25));
  check_gradient(
      [&](const at::Tensor& x) {
        LossInputs v = in;
        v.logprobs = x;
        rlx::MetricSums unused;
        return d->loss(v, norm, unused);
      },
      t({-1.05, -1.9, -3.0}));
  // What it needs is named: the teacher's directory, its log-probs, no KL to a reference.
  CHECK_THROWS_WITH(make_algorithm({.name = "distill"}), Catch::Contains("algorithm.teacher"));
  AlgoOptions kl = o;
  kl.kl_coef = 0.1;
  CHECK_THROWS_WITH(make_algorithm(kl), Catch::Contains("kl_coef"));
  in.teacher_logprobs = at::Tensor();
  rlx::MetricSums unused;
  CHECK_THROWS_WITH(d->loss(in, norm, unused), Catch::Contains("teacher log-probs"));
}

TEST_CASE("on-policy distillation: a student learns a GRPO-trained teacher's behaviour without the reward (over seeds)",
          "[algo][numerics]") {
  register_bundled_algorithms();
  AlgoOptions o{.name = "distill"};
  o.teacher = "in-memory";
  auto distill = make_algorithm(o);
  auto grpo = make_algorithm({.name = "grpo"});
  std::vector<double> kl_ratio;
  // The student's gain in the reward it never trains on (last 3 of 24 steps over the first 3),
  // and (beside it) its reverse KL to the teacher, last 3 steps over the first 3.
  const auto gain = measure("distillation: student's reward gain", 4, [&](uint64_t seed) {
    auto comm = rlx::dist::single_process();
    // The teacher: GRPO on the toy task (reward: the share of token 3) until it prefers token 3.
    ToyTask teach(seed);
    rlx::Learner teacher_learner(teach.cfg, *comm, toy_options(2e-2));
    teacher_learner.load_from(*teach.model);
    for (int step = 0; step < 24; ++step) teach.train(step, step + 1, *grpo, {.policy = teacher_learner});
    rlx::Transformer trained(teach.cfg);
    {
      c10::NoGradGuard g;
      std::map<std::string, at::Tensor> src;
      for (auto& [name, t] : teacher_learner.model().gather_parameters()) src[name] = t;
      for (auto& [name, t] : trained.hf_parameters()) {
        REQUIRE(src.count(name));
        t.copy_(src.at(name).view_as(t));
      }
    }
    rlx::ReferenceModel teacher(teach.cfg, *comm);
    teacher.load_from(trained);
    // The student starts where the teacher did and never sees the reward (reward_coef 0).
    ToyTask task(seed);
    task.stream += 50000;  // its own samples
    rlx::Learner learner(task.cfg, *comm, toy_options(2e-2));
    learner.load_from(*task.model);
    std::vector<double> reward, kl;
    for (int step = 0; step < 24; ++step) {
      auto [r, m] = task.train(step, step + 1, *distill, {.policy = learner, .teacher = &teacher});
      reward.push_back(r);
      kl.push_back(m.at("teacher_kl"));
    }
    kl_ratio.push_back(mean_of(kl, 21, 3) / mean_of(kl, 0, 3));
    return mean_of(reward, 21, 3) - mean_of(reward, 0, 3);
  });
  const auto kl_text = fmt::format("{:.3f}", fmt::join(kl_ratio, " "));
  if (std::getenv("RLX_TEST_EFFECTS")) std::cerr << "distillation: reverse KL ratio " << kl_text << "\n";
  INFO("student's reward gain " << gain.describe() << "; reverse KL ratio (last / first) " << kl_text);
  // Measured under the default, avx2 and avx512 capabilities: gain mean 0.926, sd 0.016, se
  // 0.008 over 4 runs (0.91 to 0.95); the KL ratio under 1e-3 in every run (the student
  // reaches its teacher). Both bounds are far outside that spread.
  CHECK(gain.mean > 0.6);
  CHECK(mean_of(kl_ratio, 0, kl_ratio.size()) < 0.5);
}

TEST_CASE("on-policy distillation from a larger teacher lowers the student's reverse KL to it (over seeds)", "[algo][numerics]") {
  register_bundled_algorithms();
  auto comm = rlx::dist::single_process();
  AlgoOptions o{.name = "distill"};
  o.teacher = "in-memory";
  auto distill = make_algorithm(o);
  // The ratio of the reverse KL to the teacher on the student's own samples, steps 22-24 over
  // steps 1-3 (the student samples; its reward is ignored, reward_coef 0).
  std::vector<double> first_kl;
  const auto ratio = measure("distillation from a larger teacher: KL ratio", 8, [&](uint64_t seed) {
    ToyTask task(seed);
    // The teacher: wider and deeper than the student, same vocabulary, peaked.
    auto tcfg = rlx::test::test_model({.vocab = 16, .hidden = 32, .layers = 2, .heads = 4, .head_dim = 8, .intermediate = 48});
    tcfg.initializer_range = 0.3;
    rlx::Transformer teacher_init(tcfg);
    teacher_init.init_weights(20 + seed);
    rlx::ReferenceModel teacher(tcfg, *comm);
    teacher.load_from(teacher_init);
    rlx::Learner learner(task.cfg, *comm, toy_options(2e-2));
    learner.load_from(*task.model);
    std::vector<double> kl;
    for (int step = 0; step < 24; ++step)
      kl.push_back(task.train(step, step + 1, *distill, {.policy = learner, .teacher = &teacher}).second.at("teacher_kl"));
    first_kl.push_back(mean_of(kl, 0, 3));
    return mean_of(kl, 21, 3) / mean_of(kl, 0, 3);
  });
  INFO("reverse KL ratio " << ratio.describe());
  // Measured under the default, avx2 and avx512 capabilities: mean 0.706, sd 0.084, se 0.030
  // over 8 runs (0.56 to 0.85: one run's ratio is noisy, which is why a single run's bound
  // of 0.6 failed on another CPU). The bound is 4.8 standard errors above the mean.
  for (double f : first_kl) CHECK(f > 0.1);
  CHECK(ratio.mean < 0.85);
  ToyTask task;
  rlx::Learner learner(task.cfg, *comm, toy_options(2e-2));
  learner.load_from(*task.model);
  // Without the teacher the step says what is missing.
  std::vector<rlx::Sequence> seqs;
  std::vector<double> rewards;
  std::vector<size_t> groups;
  task.sample(99, seqs, rewards, groups);
  CHECK_THROWS_WITH(rlx::train_on_batch(*distill, {.policy = learner}, seqs, rewards, groups), Catch::Contains("teacher"));
}

TEST_CASE("CISPO: the clipped importance weight under a stop-gradient times REINFORCE's loss (hand-computed)", "[algo]") {
  // Ratios 1.5, 0.5, 1.1 (old log-probs log 0.4, log 0.8, log 0.5) with A = 2, -1, 1 and the
  // range [0.8, 1.2]: weights 1.2 (clipped), 0.8 (clipped), 1.1. Loss -w A log pi per token;
  // its gradient -w A, every token's (PPO's clip would give the first two none).
  const std::vector<double> p{0.6, 0.4, 0.55}, old_p{0.4, 0.8, 0.5}, a{2, -1, 1}, w{1.2, 0.8, 1.1};
  std::vector<double> lp, old;
  for (size_t i = 0; i < 3; ++i) lp.push_back(std::log(p[i])), old.push_back(std::log(old_p[i]));
  auto x = t(lp).requires_grad_(true);
  auto pg = cispo_policy_loss(x, t(old), t(a), {.low = 0.2, .high = 0.2});
  for (int64_t i = 0; i < 3; ++i) {
    INFO("token " << i);
    CHECK(pg.loss[0][i].item<double>() == Approx(-w[i] * a[i] * lp[i]));
    CHECK(pg.ratio[0][i].item<double>() == Approx(p[i] / old_p[i]));
  }
  CHECK(at::equal(pg.clipped, at::tensor({1.0f, 1.0f, 0.0f}).unsqueeze(0)));
  pg.loss.sum().backward();
  for (int64_t i = 0; i < 3; ++i) CHECK(x.grad()[0][i].item<double>() == Approx(-w[i] * a[i]));
  // Where every weight is clipped it is locally constant: finite differences agree.
  check_gradient(
      [&](const at::Tensor& y) {
        return aggregate(cispo_policy_loss(y, t(old), t(a), {.low = 0.2, .high = 0.2}).loss, t({1, 1, 0}),
                         at::tensor({0, 0, 1}, at::kLong).unsqueeze(0), Aggregation::token_mean, {.tokens = 2});
      },
      t({lp[0], lp[1], std::log(0.9)}));
  CHECK_THROWS_WITH(cispo_policy_loss(x, t(old), t(a), {.dual_clip = 3}), Catch::Contains("dual clip"));
}

TEST_CASE("CISPO is a registered algorithm: on-policy it is REINFORCE with GRPO's advantages", "[algo]") {
  register_bundled_algorithms();
  auto names = algorithm_names();
  CHECK(std::find(names.begin(), names.end(), "cispo") != names.end());
  CHECK_THROWS_WITH(make_algorithm({.name = "cispo", .clip = {.dual_clip = 3}}), Catch::Contains("dual_clip"));
  auto cispo = make_algorithm({.name = "cispo", .clip = {.low = 0.2, .high = 0.28}});
  CHECK(cispo->outcome()->advantages({{{.reward = 1}, {.reward = 0}}}, {})[0][0] == Approx(std::sqrt(0.5)).epsilon(1e-4));  // 0.5 / sqrt(0.5)
  // Two tokens of one sequence, A = 1.5: the step's own log-probs as the old ones (ratio 1,
  // weight 1), so the loss is -A mean(log pi) and its gradient -A / 2 per token.
  auto x = t({-0.5, -2.0}).requires_grad_(true);
  LossInputs in{.mask = t({1, 1}), .sequence = at::tensor({0, 0}, at::kLong).unsqueeze(0), .logprobs = x,
                .advantages = t({1.5, 1.5}), .old_logprobs = x.detach()};
  rlx::MetricSums sums;
  auto loss = cispo->loss(in, {.tokens = 2, .sequences = 1}, sums);
  CHECK(loss.item<double>() == Approx(-1.5 * (-0.5 - 2.0) / 2));
  loss.backward();
  CHECK(x.grad()[0][0].item<double>() == Approx(-0.75));
  CHECK(x.grad()[0][1].item<double>() == Approx(-0.75));
  auto m = sums.values();
  CHECK(m["clipped_tokens"] == 0);
  CHECK(m["ratio"] == 2);  // summed over tokens
}

TEST_CASE("algorithm.mask_truncated: a sample cut by max_new_tokens trains nothing, its reward still counts", "[algo]") {
  register_bundled_algorithms();
  ToyTask task;
  auto comm = rlx::dist::single_process();
  std::vector<rlx::Sequence> seqs;
  std::vector<double> rewards;
  std::vector<size_t> groups;
  task.sample(0, seqs, rewards, groups);
  // The truncated one: a sample of the first group whose reward is off its group's mean
  // (a nonzero advantage: its tokens would move the policy).
  double mean = 0;
  for (size_t i = 0; i < groups[0]; ++i) mean += rewards[i] / static_cast<double>(groups[0]);
  size_t cut = 0;
  while (cut < groups[0] && std::abs(rewards[cut] - mean) < 1e-9) ++cut;
  REQUIRE(cut < groups[0]);
  std::vector<uint8_t> truncated(seqs.size(), 0);
  truncated[cut] = 1;
  // The same step three ways: masked by train_on_batch; with the sample's mask cleared by
  // hand (the same update); not masked (a different one).
  auto run = [&](bool mask, bool clear_by_hand, std::vector<rlx::Sequence>& s) {
    rlx::Learner l(task.cfg, *comm, toy_options(2e-2));
    l.load_from(*task.model);
    auto algo = make_algorithm({.name = "grpo", .mask_truncated = mask});
    if (clear_by_hand) std::fill(s[cut].loss_mask.begin(), s[cut].loss_mask.end(), uint8_t{0});
    rlx::train_on_batch(*algo, {.policy = l}, s, rewards, groups, truncated);
    return l.model().gather_parameters();
  };
  auto a = seqs, b = seqs, c = seqs;
  const auto masked = run(true, false, a), by_hand = run(false, true, b), unmasked = run(false, false, c);
  CHECK(std::all_of(a[cut].loss_mask.begin(), a[cut].loss_mask.end(), [](uint8_t v) { return v == 0; }));
  CHECK(std::any_of(c[cut].loss_mask.begin(), c[cut].loss_mask.end(), [](uint8_t v) { return v == 1; }));
  // The truncated sample's reward is in its group's advantages, as without the mask.
  for (size_t i = 0; i < groups[0]; ++i) CHECK(a[i].values.at("advantages") == c[i].values.at("advantages"));
  bool all_equal = true, any_differs = false;
  for (size_t i = 0; i < masked.size(); ++i) {
    all_equal = all_equal && at::allclose(masked[i].second, by_hand[i].second, 1e-6, 1e-7);
    any_differs = any_differs || !at::allclose(masked[i].second, unmasked[i].second, 1e-6, 1e-7);
  }
  CHECK(all_equal);
  CHECK(any_differs);
  rlx::Learner l(task.cfg, *comm, toy_options(0));
  CHECK_THROWS_WITH(rlx::train_on_batch(*make_algorithm({.name = "grpo"}), {.policy = l}, a, rewards, groups, {1}),
                    Catch::Contains("1 truncation marks"));
}
