// The launcher of `rlx run` on one host: the attempts of a run, each one's roles watched
// (local_roles.cpp carries out the supervisor's decisions), the end of a run. The run
// directory's setup is run_setup.cpp; the tasks of a run under Slurm or Kubernetes are
// task_runner.cpp.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <thread>

#include <fmt/ranges.h>

#include "launch_common.hpp"
#include "launcher_signals.hpp"
#include "live_metrics.hpp"
#include "local_roles.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/files.hpp"
#include "rlx/launch/launcher.hpp"
#include "rlx/launch/supervisor.hpp"
#include "rlx/launch/tasks.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;

namespace {

// SIGHUP: the config is read again; a new rollout.workers is applied as `rlx scale` would
// (the workers stay at that number across restarts of the run), other changes are named.
void reload_config(const RunConfig& running, const LaunchOptions& lo, const RunDir& run_dir) {
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
  const auto current = run_dir.scaled_workers(running.rollout.workers);
  now.rollout.workers = current;
  std::vector<std::string> ignored;
  bool workers = false;
  for (const auto& key : config::changed_keys(now, fresh)) {
    if (key == "rollout.workers")
      workers = true;
    else if (key != "run.name" && key != "run.out_dir")
      ignored.push_back(key);  // --resume may name the run differently
  }
  if (!ignored.empty())
    std::cerr << fmt::format(
                     "rlx run: SIGHUP: {} changed; a running job applies only rollout.workers (stop it and "
                     "--resume to apply the rest)",
                     fmt::join(ignored, ", "))
              << std::endl;
  if (workers) {
    run_dir.request_workers(fresh.rollout.workers);
    std::cerr << fmt::format("rlx run: SIGHUP: rollout.workers {} -> {}", current, fresh.rollout.workers) << std::endl;
  } else if (ignored.empty()) {
    std::cerr << "rlx run: SIGHUP: the config is unchanged" << std::endl;
  }
}

// Watches one attempt's roles until a decision ends it (the learner finished, a restart of
// the run, giving up). SIGINT/SIGTERM (stopped_by) make the learner checkpoint and stop.
Decision watch(LocalRoles& roles, Supervisor& sup, const RunConfig& cfg, const LaunchOptions& lo, const RunDir& run_dir,
               LiveMetrics& live, int& stopped_by) {
  Progress progress(run_dir.metrics(), cfg.train.steps, cfg.train.report_every_s);
  Decision d;
  while ((d = roles.poll(stopped_by != 0)).verdict == Verdict::keep_going) {
    if (const int sig = take_stop_signal(); sig != 0 && stopped_by == 0) {
      stopped_by = sig;
      sup.stop_requested(now_s());
      std::cerr << fmt::format("rlx run: {}: the learner checkpoints, then the run stops", strsignal(sig)) << std::endl;
      roles.signal_learner(SIGTERM);
    }
    RLX_CHECK(!sup.stop_overdue(now_s()), "rlx run: the learner did not stop within {:.0f} s of {}",
              sup.policy().stop_timeout_s, strsignal(stopped_by));
    if (take_reload_signal() && stopped_by == 0) reload_config(cfg, lo, run_dir);
    progress.poll();
    live.update(progress.last_line(), progress.last_step_at(), sup.attempt(), sup);
    // No step for a while: say what each role is doing (what it waits on), not silence.
    if (sup.report_due(progress.last_step_at(), now_s()))
      std::cerr << fmt::format("rlx run: no step for {:.0f} s (after step {}): {}", now_s() - progress.last_step_at(),
                               progress.last_step(), roles.doing())
                << std::endl;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  progress.poll();
  return d;
}

// The attempts of a run: each starts every role (from the last checkpoint after the first)
// and ends as the supervisor decides. 0 when the learner finished (or stopped: stopped_by).
int supervise(const RunConfig& cfg, const std::string& exe, const LaunchOptions& lo, const RunDir& run_dir,
              int& stopped_by) {
  LiveMetrics live(cfg);
  Supervisor sup(SupervisorPolicy::of(cfg));
  for (uint32_t attempt = 0;; ++attempt) {
    sup.begin_attempt(attempt, now_s());
    Decision d;
    {
      LocalRoles roles(cfg, run_dir, exe, static_cast<int>(attempt), sup);
      d = watch(roles, sup, cfg, lo, run_dir, live, stopped_by);
      if (d.verdict == Verdict::give_up) {
        // Restarting will not help: stop now, the cause on the console.
        std::cerr << fmt::format("rlx run: {}", d.why) << std::endl;
        std::cerr << "rlx run: stopping the run (a restart would fail the same way); fix the cause, then `rlx run "
                     "CONFIG --resume`"
                  << std::endl;
        roles.stop_all(30);
        return 1;
      }
      if (d.verdict == Verdict::learner_done) {
        roles.stop_rest();
        rlx::remove_tree(run_dir.episodes());  // of leases past the last step
        return 0;
      }
      if (stopped_by != 0) {
        std::cerr << "rlx run: learner 0 ended while stopping: " << roles.learner_exit().describe() << std::endl;
        return 1;
      }
    }  // every role of this attempt is stopped here
    // The hub or a learner rank died, or a worker beyond its restarts: every role starts
    // again from the last committed checkpoint (the learner's and the hub's, saved together).
    d = sup.after_attempt(d);
    std::cerr << fmt::format("rlx run: {}", d.why) << std::endl;
    if (d.verdict == Verdict::give_up) return 1;
    resume_run(run_dir);
  }
}

}  // namespace

int launch(const RunConfig& cfg, const std::string& exe, const LaunchOptions& lo) {
  if (const auto task = task_from_env(cfg)) return launch_task(cfg, *task, exe, lo);
  const double t_check = now_s();
  auto cannot_start = [&](const std::string& problem) {
    std::cerr << fmt::format(
                     "rlx run: cannot start: {} (found in {:.1f} s, before any role started; run.preflight=false "
                     "skips these checks)",
                     problem, now_s() - t_check)
              << std::endl;
    return 1;
  };
  // One launcher per run directory: taken before anything in it is read or changed.
  const auto run_lock = RunDir::of(cfg).lock();
  if (cfg.run.preflight)
    if (const auto problem = preflight_files(cfg); !problem.empty()) return cannot_start(problem);
  const RunDir run_dir = prepare_run_dir(cfg, lo);
  // A socket directory outside the run directory goes with the run's end (however it ends).
  struct RemoveSockets {
    fs::path dir;
    ~RemoveSockets() {
      std::error_code ec;
      if (!dir.empty()) rlx::remove_tree(dir, ec);
    }
  } remove_sockets{run_dir.socket_dir() != run_dir.root() ? run_dir.socket_dir() : fs::path()};
  if (cfg.run.preflight)
    if (const auto problem = preflight_env(cfg, run_dir, exe); !problem.empty()) return cannot_start(problem);
  // SIGINT/SIGTERM: the learner checkpoints and exits; then the rest is stopped.
  watch_stop_signals();
  watch_reload_signal();
  block_leave_signal();
  std::cerr << fmt::format("rlx run: {} (logs in {})", run_dir.string(), run_dir.logs().string()) << std::endl;
  int stopped_by = 0;
  if (const int code = supervise(cfg, exe, lo, run_dir, stopped_by); code != 0) return code;
  if (stopped_by != 0) {
    finish_run(cfg, run_dir);
    std::cerr << fmt::format("rlx run: stopped; `rlx run {} --resume` continues from the last checkpoint",
                             run_dir.config().string())
              << std::endl;
    return 128 + stopped_by;
  }
  std::cerr << fmt::format("rlx run: done; metrics {}, final weights {}", run_dir.metrics().string(),
                           run_dir.final_model().string())
            << std::endl;
  finish_run(cfg, run_dir);
  return 0;
}

}  // namespace rlx::launch
