// Reward models: the score of a sequence, batched and padded as alone; the HF
// sequence-classifier directory round trip; the Bradley-Terry loss's gradient (against finite
// differences); the rollout side's combination of an environment's reward and the scores.
#include <c10/core/GradMode.h>

#include "rlx/learner/preference.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/reward_model.hpp"
#include "rlx/model/safetensors.hpp"
#include "rlx/rl/worker.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "../helpers.hpp"
#include "../test_models.hpp"

namespace {

rlx::ModelConfig shape(bool tied = true) {
  return rlx::test::test_model({.vocab = 29, .hidden = 16, .heads = 2, .kv_heads = 1, .head_dim = 8, .intermediate = 23,
                                .qwen2 = true, .tied = tied});
}

std::vector<std::vector<int64_t>> sequences() { return {{1, 5, 7, 3, 9}, {2, 8}, {4, 4, 4, 1, 2, 3, 6, 7}, {11}}; }

}  // namespace

TEST_CASE("reward model: a sequence's score is the head at its last token, batched or alone", "[model][reward]") {
  auto body = std::make_shared<rlx::Transformer>(shape());
  body->init_weights(3);
  at::manual_seed(1);
  const auto head = at::randn({16});
  rlx::RewardModel rm(body, head);
  const auto seqs = sequences();
  const auto batched = rm.score(seqs);
  const auto one_by_one = rm.score(seqs, /*max_batch_tokens=*/1);
  REQUIRE(batched.size() == seqs.size());
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto hidden = body->forward_hidden({.tokens = at::tensor(seqs[i], at::kLong).view({1, -1})});
    const double want = at::dot(hidden[0][-1], head).item<double>();
    CHECK(batched[i] == Approx(want).epsilon(1e-5).margin(1e-6));
    CHECK(one_by_one[i] == Approx(want).epsilon(1e-5).margin(1e-6));
  }
  CHECK_THROWS_WITH(rm.score({{1, 2}, {}}), Catch::Contains("sequence 1 is empty"));
  CHECK_THROWS_WITH(rlx::RewardModel(body, at::zeros({15})), Catch::Contains("hidden size is 16"));
}

TEST_CASE("reward model: saved as an HF sequence classifier, loaded back with the same scores", "[model][reward]") {
  rlx::test::TempDir dir;
  for (bool tied : {true, false}) {
    auto body = std::make_shared<rlx::Transformer>(shape(tied));
    body->init_weights(3);
    at::manual_seed(2);
    const auto head = at::randn({16});
    const auto out = dir / (tied ? "tied" : "untied");
    rlx::save_hf_reward_model(*body, head, out);
    const auto config = nlohmann::json::parse(rlx::test::read_file(out / "config.json"));
    CHECK(config["architectures"] == nlohmann::json({"Qwen2ForSequenceClassification"}));
    CHECK(config["id2label"].size() == 1);
    auto file = rlx::SafetensorsFile::open(out / "model.safetensors");
    bool has_score = false, has_head = false;
    for (const auto& e : file.header().entries) {
      has_score = has_score || e.name == "score.weight";
      has_head = has_head || e.name == "lm_head.weight";
    }
    CHECK(has_score);
    CHECK_FALSE(has_head);  // a classifier has no LM head, tied or not
    CHECK(file.tensor("score.weight").sizes() == at::IntArrayRef{1, 16});

    auto loaded = rlx::RewardModel::load(out);
    rlx::RewardModel original(body, head);
    const auto a = original.score(sequences()), b = loaded.score(sequences());
    for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == Approx(a[i]).epsilon(1e-6));
    // A causal LM's loader refuses it (naming the head), and the other way round.
    CHECK_THROWS_WITH(rlx::load_hf(out), Catch::Contains("score.weight") || Catch::Contains("lm_head.weight"));
  }
  rlx::Transformer lm(shape());
  lm.init_weights(1);
  rlx::save_hf(lm, dir / "lm");
  CHECK_THROWS_WITH(rlx::RewardModel::load(dir / "lm"), Catch::Contains("not a sequence classifier's directory"));
}

TEST_CASE("Bradley-Terry: the per-sequence loss has the pairwise loss's gradient (finite differences)",
          "[learner][reward]") {
  auto comm = rlx::dist::single_process();
  rlx::LearnerOptions lo;
  lo.policy_head = false;
  lo.value_head = true;
  lo.packing = {.micro_batch_tokens = 16, .row_tokens = 10};  // pairs split across micro-batches
  rlx::Learner rm(shape(), *comm, lo);
  rm.init_weights(4);
  {
    c10::NoGradGuard no_grad;
    at::manual_seed(3);
    rm.value_head().copy_(at::randn_like(rm.value_head()) * 0.5);
  }
  const std::vector<rlx::PreferencePair> pairs{
      {{1, 2, 3, 4}, {1, 2, 3, 9}}, {{5, 6, 7}, {5, 6, 8, 8, 8}}, {{9, 1}, {9, 2}}};
  // The mean pairwise loss at the current weights.
  const auto loss = [&] {
    auto seqs = rlx::preference_sequences(pairs, 0);
    rm.annotate(seqs, "", rlx::kPreferenceScore);
    return rlx::bradley_terry(seqs).loss;
  };
  auto seqs = rlx::preference_sequences(pairs, 0);
  CHECK(seqs.size() == 6);
  CHECK(seqs[0].tokens.back() == 0);
  CHECK(seqs[0].loss_mask.back() == 1);
  rm.annotate(seqs, "", rlx::kPreferenceScore);
  const auto stats = rlx::bradley_terry(seqs);
  CHECK(stats.loss == Approx(loss()));
  // The surrogate's gradient (step() without its update: forward, backward by hand).
  for (auto t : rm.trained_tensors()) t.mutable_grad() = at::Tensor();
  const auto fn = rlx::bradley_terry_loss();
  rlx::MetricSums m;
  for (const auto& mb : rlx::pack_micro_batches(seqs, lo.packing)) {
    auto hidden = rm.model().forward_hidden({.tokens = mb.tokens, .segments = mb.segments});
    const int64_t h = rm.value_head().size(0) - 1;
    rlx::TokenOutputs out{.values = at::matmul(hidden, rm.value_head().narrow(0, 0, h)) + rm.value_head()[h]};
    fn(mb, out, {}, m).backward();
  }
  rm.model().finish_backward();
  const auto grad = rm.value_head().grad().clone();
  CHECK(grad.abs().sum().item<double>() > 0);
  CHECK(std::abs(grad[-1].item<double>()) < 1e-6);  // blind to a bias
  at::manual_seed(5);
  const auto dir = at::randn_like(rm.value_head());
  const double eps = 1e-3;
  c10::NoGradGuard no_grad;
  rm.value_head().add_(dir, eps);
  const double up = loss();
  rm.value_head().add_(dir, -2 * eps);
  const double down = loss();
  rm.value_head().add_(dir, eps);
  // The scores are annotated in fp32: the central difference is good to a few 1e-3.
  CHECK(at::dot(grad, dir).item<double>() == Approx((up - down) / (2 * eps)).epsilon(1e-2));
  // Accuracy and ties.
  std::vector<rlx::Sequence> tie = rlx::preference_sequences({{{1}, {2}}}, 0);
  tie[0].values[rlx::kPreferenceScore] = {0, 0.3f};
  tie[1].values[rlx::kPreferenceScore] = {0, 0.3f};
  CHECK(rlx::bradley_terry(tie).accuracy == 0.5);
  CHECK(rlx::bradley_terry(tie).loss == Approx(std::log(2.0)));
}

TEST_CASE("reward model on the rollout side: env_coef x the environment's reward + coef x the score", "[rollout][reward]") {
  std::vector<rlx::rl::GroupRollout> groups(3);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int k = 0; k < 2; ++k) {
      rlx::env::Episode ep;
      ep.tokens = {static_cast<rlx::TokenId>(g), static_cast<rlx::TokenId>(k + 1)};
      ep.reward = 1.0;
      groups[g].episodes.push_back(ep);
      groups[g].versions.push_back({-1, -1});
    }
  }
  groups[1].error = "the env failed";  // not scored
  rlx::rl::WorkerOptions o;
  int calls = 0;
  o.score = [&](const std::vector<std::vector<int64_t>>& seqs) {
    ++calls;
    std::vector<double> out;
    for (const auto& s : seqs) out.push_back(10.0 * static_cast<double>(s[0]) + static_cast<double>(s[1]));
    return out;
  };
  o.score_coef = 0.5;
  o.env_coef = 2.0;
  rlx::rl::score_episodes(groups, o);
  CHECK(calls == 1);  // one batched call for the grant
  CHECK(groups[0].episodes[0].reward == 2.0 + 0.5 * 1);
  CHECK(groups[0].episodes[1].reward == 2.0 + 0.5 * 2);
  CHECK(groups[2].episodes[1].reward == 2.0 + 0.5 * 22);
  CHECK(groups[1].episodes[0].reward == 1.0);
  // Each trajectory carries the two parts, for the metrics line.
  REQUIRE(groups[2].reward_parts.size() == 2);
  CHECK(groups[2].reward_parts[1] == std::pair<double, double>{1.0, 22.0});
  CHECK(groups[1].reward_parts.empty());
  const auto sent = rlx::rl::to_trajectory_group(groups[2], "w");
  CHECK(nlohmann::json::parse(sent.samples[1].metadata) == nlohmann::json{{"reward_env", 1.0}, {"reward_model", 22.0}});
  // A scorer that fails sends the groups back as infra errors (their leases are retried).
  o.score = [](const std::vector<std::vector<int64_t>>&) -> std::vector<double> { throw rlx::Error("out of memory"); };
  rlx::rl::score_episodes(groups, o);
  CHECK(groups[0].error_kind == "infra");
  CHECK_THAT(groups[0].error, Catch::Contains("reward model: out of memory"));
}
