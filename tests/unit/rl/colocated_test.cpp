#include "rlx/rl/colocated.hpp"

#include <c10/core/GradMode.h>

#include "../helpers.hpp"

using rlx::DeviceTurns;
using rlx::Engine;
using rlx::GenerationRequest;
using rlx::GenerationResult;

namespace {

std::shared_ptr<rlx::Transformer> tiny(uint64_t seed) {
  auto c = rlx::model_preset("tiny", rlx::Arch::qwen2);
  c.initializer_range = 0.08;
  auto m = std::make_shared<rlx::Transformer>(c);
  m->init_weights(seed);
  return m;
}

std::vector<GenerationRequest> requests() {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < 3; ++i)
    out.push_back({.id = "r" + std::to_string(i),
                   .prompt = {5, 17, 3, static_cast<rlx::TokenId>(40 + i)},
                   .params = {.temperature = 1.0, .max_new_tokens = 12, .n = 4},
                   .seed = 11});
  return out;
}

void require_same(const std::vector<GenerationResult>& a, const std::vector<GenerationResult>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].samples.size() == b[i].samples.size());
    for (size_t s = 0; s < a[i].samples.size(); ++s) {
      REQUIRE(a[i].samples[s].tokens == b[i].samples[s].tokens);
      REQUIRE(a[i].samples[s].logprobs == b[i].samples[s].logprobs);
      REQUIRE(a[i].samples[s].versions == b[i].samples[s].versions);
    }
  }
}

}  // namespace

TEST_CASE("engine sleep and wake: the KV pool is freed and comes back; generation is unchanged",
          "[rollout][colocated]") {
  Engine reference(tiny(1), {.kv_cache_blocks = 64});
  const auto expected = reference.generate(requests());

  Engine engine(tiny(1), {.kv_cache_blocks = 64});
  (void)engine.generate(requests());  // fills the prefix cache
  engine.sleep();
  REQUIRE(engine.asleep());
  REQUIRE(engine.blocks().num_free() == engine.blocks().num_blocks());  // nothing cached survives
  REQUIRE_THROWS_WITH(engine.step(), Catch::Matchers::Contains("asleep"));
  engine.wake();
  REQUIRE_FALSE(engine.asleep());
  require_same(engine.generate(requests()), expected);
  REQUIRE(engine.kv_pool_bytes() == 64 * rlx::PagedKVCache::block_bytes(tiny(1)->config(), 16, at::kFloat));
}

TEST_CASE("colocated weights: one copy into an idle engine, seen at once; a busy engine refuses", "[rollout][colocated]") {
  auto learner_model = tiny(2);  // the learner's weights after a step
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& [name, p] : learner_model->hf_parameters()) params.emplace_back(name, p);
  const auto layout = rlx::dist::WeightLayout::of(params, at::kFloat);

  Engine engine(tiny(1), {.kv_cache_blocks = 64});
  rlx::rl::ColocatedWeights weights(engine, layout);
  REQUIRE(weights.version() == 0);
  const int64_t bytes = weights.publish(1, params);
  int64_t expected_bytes = 0;
  for (const auto& [name, p] : params) expected_bytes += p.numel() * 4;
  REQUIRE(bytes == expected_bytes);
  REQUIRE(weights.version() == 1);
  REQUIRE(engine.weight_version() == 1);
  REQUIRE_FALSE(weights.poll().has_value());  // nothing to take: the engine has it

  // The engine now samples what an engine built on the learner's weights samples.
  Engine fresh(tiny(2), {.kv_cache_blocks = 64}, nullptr, /*weight_version=*/1);
  require_same(engine.generate(requests()), fresh.generate(requests()));

  // Versions only go up; a wrong layout is named; an engine with work refuses the copy.
  REQUIRE_THROWS_WITH(weights.publish(1, params), Catch::Matchers::Contains("versions must increase"));
  auto short_list = params;
  short_list.pop_back();
  REQUIRE_THROWS(weights.publish(2, short_list));
  engine.add(requests().front());
  REQUIRE_THROWS_WITH(weights.publish(2, params), Catch::Matchers::Contains("in flight"));
  (void)engine.run();
  REQUIRE(weights.publish(2, params) == bytes);
}

TEST_CASE("colocated hand-over: training takes the KV pool, generation gets it back", "[rollout][colocated]") {
  Engine engine(tiny(1), {.kv_cache_blocks = 32});
  DeviceTurns turns({.on_switch = rlx::rl::kv_handover(engine)});
  const auto before = [&] {
    auto t = turns.hold(DeviceTurns::Use::generate);
    REQUIRE_FALSE(engine.asleep());
    return engine.generate(requests());
  }();
  {
    auto t = turns.hold(DeviceTurns::Use::train);
    REQUIRE(engine.asleep());
  }
  auto t = turns.hold(DeviceTurns::Use::generate);
  REQUIRE_FALSE(engine.asleep());
  require_same(engine.generate(requests()), before);
}

TEST_CASE("colocated weights, staged (generation and training overlap): the worker takes the version between grants",
          "[rollout][colocated]") {
  auto learner_model = tiny(2);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& [name, p] : learner_model->hf_parameters()) params.emplace_back(name, p);
  Engine engine(tiny(1), {.kv_cache_blocks = 64});
  rlx::rl::ColocatedWeights weights(engine, rlx::dist::WeightLayout::of(params, at::kFloat), /*staged=*/true);
  engine.add(requests().front());  // the engine is busy: a publish must not touch its weights
  weights.publish(1, params);
  weights.publish(2, params);      // a newer version replaces the one not yet taken
  {
    c10::NoGradGuard no_grad;
    for (auto& [name, p] : learner_model->hf_parameters()) p.add_(1.0);  // the learner trains on
  }
  REQUIRE(engine.weight_version() == 0);
  (void)engine.run();
  auto u = weights.poll();
  REQUIRE(u.has_value());
  REQUIRE(u->version == 2);
  REQUIRE_FALSE(weights.poll().has_value());
  engine.load_weights(u->version, u->tensors);
  REQUIRE(weights.version() == 2);
  // The engine has the weights as published, not as the learner changed them afterwards.
  Engine fresh(tiny(2), {.kv_cache_blocks = 64}, nullptr, /*weight_version=*/2);
  require_same(engine.generate(requests()), fresh.generate(requests()));
}
