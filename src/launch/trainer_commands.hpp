// The trainer commands on CLI11 (internal: the `rlx` binary and trainer_main use them).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace rlx::cli {

// A subcommand's action; returns the process exit code.
using Action = std::function<int()>;

// Exit codes: 0 ok, 1 runtime failure, 2 bad usage or config.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Parses argv, runs the chosen action, and turns errors into messages and exit codes.
int run_app(CLI::App& app, int argc, char** argv, const Action& action);

}  // namespace rlx::cli

namespace rlx::launch {

// run, sft, eval, scale, k8s render, and the internal role and env serve (an `env` group).
void add_trainer_commands(CLI::App& app, cli::Action& action);

}  // namespace rlx::launch
