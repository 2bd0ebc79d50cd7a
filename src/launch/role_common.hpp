// What the role files of src/launch share (internal).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "rlx/launch/config.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/model/transformer.hpp"

namespace rlx::launch {

// Threads per process: run.threads, else the cores shared among the roles.
void set_threads(const RunConfig& cfg);
// Set by SIGTERM/SIGINT once install_stop_handler() ran (the hub's and the learner's stop).
extern std::atomic<bool> g_stop;
void install_stop_handler();
// A span from start_us to now in this process's trace (trace.enabled).
void trace_span(const char* name, int64_t start_us);
// Greedy accuracy on cfg.sft.eval_tasks held-out tasks (a stream training never draws from).
double greedy_accuracy(const RunConfig& cfg, const std::shared_ptr<Transformer>& model,
                       const std::shared_ptr<const Tokenizer>& tok);

}  // namespace rlx::launch
