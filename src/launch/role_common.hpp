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

// Threads per process: run.threads, else the cores shared among the roles.
void set_threads(const RunConfig& cfg);
// Set by SIGTERM/SIGINT once install_stop_handler() ran (the hub's and the learner's stop).
extern std::atomic<bool> g_stop;
void install_stop_handler();
// Greedy accuracy on cfg.sft.eval_tasks held-out tasks (a stream training never draws from).
// RLX_FAULT's marker in a run directory: each of its faults (core/fault.hpp) fires once per run.
std::filesystem::path fault_marker(const std::filesystem::path& run_dir);
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
