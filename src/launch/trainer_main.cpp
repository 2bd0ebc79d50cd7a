// The trainer commands (rlx's, and those of a user's trainer through trainer_main):
// rlx run CONFIG [key=value ...]    validate the config, then start and watch every role
// rlx sft / eval CONFIG             warm start; greedy held-out accuracy
// rlx rm CONFIG                     a reward model from preference pairs
// rlx scale RUN_DIR --workers N     rollout workers of a running job
// rlx k8s render CONFIG             the Kubernetes manifest of the plan
// rlx role NAME --config F ...      one role of a run (what `rlx run` starts; internal)
// rlx env serve --address A ...     an environment server (what workers start; internal)
// rlx sandbox run [limits] -- CMD   one command in the sandbox (how env servers are started)
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "launch/trainer_commands.hpp"
#include "rlx/algo/algorithm.hpp"
#include "rlx/bus/hub.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/env/server.hpp"
#include "rlx/launch/main.hpp"
#include "rlx/launch/launcher.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/launch/tasks.hpp"
#include "role_common.hpp"

namespace rlx::launch {

using cli::Action;
using cli::kExitFailure;
using cli::kExitUsage;

namespace {
// The whole config, checked before any process starts.
void validate_run_config(const RunConfig& cfg) {
  cfg.model.validate();
  cfg.learner.validate();
  const auto algorithm = algo::make_algorithm(cfg.algorithm);  // a registered name, valid options
  if (!cfg.algorithm.teacher.empty() && !algorithm->needs_teacher())
    throw ConfigError(fmt::format("algorithm.teacher: algorithm {} uses no teacher (algorithm distill does)",
                                  cfg.algorithm.name));
  if (algorithm->needs_teacher() && !std::filesystem::exists(std::filesystem::path(cfg.algorithm.teacher) / "config.json"))
    throw ConfigError(fmt::format("algorithm.teacher: {} is not an HF model directory (no config.json)",
                                  cfg.algorithm.teacher));
  if (!cfg.reward_model.path.empty() && !std::filesystem::exists(std::filesystem::path(cfg.reward_model.path) / "config.json"))
    throw ConfigError(fmt::format("reward_model.path: {} is not an HF model directory (no config.json)",
                                  cfg.reward_model.path));
  env::register_bundled();
  if (!env::Registry::global().has(cfg.env.name)) {
    std::vector<std::string> names;
    for (const auto& [name, description] : env::Registry::global().list()) names.push_back(name);
    const auto guess = config::closest(cfg.env.name, names);
    throw ConfigError(fmt::format("env.name: unknown environment '{}' (registered: {}){}", cfg.env.name, fmt::join(names, ", "),
                                  guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
  }
  // Placement: every learner rank trains at least one group of a step.
  if (cfg.train.learner_ranks > cfg.train.groups_per_step)
    throw ConfigError(fmt::format("train.learner_ranks = {}: more learner ranks than train.groups_per_step = {}",
                                  cfg.train.learner_ranks, cfg.train.groups_per_step));
  if (cfg.train.placement == Placement::colocated) {
    if (cfg.train.learner_ranks != 1)
      throw ConfigError(fmt::format("train.placement = colocated with train.learner_ranks = {}: a colocated run has one "
                                    "learner rank with its rollout engine in the same process (several colocated ranks "
                                    "are not built); set train.learner_ranks = 1 or train.placement = split",
                                    cfg.train.learner_ranks));
    if (cfg.rollout.workers != 1)
      throw ConfigError(fmt::format("train.placement = colocated with rollout.workers = {}: a colocated run's one rollout "
                                    "engine lives in the learner process; set rollout.workers = 1 or train.placement = split",
                                    cfg.rollout.workers));
    if (cfg.train.weight_sync != WeightSync::auto_)
      throw ConfigError(fmt::format("train.weight_sync = {} with train.placement = colocated: a colocated run copies the "
                                    "weights into its engine in process; leave train.weight_sync at auto",
                                    config::enum_to_string(cfg.train.weight_sync)));
  }
  if (cfg.algorithm.routing_replay && !cfg.rollout.record_routing)
    throw ConfigError("algorithm.routing_replay with rollout.record_routing = false: the learner replays the experts "
                      "the engine records; set rollout.record_routing = true");
  if (cfg.train.weight_sync == WeightSync::shm && cfg.train.transport == Transport::tcp)
    throw ConfigError("train.weight_sync = shm with train.transport = tcp: shared memory reaches one host only; use "
                      "tcp, broadcast or auto");
}

nlohmann::json to_json(const env::SandboxResult& r) {
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
int exit_code_of(const env::SandboxResult& r) {
  switch (r.verdict) {
    case env::SandboxVerdict::ok:
    case env::SandboxVerdict::memory: return r.exit_code;
    case env::SandboxVerdict::timeout: return 124;
    case env::SandboxVerdict::setup_error: return 125;
    case env::SandboxVerdict::cancelled: return 128 + SIGTERM;
    case env::SandboxVerdict::output_limit: return 128 + 9;
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

// `sandbox run`: the sandbox as a command (a sandboxed env server is started through it).
void add_sandbox_run(CLI::App& app, Action& action) {
  auto* sb = app.add_subcommand("sandbox", "Run commands in the sandbox (namespaces, read-only root, seccomp, limits)");
  sb->require_subcommand(1);

  struct RunArgs {
    env::SandboxOptions options;
    std::vector<std::string> readonly, writable, files, env, command;
    std::string stdin_file;
    bool warn = false, json = false, stream = false;
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
  run->add_option("--env", a->env, "NAME=VALUE in the command's environment (repeat)")->allow_extra_args(false);
  run->add_option("--stdin", a->stdin_file, "feed this file to the command's stdin");
  run->add_flag("--warn-missing", a->warn, "run even where the kernel refuses namespaces (loudly, without isolation)");
  run->add_flag("--json", a->json, "print the whole result (output included) as one JSON line instead");
  run->add_flag("--stream", a->stream,
                "pass the command's output through as it comes (long-lived commands), not at the end; it still counts "
                "against --output-bytes");
  run->add_option("command", a->command, "the command and its arguments (after --)")->required();
  run->callback([a, &action] {
    action = [a] {
      if (!a->readonly.empty()) a->options.readonly_paths = a->readonly;
      a->options.writable_paths = a->writable;
      if (a->warn) a->options.missing_layer = env::MissingLayer::warn;
      env::SandboxRequest req{.argv = a->command, .env = a->env};
      if (!a->stdin_file.empty()) req.stdin_data = read_host_file(a->stdin_file);
      for (const auto& f : a->files) {
        const auto eq = f.find('=');
        RLX_CHECK(eq != std::string::npos && eq > 0, "--file '{}': expected NAME=HOSTPATH", f);
        req.files.emplace_back(f.substr(0, eq), read_host_file(f.substr(eq + 1)));
      }
      env::Sandbox sandbox(a->options);
      // SIGTERM / SIGINT end the sandbox first (its whole pid namespace), then this process.
      static std::atomic<bool> cancel{false};
      on_stop_signals([](int) { cancel = true; });
      req.cancel = &cancel;
      if (a->stream) {
        RLX_CHECK(!a->json, "--stream and --json: choose one (--json prints the output at the end)");
        req.on_output = [](int stream, std::string_view chunk) { (void)write_all(stream == 1 ? 1 : 2, chunk); };
      }
      const env::SandboxResult r = sandbox.run(req);
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
}

std::atomic<bool> g_serve_stop{false};

// `env serve`: what rollout workers start for env.servers (with this binary, so that a
// trainer's own environments are served).
void add_env_serve(CLI::App* envc, Action& action) {
  struct Args {
    env::EnvServerOptions server;
    std::string tokenizer, options = "{}";
    uint64_t seed = 0;
    bool code_sandbox = false;
    std::string code_sandbox_config;  // SandboxOptions as YAML (the run's env.sandbox)
    std::string check;  // an environment to try once, then exit
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
  serve->add_option("--code-sandbox-config", a->code_sandbox_config,
                    "that sandbox's options as YAML (the env.sandbox section: limits, paths); default: the defaults");
  serve->add_option("--check", a->check,
                    "try environment NAME once (a generated task: make, reset) and bind the address, then exit 0: "
                    "what `rlx run` does before it starts any role");
  serve->callback([a, &action] {
    action = [a] {
      const auto tok = load_tokenizer(a->tokenizer);
      std::unique_ptr<env::Sandbox> code_sandbox;
      if (a->code_sandbox)
        code_sandbox = std::make_unique<env::Sandbox>(a->code_sandbox_config.empty()
                                                     ? env::SandboxOptions{}
                                                     : config::load_string<env::SandboxOptions>(a->code_sandbox_config, {},
                                                                                          "--code-sandbox-config"));
      nlohmann::json options;
      try {
        options = nlohmann::json::parse(a->options);
      } catch (const nlohmann::json::exception& e) {
        throw ConfigError(fmt::format("--options: not JSON: {}", e.what()));
      }
      env::register_bundled();
      const env::Context context{.tokenizer = tok.get(), .sandbox = code_sandbox.get(), .options = options, .seed = a->seed};
      if (!a->check.empty()) {
        auto& registry = env::Registry::global();
        auto env = registry.make(a->check, context);
        if (registry.generates(a->check)) (void)env->reset(registry.generate(a->check, a->seed, 0, options));
        const std::atomic<bool> stop{true};  // binds the address, then returns
        env::serve_envs(a->server, registry, context, stop);
        std::cerr << fmt::format("env server: check passed ({} on {})", a->check, a->server.address) << std::endl;
        return 0;
      }
      on_stop_signals([](int) { g_serve_stop = true; });
      env::serve_envs(a->server, env::Registry::global(), context, g_serve_stop);
      return 0;
    };
  });
}
struct RunArgs {
  std::string file;
  std::vector<std::string> overrides;
  LaunchOptions launch;
};

void add_run(CLI::App& app, Action& action) {
  auto args = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand("run", "Train: validate CONFIG, then start the hub, learner and rollout workers and watch them");
  run->add_option("config", args->file, "YAML run config")->required();
  run->add_option("overrides", args->overrides, "section.key=value overrides");
  run->add_flag("--resume", args->launch.resume, "continue the run directory from its newest checkpoint");
  run->add_flag("--force", args->launch.force, "start over in a run directory that holds a run (deletes it)");
  run->callback([args, &action] {
    action = [args] {
      // The whole config is checked before any process starts.
      auto load = [args] {
        auto cfg = config::load_file<RunConfig>(args->file, args->overrides);
        validate_run_config(cfg);
        return cfg;
      };
      args->launch.reload = load;  // SIGHUP
      return launch(load(), std::filesystem::read_symlink("/proc/self/exe").string(), args->launch);
    };
  });

}

// sft, rm and eval: one config, one process.
void add_single_process_commands(CLI::App& app, Action& action) {
  auto sft_args = std::make_shared<RunArgs>();
  auto* sft = app.add_subcommand("sft", "Warm-start CONFIG's model with SFT on its environment's tasks (writes RUN_DIR/final)");
  sft->add_option("config", sft_args->file, "YAML run config (sections sft, env, model)")->required();
  sft->add_option("overrides", sft_args->overrides, "section.key=value overrides");
  sft->callback([sft_args, &action] {
    action = [sft_args] { return run_sft(config::load_file<RunConfig>(sft_args->file, sft_args->overrides)); };
  });
  auto rm_args = std::make_shared<RunArgs>();
  auto* rm = app.add_subcommand("rm", "Train a reward model on preference pairs (Bradley-Terry; writes RUN_DIR/final, an HF "
                                      "sequence classifier)");
  rm->add_option("config", rm_args->file, "YAML run config (sections rm, env, model)")->required();
  rm->add_option("overrides", rm_args->overrides, "section.key=value overrides");
  rm->callback([rm_args, &action] {
    action = [rm_args] { return run_rm(config::load_file<RunConfig>(rm_args->file, rm_args->overrides)); };
  });
  auto eval_args = std::make_shared<RunArgs>();
  auto* ev = app.add_subcommand("eval", "Held-out accuracy of CONFIG's model (model.path=DIR) on its environment: greedy, and with "
                                          "validation.samples=N mean@N, pass@k, maj@N");
  ev->add_option("config", eval_args->file, "YAML run config")->required();
  ev->add_option("overrides", eval_args->overrides, "section.key=value overrides");
  ev->callback([eval_args, &action] {
    action = [eval_args] {
      const auto cfg = config::load_file<RunConfig>(eval_args->file, eval_args->overrides);
      auto report = evaluate_report(cfg);
      report["model"] = cfg.model.path.empty() ? cfg.model.preset : cfg.model.path;
      std::cout << report.dump() << std::endl;
      return 0;
    };
  });

}

void add_scale(CLI::App& app, Action& action) {
  struct ScaleArgs {
    std::string run_dir;
    uint32_t workers = 0;
  };
  auto sc = std::make_shared<ScaleArgs>();
  auto* scale = app.add_subcommand("scale", "Change the number of rollout workers of a running `rlx run`");
  scale->add_option("run_dir", sc->run_dir, "the run directory (run.out_dir/run.name)")->required();
  scale->add_option("--workers", sc->workers, "rollout workers wanted (0 to 1024; 0 pauses rollout, each worker leaving at once)")->required();
  scale->callback([sc, &action] {
    action = [sc] {
      launch::scale(sc->run_dir, sc->workers);
      std::cerr << fmt::format("rlx scale: {} asked for {} rollout workers", sc->run_dir, sc->workers) << std::endl;
      return 0;
    };
  });

}

void add_k8s(CLI::App& app, Action& action) {
  struct K8sArgs {
    std::string file;
    std::vector<std::string> overrides;
    K8sOptions k8s;
  };
  auto ka = std::make_shared<K8sArgs>();
  auto* k8s = app.add_subcommand("k8s", "Kubernetes manifests of a run")->require_subcommand(1);
  auto* render = k8s->add_subcommand("render", "Print a headless Service, a ConfigMap and an Indexed Job that run CONFIG's plan");
  render->add_option("config", ka->file, "YAML run config")->required();
  render->add_option("overrides", ka->overrides, "section.key=value overrides");
  render->add_option("--image", ka->k8s.image, "container image with rlx on its PATH")->capture_default_str();
  render->add_option("--namespace", ka->k8s.namespace_, "namespace of the objects (default: the current one)");
  render->add_option("--host-path", ka->k8s.host_path, "the node's directory of run directories")->capture_default_str();
  render->add_option("--claim", ka->k8s.claim, "a ReadWriteMany PersistentVolumeClaim for the run directories instead");
  render->add_flag("--resume", ka->k8s.resume, "the pods continue the run from its last checkpoint");
  render->callback([ka, &action] {
    action = [ka] {
      auto cfg = config::load_file<RunConfig>(ka->file, ka->overrides);
      validate_run_config(cfg);
      std::cout << render_k8s(cfg, ka->k8s);
      return 0;
    };
  });

}

void add_role(CLI::App& app, Action& action) {
  auto ra = std::make_shared<RoleArgs>();
  auto* role = app.add_subcommand("role", "One role of a run, as `rlx run` starts it")->group("");
  role->add_option("role", ra->role, "hub, learner or worker")->required()->check(CLI::IsMember({"hub", "learner", "worker"}));
  role->add_option("--config", ra->config, "the run's resolved config")->required();
  role->add_option("--run-dir", ra->run_dir, "the run directory")->required();
  role->add_option("--weights", ra->weights, "the weight-sync segment")->required();
  role->add_option("--exe", ra->exe, "the rlx binary")->required();
  role->add_option("--index", ra->index, "worker index")->required();
  role->add_option("--transport", ra->transport, "local (ipc hub, shared-memory weights) or tcp")
      ->check(CLI::IsMember({"local", "tcp"}));
  role->callback([ra, &action] {
    action = [ra] { return run_role(*ra); };
  });
}

}  // namespace

void add_trainer_commands(CLI::App& app, Action& action) {
  algo::register_bundled_algorithms();
  auto* envc = app.add_subcommand("env", "Environments: list them, serve them to rollout workers");
  envc->require_subcommand(1);
  add_env_serve(envc, action);
  add_sandbox_run(app, action);
  add_run(app, action);
  add_single_process_commands(app, action);
  add_scale(app, action);
  add_k8s(app, action);
  add_role(app, action);
}

int trainer_main(int argc, char** argv, const std::string& name, const std::function<void()>& register_parts) {
  prepare_blas(argv);  // may re-execute this process once
  report_crashes();    // a SIGSEGV prints its stack to the log before the process ends
  if (register_parts) register_parts();
  env::register_bundled();
  algo::register_bundled_algorithms();
  CLI::App app{name + ": reinforcement-learning post-training with rlx", name};
  app.require_subcommand(1);
  cli::Action action;
  add_trainer_commands(app, action);
  return cli::run_app(app, argc, argv, action);
}

}  // namespace rlx::launch

namespace rlx::cli {

int run_app(CLI::App& app, int argc, char** argv, const Action& action) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  try {
    return action ? action() : 0;
  } catch (const ConfigError& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return kExitUsage;
  } catch (const Error& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    return kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": unexpected error: " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace rlx::cli
