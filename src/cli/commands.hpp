// The `rlx` command line: each file registers one command group on CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace rlx::cli {

// A subcommand's action; returns the process exit code.
using Action = std::function<int()>;

// Exit codes: 0 ok, 1 runtime failure, 2 bad usage or config.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

void add_config_commands(CLI::App& app, Action& action);
void add_model_commands(CLI::App& app, Action& action);
void add_inspect_commands(CLI::App& app, Action& action);
void add_tokenize_command(CLI::App& app, Action& action);
void add_bench_commands(CLI::App& app, Action& action);
void add_generate_command(CLI::App& app, Action& action);
// After add_inspect_commands and add_bench_commands: adds to their groups.
void add_bus_commands(CLI::App& app, Action& action);
void add_env_commands(CLI::App& app, Action& action);
void add_learner_commands(CLI::App& app, Action& action);
void add_run_commands(CLI::App& app, Action& action);

}  // namespace rlx::cli
