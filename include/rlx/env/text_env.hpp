// A single-turn task from two functions: the prompt's text for a task and the reward of the
// policy's answer. rlx does the rest: tokens in and out, the stop string, a task generator
// when given, and the episode's checkpoint state (the task), so a stateless task writes no
// save/load code. Multi-turn environments implement rlx::env::Env (env.hpp).
//
//   rlx::env::add_text_env({
//       .name = "reverse",
//       .description = "write a word backwards",
//       .prompt = [](const json& task) { return "Reverse " + task.at("word").get<std::string>() + ":"; },
//       .reward = [](const json& task, std::string_view answer) { return answer == task.at("answer") ? 1.0 : 0.0; },
//       .tasks = make_task});  // optional: (seed, index, options) -> task
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/env/env.hpp"

namespace rlx::env {

struct TextTask {
  std::string name;
  std::string description;
  // The prompt's text for a task (a dataset row or a generated task).
  std::function<std::string(const nlohmann::json& task)> prompt;
  // The answer's reward: the sampled text up to the first stop string (excluded).
  std::function<double(const nlohmann::json& task, std::string_view answer)> reward;
  TaskGenerator tasks;                    // optional: tasks of its own, index-th of a seeded stream
  std::vector<std::string> stop = {"\n"};  // ends the answer (the sampler's stop sequence too)
};

// Registers the task as an environment named task.name (throws if the name is taken, or a
// function is missing). A reward function that throws fails the episode with an error
// naming the environment and the task.
void add_text_env(TextTask task, Registry& registry = Registry::global());

}  // namespace rlx::env
