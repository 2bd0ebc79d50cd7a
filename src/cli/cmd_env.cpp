// rlx sandbox run [limits] -- CMD ...   one command in the sandbox; its output, then a verdict line
// rlx sandbox check                     the isolation layers this machine grants
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "rlx/core/error.hpp"
#include "rlx/env/sandbox.hpp"

namespace rlx::cli {

namespace {

nlohmann::json to_json(const SandboxResult& r) {
  return {{"verdict", std::string(config::enum_to_string(r.verdict))},
          {"exit_code", r.exit_code},
          {"signal", r.signal},
          {"wall_s", r.wall_s},
          {"cpu_s", r.cpu_s},
          {"max_rss_kb", r.max_rss_kb},
          {"detail", r.detail},
          {"stdout", r.stdout_text},
          {"stderr", r.stderr_text},
          {"stdout_truncated", r.stdout_truncated},
          {"stderr_truncated", r.stderr_truncated},
          {"isolation", r.isolation}};
}

// The exit code a shell user expects: the command's own, 124 on timeout (as timeout(1)),
// 125 when the sandbox itself failed, 128 + signal when a signal or a limit ended it.
int exit_code_of(const SandboxResult& r) {
  switch (r.verdict) {
    case SandboxVerdict::ok:
    case SandboxVerdict::memory: return r.exit_code;
    case SandboxVerdict::timeout: return 124;
    case SandboxVerdict::setup_error: return 125;
    case SandboxVerdict::output_limit: return 128 + 9;
    default: return 128 + r.signal;
  }
}

std::string read_host_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RLX_CHECK(in, "cannot read {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

void add_env_commands(CLI::App& app, Action& action) {
  auto* sb = app.add_subcommand("sandbox", "Run commands in the sandbox (namespaces, read-only root, seccomp, limits)");
  sb->require_subcommand(1);

  struct RunArgs {
    SandboxOptions options;
    std::vector<std::string> readonly, files, command;
    std::string stdin_file;
    bool warn = false, json = false;
  };
  auto a = std::make_shared<RunArgs>();
  auto* run = sb->add_subcommand("run", "Run one command in a fresh sandbox: its output, then a verdict line on stderr");
  auto& L = a->options.limits;
  run->add_option("--wall-s", L.wall_s, "wall-clock limit (s)")->capture_default_str();
  run->add_option("--cpu-s", L.cpu_s, "CPU limit per process (s)")->capture_default_str();
  run->add_option("--memory-mb", L.memory_mb, "address space per process (MiB)")->capture_default_str();
  run->add_option("--processes", L.processes, "processes at once")->capture_default_str();
  run->add_option("--file-mb", L.file_mb, "largest file written (MiB)")->capture_default_str();
  run->add_option("--open-files", L.open_files, "open files per process")->capture_default_str();
  run->add_option("--output-bytes", L.output_bytes, "captured stdout, and stderr, each")->capture_default_str();
  run->add_option("--scratch-mb", L.scratch_mb, "size of /scratch (MiB)")->capture_default_str();
  run->add_option("--ro", a->readonly, "host path visible read-only (repeat; replaces the default set)");
  run->add_option("--file", a->files, "NAME=HOSTPATH: copy a host file into /scratch/NAME first (repeat)");
  run->add_option("--stdin", a->stdin_file, "feed this file to the command's stdin");
  run->add_flag("--warn-missing", a->warn, "run even where the kernel refuses namespaces (loudly, without isolation)");
  run->add_flag("--json", a->json, "print the whole result (output included) as one JSON line instead");
  run->add_option("command", a->command, "the command and its arguments (after --)")->required();
  run->callback([a, &action] {
    action = [a] {
      if (!a->readonly.empty()) a->options.readonly_paths = a->readonly;
      if (a->warn) a->options.missing_layer = MissingLayer::warn;
      SandboxRequest req{.argv = a->command};
      if (!a->stdin_file.empty()) req.stdin_data = read_host_file(a->stdin_file);
      for (const auto& f : a->files) {
        const auto eq = f.find('=');
        RLX_CHECK(eq != std::string::npos && eq > 0, "--file '{}': expected NAME=HOSTPATH", f);
        req.files.emplace_back(f.substr(0, eq), read_host_file(f.substr(eq + 1)));
      }
      Sandbox sandbox(a->options);
      const SandboxResult r = sandbox.run(req);
      if (a->json) {
        std::cout << to_json(r).dump() << std::endl;
      } else {
        std::cout << r.stdout_text << std::flush;
        std::cerr << r.stderr_text;
        std::cerr << fmt::format("sandbox: {} exit={} signal={} wall={:.3f}s cpu={:.3f}s{}{}\n",
                                 config::enum_to_string(r.verdict), r.exit_code, r.signal, r.wall_s, r.cpu_s,
                                 r.detail.empty() ? "" : " -- ", r.detail);
      }
      return exit_code_of(r);
    };
  });

  auto* check = sb->add_subcommand("check", "Print the isolation layers this machine grants (JSON)");
  auto warn = std::make_shared<bool>(false);
  check->add_flag("--warn-missing", *warn, "report instead of failing where namespaces are refused");
  check->callback([warn, &action] {
    action = [warn] {
      SandboxOptions o;
      if (*warn) o.missing_layer = MissingLayer::warn;
      Sandbox sandbox(o);
      const auto r = sandbox.run({.argv = {"true"}});
      std::cout << nlohmann::json{{"layers", sandbox.layers()},
                                  {"trial_run", std::string(config::enum_to_string(r.verdict))},
                                  {"trial_detail", r.detail}}
                       .dump()
                << std::endl;
      return r.ok() ? 0 : kExitFailure;
    };
  });
}

}  // namespace rlx::cli
