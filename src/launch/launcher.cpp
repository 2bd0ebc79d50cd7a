// The launcher of `rlx run` on one host: the run directory, the roles as processes, their
// watch and restarts, `rlx scale`, preflight checks and the end of a run. The tasks of a
// run under Slurm or Kubernetes are task_runner.cpp.
#include <signal.h>
#include <sys/stat.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "core/build_paths.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/dist/local_group.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/launch/launcher.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/launch/tasks.hpp"
#include "rlx/learner/checkpoint.hpp"
#include "rlx/model/hf.hpp"
#include "launch_common.hpp"
#include "local_roles.hpp"
#include "rlx/serve/metrics_endpoint.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

// The trial start of an env server before a run (it loads the binary and the environment).
constexpr double kEnvCheckS = 60;


void scale(const fs::path& run_dir, uint32_t workers) {
  RLX_CHECK(workers <= 1024, "rlx scale: {} workers; 0 (rollout paused) to 1024 can run", workers);
  const auto pid_file = run_dir / "launcher.pid";
  RLX_CHECK(fs::exists(pid_file), "rlx scale: {} is not a run directory (no launcher.pid)", run_dir.string());
  const auto pid = std::atoi(read_file(pid_file, 64).c_str());
  RLX_CHECK(pid > 0 && ::kill(pid, 0) == 0, "rlx scale: the run in {} is not running (launcher pid {})", run_dir.string(), pid);
  write_file_atomic(run_dir / "scale.json", json{{"workers", workers}}.dump() + "\n");
}

namespace {

// What a run directory holds of a previous run.
bool holds_run(const fs::path& dir) {
  return fs::exists(dir / "hub.state") || fs::exists(dir / "checkpoints") || fs::exists(dir / "metrics.jsonl");
}

// `logs`: false keeps the logs and the fault-injection marker (a run restarted before its
// first checkpoint).
void clear_run(const fs::path& dir, bool logs = true) {
  for (const char* p : {"hub.state", "trajectories.h5", "metrics.jsonl", "samples.jsonl", "checkpoints", "checkpoints-critic", "final",
                        "heartbeats", "episodes", "scale.json", "traces", "trace.json", "stats", "tasks", "env-sockets",
                        kHubEndpointFile, kWeightsEndpointFile})
    rlx::remove_tree(dir / p);
  if (logs) rlx::remove_tree(dir / "logs"), rlx::remove_tree(dir / "fault-injected");
  if (const auto sockets = socket_dir(dir); sockets != dir) rlx::remove_tree(sockets);
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("hub-step_")) fs::remove(e.path());
}

// --resume: the hub as it was at the newest verified checkpoint, and the metrics up to it.
void prepare_resume(const fs::path& dir) {
  int64_t step = 0;
  for (const auto& c : list_checkpoints(dir / "checkpoints")) {
    auto info = verify_checkpoint(c);
    if (!info.ok) {
      log::warn("resume: skipping {}: {}", c.string(), info.problem);
      continue;
    }
    const auto hub_state = info.learner.value("references", json::object()).value("hub_state", std::string());
    RLX_CHECK(!hub_state.empty() && fs::exists(dir / hub_state), "resume: {} names no hub state, or {} is missing",
              c.string(), (dir / hub_state).string());
    fs::copy_file(dir / hub_state, dir / "hub.state", fs::copy_options::overwrite_existing);
    // Episodes saved after that checkpoint may carry versions the resumed learner has not
    // made yet: their leases start over.
    rlx::remove_tree(dir / "episodes");
    step = checkpoint_run_step(info.learner.value("references", json::object()), info.step);
    break;
  }
  if (step == 0) {
    log::warn("resume: {} has no checkpoint yet; starting from step 0", dir.string());
    clear_run(dir, /*logs=*/false);
    return;
  }
  // metrics.jsonl and samples.jsonl keep the lines of the steps the checkpoint holds.
  for (const char* name : {"metrics.jsonl", "samples.jsonl"}) {
    std::vector<std::string> keep;
    std::ifstream in(dir / name);
    if (!in) continue;
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("step", int64_t{0}) <= step) keep.push_back(line);
    }
    in.close();
    std::ofstream out(dir / name, std::ios::trunc);
    for (const auto& l : keep) out << l << "\n";
  }
  std::cerr << fmt::format("rlx run: resuming {} at step {}", dir.string(), step) << std::endl;
}

std::atomic<bool> g_reload{false};
extern "C" void on_reload_signal(int) { g_reload = true; }

// Roles inherit SIGUSR1 blocked: a worker asked to leave while it is still starting gets
// the signal once it installed its handler (run_worker unblocks it), instead of dying.
void block_leave_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace

namespace {

// SIGHUP: the config is read again; a new rollout.workers is applied as `rlx scale` would
// (the workers stay at that number across restarts of the run), other changes are named.
void reload_config(const RunConfig& running, const LaunchOptions& lo, const fs::path& run_dir) {
  if (!lo.reload) {
    std::cerr << "rlx run: SIGHUP: this launcher has no config file to read again; nothing changes" << std::endl;
    return;
  }
  RunConfig fresh;
  try {
    fresh = lo.reload();
  } catch (const std::exception& e) {
    std::cerr << fmt::format("rlx run: SIGHUP: the config does not load, nothing changes: {}", e.what()) << std::endl;
    return;
  }
  // Compared with what runs now: the workers as last scaled (rlx scale, or an earlier reload).
  RunConfig now = running;
  const auto current = scaled_workers(run_dir, running.rollout.workers);
  now.rollout.workers = current;
  std::vector<std::string> ignored;
  bool workers = false;
  for (const auto& key : config::changed_keys(now, fresh)) {
    if (key == "rollout.workers") workers = true;
    else if (key != "run.name" && key != "run.out_dir") ignored.push_back(key);  // --resume may name the run differently
  }
  if (!ignored.empty())
    std::cerr << fmt::format("rlx run: SIGHUP: {} changed; a running job applies only rollout.workers (stop it and "
                             "--resume to apply the rest)",
                             fmt::join(ignored, ", "))
              << std::endl;
  if (workers) {
    write_file_atomic(run_dir / "scale.json", json{{"workers", fresh.rollout.workers}}.dump() + "\n");
    std::cerr << fmt::format("rlx run: SIGHUP: rollout.workers {} -> {}", current, fresh.rollout.workers) << std::endl;
  } else if (ignored.empty()) {
    std::cerr << "rlx run: SIGHUP: the config is unchanged" << std::endl;
  }
}


}  // namespace

namespace {


// The plotting script: $RLX_PLOT_SCRIPT, else the source tree's, else the installed one.
fs::path plot_script() {
  if (const char* env = std::getenv("RLX_PLOT_SCRIPT")) return env;
  for (const char* path : {build_paths::kPlotScriptSource, build_paths::kPlotScriptInstall})
    if (::access(path, R_OK) == 0) return path;
  return {};
}

// PNG curves of metrics.jsonl in run_dir/plots, by scripts/plot_metrics.py under Debian's
// python3 (it has python3-matplotlib). Bounded to 120 s; a failure is reported, not fatal.
void write_plots(const fs::path& run_dir) {
  const fs::path script = plot_script();
  if (script.empty()) {
    std::cerr << "rlx run: no plots: plot_metrics.py not found (set RLX_PLOT_SCRIPT)" << std::endl;
    return;
  }
  const std::string python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  dist::LocalGroup plot({.argv = {python, script.string(), run_dir.string()}, .log_dir = run_dir / "logs" / "plots"});
  const auto& e = plot.wait(120).front();
  if (e.ok())
    std::cerr << fmt::format("rlx run: plots {}", (run_dir / "plots").string()) << std::endl;
  else
    std::cerr << fmt::format("rlx run: no plots: {} {} (see {})", script.string(), e.describe(), e.err.string()) << std::endl;
}

}  // namespace

namespace {

// What `rlx run` checks before it writes the run directory or starts anything
// (run.preflight): "" or the first problem, naming the file, path or key.
std::string preflight_files(const RunConfig& cfg) {
  const fs::path run_dir = fs::absolute(fs::path(cfg.run.out_dir) / cfg.run.name);
  // The run directory can be written.
  try {
    fs::create_directories(run_dir);
    const auto probe = run_dir / fmt::format(".rlx-probe-{}", ::getpid());
    write_file_atomic(probe, "probe\n");
    fs::remove(probe);
  } catch (const std::exception& e) {
    return fmt::format("the run directory {} cannot be written (run.out_dir, run.name): {}", run_dir.string(), e.what());
  }
  // The model's and the tokenizer's files can be read.
  try {
    if (!cfg.model.path.empty()) {
      const fs::path dir = cfg.model.path;
      (void)read_hf_config(dir);
      size_t weights = 0;
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".safetensors") continue;
        ++weights;
        std::ifstream in(e.path(), std::ios::binary);
        char magic[8];
        if (!in.read(magic, sizeof magic)) return fmt::format("model.path: {} cannot be read", e.path().string());
      }
      if (weights == 0) return fmt::format("model.path: {} holds no *.safetensors file", dir.string());
    }
    (void)run_tokenizer(cfg);
  } catch (const std::exception& e) {
    return fmt::format("model or tokenizer: {}", e.what());
  }
  return "";
}

// The trial start of an env server (after the run directory holds the run's tokenizer).
std::string preflight_env(const RunConfig& cfg, const fs::path& run_dir, const std::string& exe) {
  if (cfg.env.servers == 0) return "";
  const RoleContext ctx{.cfg = cfg, .run_dir = run_dir, .exe = exe};
  const auto why = check_env_server(ctx, kEnvCheckS);
  return why.empty() ? "" : fmt::format("the env server does not start in its sandbox (env.sandbox): {}", why);
}

}  // namespace

void remove_endpoints(const fs::path& run_dir) {
  fs::remove(run_dir / kHubEndpointFile);
  fs::remove(run_dir / kWeightsEndpointFile);
}

std::atomic<int> g_launcher_signal{0};
extern "C" void on_launcher_signal(int sig) { g_launcher_signal = sig; }

FileLock lock_run_dir(const fs::path& run_dir) {
  fs::create_directories(run_dir);
  int64_t holder = 0;
  auto lock = FileLock::try_lock(run_dir / "launcher.lock", holder);
  RLX_CHECK(lock, "run directory {} is in use by another launcher (pid {}); stop it first (SIGINT), then --resume continues "
            "its run", run_dir.string(), holder);
  return std::move(*lock);
}

fs::path prepare_run_dir(const RunConfig& cfg, const LaunchOptions& lo) {
  const fs::path run_dir = fs::absolute(fs::path(cfg.run.out_dir) / cfg.run.name);
  fs::create_directories(run_dir / "logs");
  if (lo.resume) {
    prepare_resume(run_dir);
  } else if (holds_run(run_dir)) {
    RLX_CHECK(lo.force, "run directory {} holds a run: --resume continues it, --force starts it over", run_dir.string());
    clear_run(run_dir);
  }
  write_file_atomic(run_dir / "config.yaml", config::to_yaml(cfg));
  // Env servers load the run's tokenizer from the run directory.
  write_tokenizer(cfg, run_dir / "tokenizer.json");
  write_file_atomic(run_dir / "launcher.pid", fmt::format("{}\n", ::getpid()));  // for `rlx scale`
  return run_dir;
}

void finish_run(const RunConfig& cfg, const fs::path& run_dir) {
  if (cfg.run.plots) write_plots(run_dir);
  if (!cfg.trace.enabled) return;
  const auto events = merge_traces(run_dir);
  std::cerr << fmt::format("rlx run: trace {} ({} events; ui.perfetto.dev opens it)", (run_dir / "trace.json").string(), events)
            << std::endl;
}


int launch(const RunConfig& cfg, const std::string& exe, const LaunchOptions& lo) {
  if (const auto task = task_from_env(cfg)) return launch_task(cfg, *task, exe, lo);
  const double t_check = now_s();
  auto cannot_start = [&](const std::string& problem) {
    std::cerr << fmt::format("rlx run: cannot start: {} (found in {:.1f} s, before any role started; run.preflight=false "
                             "skips these checks)",
                             problem, now_s() - t_check)
              << std::endl;
    return 1;
  };
  // One launcher per run directory: taken before anything in it is read or changed.
  const auto run_lock = lock_run_dir(fs::absolute(fs::path(cfg.run.out_dir) / cfg.run.name));
  if (cfg.run.preflight)
    if (const auto problem = preflight_files(cfg); !problem.empty()) return cannot_start(problem);
  const fs::path run_dir = prepare_run_dir(cfg, lo);
  // A socket directory outside the run directory goes with the run's end (however it ends).
  struct RemoveSockets {
    fs::path dir;
    ~RemoveSockets() {
      std::error_code ec;
      if (!dir.empty()) rlx::remove_tree(dir, ec);
    }
  } remove_sockets{socket_dir(run_dir) != run_dir ? socket_dir(run_dir) : fs::path()};
  if (cfg.run.preflight)
    if (const auto problem = preflight_env(cfg, run_dir, exe); !problem.empty()) return cannot_start(problem);
  // SIGINT/SIGTERM: the learner checkpoints and exits; then the rest is stopped.
  on_stop_signals(on_launcher_signal);
  on_stop_signals(on_reload_signal, {SIGHUP});
  block_leave_signal();
  std::cerr << fmt::format("rlx run: {} (logs in {})", run_dir.string(), (run_dir / "logs").string()) << std::endl;

  // Live metrics: the latest step's line and the run's state, as Prometheus gauges.
  struct Live {
    std::mutex mu;
    nlohmann::json line;
    double last_step_at = now_s();
    uint32_t attempt = 0;
    uint64_t worker_restarts = 0, killed_stuck = 0, rank_restarts = 0;  // over every attempt of this launcher
    uint64_t earlier_restarts = 0, earlier_stuck = 0, earlier_ranks = 0;  // ... of the attempts before this one
  };
  auto live = std::make_shared<Live>();
  std::optional<serve::MetricsEndpoint> metrics_endpoint;
  if (cfg.log.metrics_port > 0) {
    metrics_endpoint.emplace(cfg.log.metrics_host, cfg.log.metrics_port, [live, steps = cfg.train.steps] {
      std::lock_guard lock(live->mu);
      std::string out = serve::prometheus_gauges(live->line, "rlx_");
      out += fmt::format("# TYPE rlx_up gauge\nrlx_up 1\n# TYPE rlx_train_steps gauge\nrlx_train_steps {}\n", steps);
      out += fmt::format("# TYPE rlx_attempt gauge\nrlx_attempt {}\n", live->attempt);
      out += fmt::format("# TYPE rlx_seconds_since_step gauge\nrlx_seconds_since_step {:.3f}\n", now_s() - live->last_step_at);
      // Errors by kind, from the launcher's side (the hub's kinds are in the line, rlx_errors_*).
      out += fmt::format("# TYPE rlx_errors_worker_restarts counter\nrlx_errors_worker_restarts {}\n", live->worker_restarts);
      out += fmt::format("# TYPE rlx_errors_killed_stuck counter\nrlx_errors_killed_stuck {}\n", live->killed_stuck);
      out += fmt::format("# TYPE rlx_errors_learner_rank_restarts counter\nrlx_errors_learner_rank_restarts {}\n",
                         live->rank_restarts);
      out += fmt::format("# TYPE rlx_errors_run_restarts counter\nrlx_errors_run_restarts {}\n", live->attempt);
      return out;
    });
    std::cerr << fmt::format("rlx run: live metrics on http://{}:{}/metrics", cfg.log.metrics_host, metrics_endpoint->port())
              << std::endl;
  }

  int stopped_by = 0;
  std::optional<RoleFailure> failed_before;  // how the previous attempt ended
  for (uint32_t attempt = 0;; ++attempt) {
    std::string why;
    {
      Roles roles(cfg, run_dir, exe, static_cast<int>(attempt));
      Progress progress(run_dir / "metrics.jsonl", cfg.train.steps, cfg.train.report_every_s);
      double stop_deadline = 0, reported_at = now_s();
      Roles::State state = Roles::State::running;
      while ((state = roles.poll(stopped_by != 0, why)) == Roles::State::running) {
        if (const int sig = g_launcher_signal.exchange(0); sig != 0 && stopped_by == 0) {
          stopped_by = sig;
          stop_deadline = now_s() + 300;
          std::cerr << fmt::format("rlx run: {}: the learner checkpoints, then the run stops", strsignal(sig)) << std::endl;
          roles.signal_learner(SIGTERM);
        }
        RLX_CHECK(stopped_by == 0 || now_s() < stop_deadline, "rlx run: the learner did not stop within 300 s of {}",
                  strsignal(stopped_by));
        if (g_reload.exchange(false) && stopped_by == 0) reload_config(cfg, lo, run_dir);
        progress.poll();
        if (metrics_endpoint) {
          std::lock_guard lock(live->mu);
          if (!progress.last_line().is_null()) live->line = progress.last_line();
          live->last_step_at = progress.last_step_at();
          if (live->attempt != attempt)
            live->earlier_restarts = live->worker_restarts, live->earlier_stuck = live->killed_stuck,
            live->earlier_ranks = live->rank_restarts;
          live->attempt = attempt;
          live->worker_restarts = live->earlier_restarts + roles.worker_restarts();
          live->killed_stuck = live->earlier_stuck + roles.killed_stuck();
          live->rank_restarts = live->earlier_ranks + roles.learner_rank_restarts();
        }
        // No step for a while: say what each role is doing (what it waits on), not silence.
        const double quiet = now_s() - std::max(progress.last_step_at(), reported_at);
        if (stopped_by == 0 && quiet >= cfg.train.report_every_s) {
          reported_at = now_s();
          std::cerr << fmt::format("rlx run: no step for {:.0f} s (after step {}): {}", now_s() - progress.last_step_at(),
                                   progress.last_step(), roles.doing())
                    << std::endl;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      progress.poll();
      if (state == Roles::State::failed && roles.failure() && roles.failure()->hopeless(failed_before)) {
        why = roles.failure()->message(failed_before);
        state = Roles::State::hopeless;
      }
      if (state == Roles::State::hopeless && roles.failure() && roles.failure()->cannot_run)
        why = roles.failure()->message(failed_before);  // the role's own words (the learner's, the hub's)
      if (state == Roles::State::hopeless) {
        // Restarting will not help: stop now, the cause on the console.
        std::cerr << fmt::format("rlx run: {}", why) << std::endl;
        std::cerr << "rlx run: stopping the run (a restart would fail the same way); fix the cause, then `rlx run "
                     "CONFIG --resume`"
                  << std::endl;
        roles.stop_all(30);
        return 1;
      }
      failed_before = roles.failure();
      if (state == Roles::State::learner_done) {
        roles.stop_rest();
        rlx::remove_tree(run_dir / "episodes");  // of leases past the last step
        break;
      }
      if (stopped_by != 0) {
        std::cerr << "rlx run: learner 0 ended while stopping: " << roles.learner_exit().describe() << std::endl;
        return 1;
      }
    }  // every role of this attempt is stopped here
    // The hub or a learner rank died, or a worker beyond its restarts: every role starts
    // again from the last committed checkpoint (the learner's and the hub's, saved together).
    if (attempt >= cfg.train.max_restarts) {
      std::cerr << fmt::format("rlx run: {}; the run was restarted {} times (train.max_restarts); stopping", why, attempt)
                << std::endl;
      return 1;
    }
    std::cerr << fmt::format("rlx run: {}; restarting the run from its last checkpoint ({}/{})", why, attempt + 1,
                             cfg.train.max_restarts)
              << std::endl;
    prepare_resume(run_dir);
  }
  if (stopped_by != 0) {
    finish_run(cfg, run_dir);
    std::cerr << fmt::format("rlx run: stopped; `rlx run {} --resume` continues from the last checkpoint",
                             (run_dir / "config.yaml").string())
              << std::endl;
    return 128 + stopped_by;
  }
  std::cerr << fmt::format("rlx run: done; metrics {}, final weights {}", (run_dir / "metrics.jsonl").string(),
                           (run_dir / "final").string())
            << std::endl;
  finish_run(cfg, run_dir);
  return 0;
}

}  // namespace rlx::launch
