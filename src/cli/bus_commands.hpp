// What the bus commands (cmd_bus.cpp) and the bus benchmark (bench_bus.cpp) share.
#pragma once

#include "commands.hpp"
#include "rlx/bus/message.hpp"

namespace rlx::cli {

// A group for `lease` with deterministic synthetic contents: `tokens` per sample, the first
// `prompt_len` of them the prompt.
bus::TrajectoryGroup synthetic_group(const bus::Lease& lease, int tokens, int prompt_len);

// rlx bench bus (and its internal peer processes).
void add_bench_bus(CLI::App& app, Action& action);

}  // namespace rlx::cli
