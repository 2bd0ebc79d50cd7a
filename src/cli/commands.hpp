// The `rlx` command line: each file registers one command group on CLI11.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "launch/trainer_commands.hpp"
#include "rlx/model/config.hpp"

namespace rlx::cli {

void add_config_commands(CLI::App& app, Action& action);
void add_model_commands(CLI::App& app, Action& action);
void add_inspect_commands(CLI::App& app, Action& action);
void add_tokenize_command(CLI::App& app, Action& action);
void add_chat_commands(CLI::App& app, Action& action);
void add_serve_command(CLI::App& app, Action& action);
void add_bench_commands(CLI::App& app, Action& action);
void add_generate_command(CLI::App& app, Action& action);
// After add_inspect_commands and add_bench_commands: adds to their groups.
void add_bus_commands(CLI::App& app, Action& action);
void add_env_commands(CLI::App& app, Action& action);
void add_learner_commands(CLI::App& app, Action& action);
// After add_bench_commands: `bench sync`.
void add_sync_bench(CLI::App& app, Action& action);

// `--arch FAMILY`, checked against the model families rlx builds (model/config.hpp).
inline CLI::Option* add_arch_option(CLI::App& cmd, std::string& arch) {
  const auto names = config::enum_name_list<Arch>();
  return cmd.add_option("--arch", arch, fmt::format("model family: {}", fmt::join(names, ", ")))
      ->check(CLI::IsMember(names));
}

// What the benches share.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
// This process's peak resident memory in MiB: VmHWM, counted from its exec. getrusage's
// ru_maxrss carries the parent's peak across fork and exec (a bench peer, a learner rank),
// so it is only the fallback without /proc.
inline double peak_rss_mb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace rlx::cli
