#include "rlx/launch/rollout_config.hpp"

#include <catch2/catch.hpp>

#include "../helpers.hpp"

TEST_CASE("rollout config: top_p, top_k, min_p, stop and seed reach the sampler; update_policy the engine",
          "[launch][config]") {
  const auto cfg = rlx::config::load_string<rlx::RunConfig>(
      "run: {seed: 5}\n"
      "env: {max_turns: 3}\n"
      "rollout:\n"
      "  temperature: 0.7\n"
      "  top_p: 0.9\n"
      "  top_k: 40\n"
      "  min_p: 0.05\n"
      "  max_new_tokens: 64\n"
      "  stop: [\"</answer>\", \"\\n\\n\"]\n"
      "  seed: 11\n"
      "  update_policy: continue\n"
      "  block_size: 8\n"
      "  max_running: 64\n"
      "  max_batch_tokens: 4096\n"
      "  cuda_graphs: false\n");
  const auto o = rlx::launch::rollout_options(cfg);
  CHECK(o.max_turns == 3);
  CHECK(o.sampling.temperature == 0.7);
  CHECK(o.sampling.top_p == 0.9);
  CHECK(o.sampling.top_k == 40);
  CHECK(o.sampling.min_p == 0.05);
  CHECK(o.sampling.max_new_tokens == 64);
  CHECK(o.sampling.stop_strings == std::vector<std::string>{"</answer>", "\n\n"});
  CHECK(o.seed == 11);
  const auto e = rlx::launch::engine_config(cfg);
  CHECK(e.update_policy == rlx::UpdatePolicy::continue_);
  CHECK(e.block_size == 8);
  CHECK(e.max_running == 64);
  CHECK(e.max_batch_tokens == 4096);
  CHECK(!e.cuda_graphs);
  // The defaults: off, the run's seed, in-flight samples finish on their weights.
  const auto d = rlx::config::load_string<rlx::RunConfig>("run: {seed: 5}\n");
  CHECK(rlx::launch::rollout_options(d).seed == 5);
  CHECK(rlx::launch::rollout_options(d).sampling.top_p == 1.0);
  CHECK(rlx::launch::rollout_options(d).sampling.top_k == 0);
  CHECK(rlx::launch::rollout_options(d).sampling.stop_strings.empty());
  CHECK(rlx::launch::engine_config(d).update_policy == rlx::UpdatePolicy::finish_old);
  CHECK(rlx::launch::engine_config(d).max_running == rlx::EngineConfig{}.max_running);
  CHECK(rlx::launch::engine_config(d).max_batch_tokens == rlx::EngineConfig{}.max_batch_tokens);
  CHECK(rlx::launch::engine_config(d).cuda_graphs);
}

TEST_CASE("rollout config: bad sampling settings name their key before any process starts", "[launch][config]") {
  using rlx::test::error_of;
  auto load = [](const std::string& yaml) { return rlx::config::load_string<rlx::RunConfig>(yaml); };
  CHECK_THAT(error_of([&] { load("rollout: {top_p: 0}\n"); }), Catch::Contains("rollout.top_p"));
  CHECK_THAT(error_of([&] { load("rollout: {min_p: 1.5}\n"); }), Catch::Contains("rollout.min_p"));
  CHECK_THAT(error_of([&] { load("rollout: {top_k: -1}\n"); }), Catch::Contains("rollout.top_k"));
  CHECK_THAT(error_of([&] { load("rollout: {seed: -2}\n"); }), Catch::Contains("rollout.seed"));
  CHECK_THAT(error_of([&] { load("rollout: {update_policy: abort}\n"); }),
             Catch::Contains("rollout.update_policy") && Catch::Contains("continue"));
  CHECK_THAT(error_of([&] { load("rollout: {stop: [\"ok\", \"\"]}\n"); }),
             Catch::Contains("rollout") && Catch::Contains("stop[1] is empty"));
  CHECK_THAT(error_of([&] { load("log: {samples_every: -1}\n"); }), Catch::Contains("log.samples_every"));
}
