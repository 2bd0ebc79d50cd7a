// rlx sandbox run [limits] -- CMD ...   one command in the sandbox; its output, then a verdict line
// rlx sandbox check                     the isolation layers this machine grants
// rlx env serve --address A --tokenizer T  an environment server (all registered environments)
// rlx env list                          registered environments
// rlx bench env                         sandbox overhead per execution; environment steps/s
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <sstream>

#include "commands.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/env/server.hpp"
#include "rlx/core/log.hpp"

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
    case SandboxVerdict::cancelled: return 128 + SIGTERM;
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


double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The same command without a sandbox: posix_spawn and wait.
double run_bare(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const double t0 = now_s();
  pid_t pid = 0;
  RLX_CHECK(::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) == 0, "bench env: cannot spawn {}", argv[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  RLX_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bench env: {} failed bare", argv[0]);
  return now_s() - t0;
}

void add_bench_env(CLI::App& app, Action& action) {
  struct Args {
    int runs = 30, steps = 2000;
  };
  auto a = std::make_shared<Args>();
  auto* c = app.get_subcommand("bench")->add_subcommand("env", "Sandbox overhead per execution (python3 -c pass, bare vs sandboxed) and env steps/s");
  c->add_option("--runs", a->runs, "executions per side (medians reported)")->capture_default_str();
  c->add_option("--steps", a->steps, "arithmetic episodes (reset + step)")->capture_default_str();
  c->callback([a, &action] {
    action = [a] {
      const std::vector<std::string> argv = {"/usr/bin/python3", "-c", "pass"};
      Sandbox sandbox;
      std::vector<double> bare, boxed, boxed_true;
      (void)run_bare(argv);  // warm the page cache
      (void)sandbox.run({.argv = argv});
      for (int i = 0; i < a->runs; ++i) {
        bare.push_back(run_bare(argv));
        const auto r = sandbox.run({.argv = argv});
        RLX_CHECK(r.ok(), "bench env: sandboxed python failed: {} {}", config::enum_to_string(r.verdict), r.detail);
        boxed.push_back(r.wall_s);
        boxed_true.push_back(sandbox.run({.argv = {"/bin/true"}}).wall_s);
      }
      const double t0 = now_s();
      for (int i = 0; i < a->runs; ++i) (void)sandbox.run({.argv = argv});
      const double per_exec = (now_s() - t0) / a->runs;
      // Environment steps: arithmetic, char tokenizer, the right answer every time.
      const CharTokenizer tok(default_char_alphabet());
      env::Registry reg;
      env::register_bundled(reg);
      auto e = reg.make("arithmetic", {.tokenizer = &tok});
      std::vector<nlohmann::json> tasks;
      for (int i = 0; i < a->steps; ++i) tasks.push_back(reg.generate("arithmetic", 0, static_cast<uint64_t>(i)));
      const double t1 = now_s();
      double reward = 0;
      for (const auto& t : tasks) {
        e->reset(t);
        reward += e->step(tok.encode(std::to_string(t["answer"].get<long long>()))).reward;
      }
      const double env_s = now_s() - t1;
      RLX_CHECK(reward == a->steps, "bench env: arithmetic scored {} of {}", reward, a->steps);
      const nlohmann::json j = {{"bench", "env"},
                                {"python_bare_ms", 1e3 * median(bare)},
                                {"python_sandboxed_ms", 1e3 * median(boxed)},
                                {"overhead_ms", 1e3 * (median(boxed) - median(bare))},
                                {"true_sandboxed_ms", 1e3 * median(boxed_true)},
                                {"sandboxed_execs_per_s", 1.0 / per_exec},
                                {"arithmetic_steps_per_s", a->steps / env_s},
                                {"runs", a->runs},
                                {"isolation", sandbox.layers()}};
      std::cout << j.dump() << std::endl;
      return 0;
    };
  });
}

std::atomic<bool> g_serve_stop{false};

void add_env_serve(CLI::App& app, Action& action) {
  auto* envc = app.add_subcommand("env", "Environments: list them, serve them to rollout workers");
  envc->require_subcommand(1);
  struct Args {
    env::EnvServerOptions server;
    std::string tokenizer, options = "{}";
    uint64_t seed = 0;
    bool code_sandbox = false;
  };
  auto a = std::make_shared<Args>();
  auto* serve = envc->add_subcommand("serve", "Serve the registered environments on a socket (until SIGTERM)");
  serve->add_option("--address", a->server.address, "ipc://PATH or tcp://HOST:PORT")->required();
  serve->add_option("--tokenizer", a->tokenizer, "tokenizer.json (observations are token ids)")->required();
  serve->add_option("--options", a->options, "environment options (JSON object)")->capture_default_str();
  serve->add_option("--seed", a->seed, "seed given to environments")->capture_default_str();
  serve->add_option("--max-episodes", a->server.max_episodes, "open episodes at once")->capture_default_str();
  serve->add_flag("--code-sandbox", a->code_sandbox,
                  "give environments that run code (python_code) a sandbox of their own; the server itself must then "
                  "run outside one (namespaces do not nest under the sandbox's filter)");
  serve->callback([a, &action] {
    action = [a] {
      const auto tok = load_tokenizer(a->tokenizer);
      std::unique_ptr<Sandbox> code_sandbox;
      if (a->code_sandbox) code_sandbox = std::make_unique<Sandbox>();
      nlohmann::json options;
      try {
        options = nlohmann::json::parse(a->options);
      } catch (const nlohmann::json::exception& e) {
        throw ConfigError(fmt::format("--options: not JSON: {}", e.what()));
      }
      env::register_bundled();
      on_stop_signals([](int) { g_serve_stop = true; });
      env::serve_envs(a->server, env::Registry::global(),
                      {.tokenizer = tok.get(), .sandbox = code_sandbox.get(), .options = options, .seed = a->seed}, g_serve_stop);
      return 0;
    };
  });
  auto* list = envc->add_subcommand("list", "The registered environments");
  list->callback([&action] {
    action = [] {
      env::register_bundled();
      for (const auto& [name, description] : env::Registry::global().list()) std::cout << name << "\t" << description << "\n";
      return 0;
    };
  });
}

}  // namespace

void add_env_commands(CLI::App& app, Action& action) {
  auto* sb = app.add_subcommand("sandbox", "Run commands in the sandbox (namespaces, read-only root, seccomp, limits)");
  sb->require_subcommand(1);

  struct RunArgs {
    SandboxOptions options;
    std::vector<std::string> readonly, writable, files, command;
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
  run->add_option("--ro", a->readonly, "host path visible read-only (repeat; replaces the default set)")->allow_extra_args(false);
  run->add_option("--rw", a->writable, "host path visible and writable (repeat; e.g. a socket directory)")->allow_extra_args(false);
  run->add_option("--file", a->files, "NAME=HOSTPATH: copy a host file into /scratch/NAME first (repeat)")->allow_extra_args(false);
  run->add_option("--stdin", a->stdin_file, "feed this file to the command's stdin");
  run->add_flag("--warn-missing", a->warn, "run even where the kernel refuses namespaces (loudly, without isolation)");
  run->add_flag("--json", a->json, "print the whole result (output included) as one JSON line instead");
  run->add_option("command", a->command, "the command and its arguments (after --)")->required();
  run->callback([a, &action] {
    action = [a] {
      if (!a->readonly.empty()) a->options.readonly_paths = a->readonly;
      a->options.writable_paths = a->writable;
      if (a->warn) a->options.missing_layer = MissingLayer::warn;
      SandboxRequest req{.argv = a->command};
      if (!a->stdin_file.empty()) req.stdin_data = read_host_file(a->stdin_file);
      for (const auto& f : a->files) {
        const auto eq = f.find('=');
        RLX_CHECK(eq != std::string::npos && eq > 0, "--file '{}': expected NAME=HOSTPATH", f);
        req.files.emplace_back(f.substr(0, eq), read_host_file(f.substr(eq + 1)));
      }
      Sandbox sandbox(a->options);
      // SIGTERM / SIGINT end the sandbox first (its whole pid namespace), then this process.
      static std::atomic<bool> cancel{false};
      on_stop_signals([](int) { cancel = true; });
      req.cancel = &cancel;
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
  add_bench_env(app, action);
  add_env_serve(app, action);
}

}  // namespace rlx::cli
