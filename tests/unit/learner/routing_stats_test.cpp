// Rollout routing replay in the learner: recorded routing packed like the tokens, a
// mixture-of-experts learner that runs exactly the experts it is given, its agreement
// with the sampler's router, and the mismatch between sampler and learner it removes.
#include "rlx/learner/routing_stats.hpp"

#include <c10/core/GradMode.h>

#include <catch2/catch.hpp>

#include "rlx/algo/algorithm.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/learner/algorithm_loss.hpp"
#include "rlx/learner/learner.hpp"
#include "rlx/rollout/engine.hpp"

namespace {

rlx::ModelConfig moe_config() {
  auto c = rlx::model_preset("tiny-moe");  // 8 experts, top 2, 2 sparse layers
  c.vocab_size = 64;
  c.initializer_range = 0.08;  // peaked router probabilities: few near-ties
  return c;
}

// The engine's samples of `prompts` random prompts, n each, as the learner's sequences
// (prompt untrained, behaviour log-probs, the recorded routing), rewards and group sizes.
struct Batch {
  std::vector<rlx::Sequence> seqs;
  std::vector<double> rewards;
  std::vector<size_t> groups;
};
Batch roll(rlx::Engine& engine, int prompts, int n, uint64_t seed) {
  rlx::RngStream rng(seed, 7);
  std::vector<rlx::GenerationRequest> reqs;
  for (int p = 0; p < prompts; ++p) {
    std::vector<rlx::TokenId> prompt;
    for (int64_t i = 0, len = rng.uniform_int(4, 12); i < len; ++i) prompt.push_back(static_cast<rlx::TokenId>(rng.uniform_int(0, 63)));
    reqs.push_back({.id = "p" + std::to_string(p), .prompt = prompt,
                    .params = {.temperature = 1.0, .max_new_tokens = 10, .n = n, .ignore_eos = true}, .seed = seed});
  }
  Batch b;
  for (const auto& r : engine.generate(reqs)) {
    b.groups.push_back(r.samples.size());
    for (const auto& s : r.samples) {
      rlx::Sequence q;
      q.tokens.assign(r.prompt.begin(), r.prompt.end());
      q.tokens.insert(q.tokens.end(), s.tokens.begin(), s.tokens.end());
      q.loss_mask.assign(r.prompt.size(), 0);
      q.loss_mask.resize(q.tokens.size(), 1);
      auto& behaviour = q.values["behaviour_logprobs"];
      behaviour.assign(r.prompt.size(), 0.0f);
      behaviour.insert(behaviour.end(), s.logprobs.begin(), s.logprobs.end());
      q.routing = r.prompt_routing;
      q.routing.insert(q.routing.end(), s.routing.begin(), s.routing.end());
      q.routing_layers = r.routing_layers, q.routing_top_k = r.routing_top_k;
      b.rewards.push_back(s.tokens[0] % 2);
      b.seqs.push_back(std::move(q));
    }
  }
  return b;
}

rlx::LearnerOptions options(bool replay) {
  rlx::LearnerOptions o;
  o.optimizer.lr = 1e-3;
  o.packing = {.micro_batch_tokens = 256, .row_tokens = 64};
  o.routing_replay = replay;
  return o;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::shared_ptr<rlx::Transformer> moe_model(uint64_t seed) {
  auto m = std::make_shared<rlx::Transformer>(moe_config());
  m->init_weights(seed);
  return m;
}

// A fresh learner from `model`'s weights after one GRPO step on `batch`: the step's
// metrics, and the learner's parameters.
struct Trained {
  rlx::algo::Metrics metrics;
  std::vector<std::pair<std::string, at::Tensor>> parameters;
};
Trained train(const rlx::Transformer& model, const rlx::LearnerOptions& o, const Batch& batch) {
  rlx::algo::register_bundled_algorithms();
  auto comm = rlx::dist::single_process();
  rlx::Learner learner(model.config(), *comm, o);
  learner.load_from(model);
  auto grpo = rlx::algo::make_algorithm({.name = "grpo", .routing_replay = o.routing_replay});
  auto seqs = batch.seqs;
  auto m = rlx::train_on_batch(*grpo, {.policy = learner}, seqs, batch.rewards, batch.groups);
  return {std::move(m), learner.model().gather_parameters()};
}

}  // namespace

TEST_CASE("routing replay: recorded routing is packed with its tokens, a shared prompt's from its members",
          "[learner][routing]") {
  rlx::Engine engine(moe_model(5), {.block_size = 4});
  auto batch = roll(engine, 3, 3, 1);
  // The first sample's first two tokens recorded as none: its siblings' rows stand for the
  // shared prompt's.
  std::fill_n(batch.seqs[0].routing.begin(), 8, int16_t{-1});
  rlx::Sequence bare = batch.seqs[4];  // a sequence without routing
  bare.routing.clear(), bare.routing_layers = 0, bare.routing_top_k = 0;
  batch.seqs.push_back(bare);
  for (const bool share : {true, false}) {
    INFO((share ? "shared prompts" : "each its own prompt"));
    const auto mbs = rlx::pack_micro_batches(batch.seqs, {.micro_batch_tokens = 64, .row_tokens = 32, .share_prefix = share});
    int64_t rows = 0;
    for (const auto& mb : mbs) {
      REQUIRE(mb.routing.defined());
      REQUIRE(mb.routing.sizes() == at::IntArrayRef{mb.tokens.size(0), mb.tokens.size(1), 2, 2});
      const auto sq = mb.sequence.accessor<int64_t, 2>(), pos = mb.positions.accessor<int64_t, 2>();
      const auto seg = mb.segments.accessor<int64_t, 2>();
      const auto got = mb.routing.accessor<int16_t, 4>();
      // Token (r, t) of sequence q at position i carries q's row i.
      const auto expect = [&](int64_t r, int64_t t, const rlx::Sequence& q, int64_t i) {
        for (int64_t l = 0; l < 2; ++l)
          for (int64_t j = 0; j < 2; ++j) {
            const int16_t want = q.routing.empty() ? int16_t{-1} : q.routing[static_cast<size_t>((i * 2 + l) * 2 + j)];
            CHECK(got[r][t][l][j] == want);
          }
        ++rows;
      };
      for (int64_t r = 0; r < mb.tokens.size(0); ++r)
        for (int64_t t = 0; t < mb.tokens.size(1); ++t) {
          if (sq[r][t] >= 0) expect(r, t, batch.seqs[static_cast<size_t>(sq[r][t])], pos[r][t]);
          else if (seg[r][t] == 0) CHECK((mb.routing[r][t] < 0).all().item<bool>());  // padding
        }
      for (const auto& p : mb.shared)  // the prompt once: the first member that recorded it
        for (int64_t t = p.start; t < p.start + p.length; ++t) {
          const auto& first = batch.seqs[static_cast<size_t>(p.members[0])];
          const auto& second = batch.seqs[static_cast<size_t>(p.members[1])];
          expect(p.row, t, first.routing[static_cast<size_t>(pos[p.row][t] * 4)] >= 0 ? first : second, pos[p.row][t]);
        }
    }
    CHECK(rows > 0);
  }
  auto other = batch.seqs;
  other[2].routing_layers = 1, other[2].routing_top_k = 4;
  CHECK_THROWS_WITH(rlx::pack_micro_batches(other, {}), Catch::Contains("sequence 2 has routing of 1 sparse layers x top 4"));
  other = batch.seqs;
  other[3].routing.pop_back();
  CHECK_THROWS_WITH(rlx::pack_micro_batches(other, {}), Catch::Contains("sequence 3 has"));
}

TEST_CASE("routing replay: the learner runs exactly the experts it is given, and agrees with its own rollout",
          "[learner][routing]") {
  const auto cfg = moe_config();
  auto model = moe_model(6);
  rlx::Engine engine(model, {.block_size = 4});
  auto batch = roll(engine, 4, 4, 2);
  auto comm = rlx::dist::single_process();
  rlx::Learner replay(cfg, *comm, options(true)), routes_itself(cfg, *comm, options(false));
  replay.load_from(*model);
  routes_itself.load_from(*model);
  auto mb = rlx::pack_micro_batches(batch.seqs, options(true).packing).front();
  // Other experts than the recorded ones, for every recorded row.
  auto other = mb;
  other.routing = at::where(mb.routing >= 0, (mb.routing + 3) % cfg.num_experts, mb.routing);
  {
    c10::NoGradGuard no_grad;
    const auto direct = [&](const rlx::MicroBatch& m) {
      return rlx::gather_logprobs(model->forward(rlx::forward_input(m)), m.targets);
    };
    const auto lp_own = replay.logprobs(mb), lp_other = replay.logprobs(other);
    CHECK(max_diff(lp_own, direct(mb)) < 1e-4);
    CHECK(max_diff(lp_other, direct(other)) < 1e-4);
    CHECK(max_diff(lp_other, lp_own) > 1e-2);                       // the experts given are the ones run
    CHECK(max_diff(routes_itself.logprobs(other), lp_own) < 1e-4);  // without replay the router chooses
  }
  // The sampler's own routing, replayed: every recorded row agrees with the learner's router.
  const auto m = train(*model, options(true), batch).metrics;
  CHECK(m.at("moe/routing_agreement") == 1.0);
  CHECK(m.at("moe/load_max_over_mean") >= 1.0);
  CHECK(m.at("moe/router_entropy") > 0);
  CHECK(m.at("moe/router_entropy") <= std::log(8.0) + 1e-6);
  CHECK(m.at("moe/aux_loss") > 0);
  CHECK(m.at("mismatch_kl") < 1e-4);
}

TEST_CASE("routing replay: with a lower-precision sampler the routers disagree, replay lowers mismatch_kl",
          "[learner][routing]") {
  auto model = moe_model(7);
  // The sampler in bf16, the learner in fp32, the same weights.
  auto low = std::make_shared<rlx::Transformer>(model->config(), at::kBFloat16);
  {
    c10::NoGradGuard no_grad;
    auto from = model->hf_parameters();
    auto to = low->hf_parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].second.copy_(from[i].second);
  }
  rlx::Engine engine(low, {.block_size = 4});
  const auto batch = roll(engine, 8, 4, 3);
  std::map<bool, rlx::algo::Metrics> m;
  for (const bool replay : {false, true}) m[replay] = train(*model, options(replay), batch).metrics;
  INFO("agreement " << m[false].at("moe/routing_agreement") << " / " << m[true].at("moe/routing_agreement")
                    << ", mismatch_kl " << m[false].at("mismatch_kl") << " -> " << m[true].at("mismatch_kl"));
  CHECK(m[false].at("moe/routing_agreement") < 1.0);
  CHECK(m[false].at("moe/routing_agreement") > 0.8);
  CHECK(m[true].at("moe/routing_agreement") < 1.0);
  CHECK(m[true].at("mismatch_kl") < 0.5 * m[false].at("mismatch_kl"));
}

TEST_CASE("routing replay: the load-balancing loss, when asked for, trains the router and is reported",
          "[learner][routing]") {
  auto model = moe_model(8);
  rlx::Engine engine(model, {.block_size = 4});
  const auto batch = roll(engine, 4, 2, 4);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> after;
  for (const double coef : {0.0, 0.5}) {
    auto o = options(true);
    o.router_aux_loss_coef = coef;
    auto t = train(*model, o, batch);
    CHECK(t.metrics.at("moe/aux_loss") > 0);
    after.push_back(std::move(t.parameters));
  }
  // The loss's gradient reaches the routers.
  for (size_t i = 0; i < after[0].size(); ++i)
    if (after[0][i].first == "model.layers.0.mlp.gate.weight") CHECK(max_diff(after[0][i].second, after[1][i].second) > 0);
}

TEST_CASE("routing stats: sums over ranks and steps, reported as means", "[learner][routing]") {
  rlx::RoutingStats a{.agree = 9, .recorded = 10, .load = 1.5, .entropy = 1.0, .aux_loss = 2.0, .forwards = 1};
  auto b = rlx::RoutingStats::from(a.sums());
  b += a;
  std::map<std::string, double> m;
  b.add_to(m);
  CHECK(m.at("moe/routing_agreement") == Approx(0.9));
  CHECK(m.at("moe/load_max_over_mean") == Approx(1.5));
  CHECK(m.at("moe/aux_loss") == Approx(2.0));
  std::map<std::string, double> none;
  rlx::RoutingStats{}.add_to(none);  // a dense model: nothing
  CHECK(none.empty());
}
