// What the role files of src/launch share (internal).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "rlx/core/fault.hpp"
#include "rlx/launch/config.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/model/transformer.hpp"

namespace rlx::launch {

// `rlx role NAME ...`'s arguments: trainer_main.cpp parses them, run_role (role_main.cpp)
// starts the role's process with them.
struct RoleArgs {
  std::string role, config, run_dir, weights, exe, transport = "local";
  int index = 0;
};
int run_role(const RoleArgs& args);
// Threads per process: run.threads, else the cores shared among the roles.
void set_threads(const RunConfig& cfg);
// Set by SIGTERM/SIGINT once install_stop_handler() ran (the hub's and the learner's stop).
extern std::atomic<bool> g_stop;
void install_stop_handler();
// This process's peak memory in MiB: on a CUDA model.device what LibTorch's allocator
// handed out at most, else the peak resident set (ru_maxrss).
double peak_memory_mb(const RunConfig& cfg);
// One of the environment's generated tasks as a supervised example: the prompt its
// environment renders, and the reference completion (the task's "completion", or its
// "answer" and a newline). `who` names the caller in the error for a task with neither.
struct TaskExample {
  std::vector<TokenId> prompt;
  std::string completion;
};
TaskExample task_example(const RunConfig& cfg, const Tokenizer& tok, uint64_t seed, uint64_t index, const char* who);

double greedy_accuracy(const RunConfig& cfg, const std::shared_ptr<Transformer>& model,
                       const std::shared_ptr<const Tokenizer>& tok);

}  // namespace rlx::launch
