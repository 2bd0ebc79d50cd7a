// A trainer with an environment of its own: "reverse" asks for a word backwards, one turn,
// reward 1 for the exact reversal. A single-turn task is a prompt and a reward function
// (rlx/env/text_env.hpp). Registered before trainer_main reads the command line, it is there
// in every process of a run: workers, and the env servers they start. Hooks
// (rlx/launch/hooks.hpp) add a metric and report checkpoints.
//   ./reverse_trainer run examples/configs/grpo_arithmetic.yaml env.name=reverse env.options={}
#include "rlx/core/rng.hpp"
#include "rlx/env/text_env.hpp"
#include "rlx/launch/hooks.hpp"
#include "rlx/launch/main.hpp"

#include <iostream>

using nlohmann::json;

int main(int argc, char** argv) {
  return rlx::launch::trainer_main(argc, argv, "reverse_trainer", [] {
    rlx::env::add_text_env({
        .name = "reverse",
        .description = "write a word backwards",
        .prompt = [](const json& task) { return "Reverse " + task.at("word").get<std::string>() + ":"; },
        .reward = [](const json& task, std::string_view answer) { return answer == task.at("answer") ? 1.0 : 0.0; },
        // Task i: a word of 2 to 4 letters from a, b, c, from a stream keyed by (seed, i).
        .tasks = [](uint64_t seed, uint64_t index, const json&) -> json {
          rlx::RngStream rng(seed, rlx::hash_name("reverse") ^ index);
          std::string word;
          for (auto n = rng.uniform_int(2, 4); n > 0; --n) word += static_cast<char>('a' + rng.uniform_int(0, 2));
          return {{"word", word}, {"answer", std::string(word.rbegin(), word.rend())}};
        }});
    rlx::launch::add_hooks({
        .on_step = [](int64_t, json& m) { m["reversed_pct"] = 100 * m.value("reward_mean", 0.0); },
        .on_checkpoint = [](int64_t step, const std::filesystem::path& dir) {
          std::cerr << "reverse_trainer: step " << step << " checkpointed in " << dir.string() << std::endl;
        }});
  });
}
