#include "rlx/learner/sample_stats.hpp"

#include <catch2/catch.hpp>

TEST_CASE("sample stats: the share cut by max_new_tokens, the environment's counters, a reward model's parts",
          "[learner]") {
  rlx::SampleStats stats;
  stats.add("length", R"({"env": {"errors_unparsed": 1, "errors_unextracted": 0}, "info": {"extracted": "7"}})");
  stats.add("stop", R"({"env": {"errors_unparsed": 0, "errors_unextracted": 1}})");
  stats.add("stop", R"({"env": {"errors_unparsed": 1, "steps": 3}, "reward_env": 1, "reward_model": 0.5})");
  stats.add("turns", "");                        // nothing to say
  stats.add("stop", "not json");                 // a user's worker may send anything
  stats.add("stop", R"({"env": [1, 2], "reward_env": 1})");  // not the shape: skipped
  stats.add("stop", R"({"env": {"x": "text", "y": null}})");  // only numbers count
  nlohmann::json line;
  stats.add_to(line);
  CHECK(line["truncated_fraction"] == Approx(1.0 / 7));
  CHECK(line["env_errors_unparsed"] == 2.0);
  CHECK(line["env_errors_unparsed_mean"] == Approx(2.0 / 7));
  CHECK(line["env_errors_unextracted"] == 1.0);
  CHECK(line["env_steps"] == 3.0);
  CHECK(!line.contains("env_x"));
  CHECK(line["reward_env_mean"] == 1.0);
  CHECK(line["reward_model_mean"] == 0.5);

  rlx::SampleStats empty;
  nlohmann::json none;
  empty.add_to(none);
  CHECK(none.empty());
  // The counters a step reports are bounded, whatever the environment sends.
  rlx::SampleStats many;
  for (int i = 0; i < 200; ++i) many.add("stop", nlohmann::json{{"env", {{"k" + std::to_string(i), 1}}}}.dump());
  nlohmann::json bounded;
  many.add_to(bounded);
  CHECK(bounded.size() == 1 + 2 * rlx::SampleStats::kMaxStepCounters);
}
