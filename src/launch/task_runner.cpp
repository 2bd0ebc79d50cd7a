// The tasks of a run started as many (Slurm, a Kubernetes Indexed Job): which role a task
// is (task_from_env), and each task's runner, which coordinates through files in the run
// directory.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <thread>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "launch_common.hpp"
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

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

std::optional<RoleTask> task_from_env(const RunConfig& cfg) {
  // Slurm's variables, else those of a rendered Kubernetes Indexed Job (rlx k8s render).
  const bool slurm = std::getenv("SLURM_PROCID") != nullptr;
  const char* index_var = slurm ? "SLURM_PROCID" : "RLX_TASK_INDEX";
  const char* count_var = slurm ? "SLURM_NTASKS" : "RLX_NUM_TASKS";
  const char* procid = std::getenv(index_var);
  const char* ntasks = std::getenv(count_var);
  if (!procid || !ntasks) return std::nullopt;
  RoleTask t;
  try {
    t.procid = std::stoi(procid);
    t.ntasks = std::stoi(ntasks);
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("{}={} / {}={}: not numbers", index_var, procid, count_var, ntasks));
  }
  if (t.ntasks <= 1) return std::nullopt;  // one task: it launches every role itself
  // Colocated: the rollout engine is in the learner's task.
  const bool colocated = cfg.train.placement == Placement::colocated;
  const int learners = static_cast<int>(cfg.train.learner_ranks), workers = static_cast<int>(worker_processes(cfg));
  if (t.ntasks != 1 + learners + workers)
    throw ConfigError(fmt::format(
        "placement: {} tasks ({}), but the plan has 1 hub + {} learner ranks (train.learner_ranks) + {} rollout workers "
        "(rollout.workers{}) = {}",
        t.ntasks, count_var, learners, workers, colocated ? "; none with train.placement = colocated" : "",
        1 + learners + workers));
  const char* nodes = std::getenv("SLURM_NNODES");
  const bool many_nodes = slurm && nodes && std::atoi(nodes) > 1;
  if (many_nodes && cfg.train.transport == Transport::local)
    throw ConfigError(fmt::format("placement under Slurm: {} nodes (SLURM_NNODES) with train.transport = local (shared "
                                  "memory and ipc:// reach one node only); use auto or tcp",
                                  nodes));
  if (many_nodes && cfg.train.weight_sync == WeightSync::shm)
    throw ConfigError(fmt::format("placement under Slurm: {} nodes (SLURM_NNODES) with train.weight_sync = shm (one node "
                                  "only); use auto, tcp or broadcast",
                                  nodes));
  t.tcp = cfg.train.transport == Transport::tcp || (cfg.train.transport == Transport::auto_ && many_nodes);
  RLX_CHECK(t.procid >= 0 && t.procid < t.ntasks, "{}={} is not below {}={}", index_var, t.procid, count_var, t.ntasks);
  if (slurm) {
    const char* job = std::getenv("SLURM_JOB_ID");
    const char* step = std::getenv("SLURM_STEP_ID");
    const char* requeued = std::getenv("SLURM_RESTART_COUNT");  // a requeued job keeps its id
    t.group = fmt::format("slurm-{}.{}.{}", job ? job : "0", step ? step : "0", requeued ? requeued : "0");
  } else {
    const char* group = std::getenv("RLX_TASK_GROUP");
    t.group = group && *group ? group : "tasks";
    RLX_CHECK(t.group.size() <= 128 && t.group.find('/') == std::string::npos && t.group[0] != '.',
              "RLX_TASK_GROUP='{}': a plain name (no '/'), at most 128 characters", t.group);
  }
  if (t.procid == 0) t.role = "hub";
  else if (t.procid <= learners) t.role = "learner", t.index = t.procid - 1;
  else t.role = "worker", t.index = t.procid - 1 - learners;
  return t;
}

namespace {

// One task of a run started as many (Slurm, a Kubernetes Indexed Job): its role as a child
// process, and the group's shared state as files in run_dir/tasks/GROUP/: ready (the run directory is prepared; the store's address),
// stop (SIGINT/SIGTERM reached task 0), learner-done, worker-N-ended, done, failed (the first
// failure).
class TaskRunner {
 public:
  TaskRunner(const RunConfig& cfg, RoleTask task, std::string exe)
      : cfg_(cfg), task_(std::move(task)), exe_(std::move(exe)),
        run_dir_(fs::absolute(fs::path(cfg.run.out_dir) / cfg.run.name)), coord_(run_dir_ / "tasks" / task_.group) {}

  int run(const LaunchOptions& lo) {
    on_stop_signals(on_launcher_signal);
    const std::string me = fmt::format("rlx run [task {}/{}: {} {}]", task_.procid, task_.ntasks, task_.role, task_.index);
    json ready;
    std::unique_ptr<dist::StoreServer> store;
    // Across nodes the learner group's store and its Gloo connections use this host's name.
    const std::string host = task_.tcp ? dist::host_name() : "127.0.0.1";
    std::optional<FileLock> run_lock;
    if (task_.procid == 0) {
      run_lock.emplace(lock_run_dir(run_dir_));
      prepare_run_dir(cfg_, lo);
      rlx::remove_tree(run_dir_ / "tasks");
      remove_endpoints(run_dir_);
      fs::create_directories(coord_);
      if (cfg_.train.learner_ranks > 1) store = std::make_unique<dist::StoreServer>(host, 0);
      ready = {{"store", store ? fmt::format("{}:{}", host, store->port()) : ""}};
      write_file_atomic(coord_ / "ready", ready.dump());
      std::cerr << fmt::format("{}: {} (logs in {})", me, run_dir_.string(), (run_dir_ / "logs").string()) << std::endl;
    } else {
      ready = wait_ready();
    }
    const auto weights = fmt::format("rlx-{}-{}", cfg_.run.name, task_.group);
    uint32_t starts = 0, restarts = 0;
    auto start = [&] {
      auto log_dir = run_dir_ / "logs" / fmt::format("{}-{}", task_.role, task_.index);
      if (starts > 0) log_dir += fmt::format(".{}", starts);
      ++starts;
      started_ = wall_now();
      dist::LocalGroupOptions o{
          .argv = {exe_, "role", task_.role, "--config", (run_dir_ / "config.yaml").string(), "--run-dir", run_dir_.string(),
                   "--weights", weights, "--exe", exe_, "--index", std::to_string(task_.index), "--transport",
                   task_.tcp ? "tcp" : "local"},
          .env = {fmt::format("RLX_LAUNCHER_PID={}", ::getpid())},
          .log_dir = log_dir,
          .block_sigterm = task_.role == "worker"};
      if (task_.tcp) o.env.push_back("RLX_COMM_INTERFACE=" + host);
      // The store is task 0's: a learner rank > 0 restarted by its task re-forms the group.
      if (task_.role == "learner" && cfg_.train.learner_ranks > 1 && cfg_.train.max_restarts > 0)
        o.env.push_back(fmt::format("{}=1", kLearnerReformEnv));
      if (task_.role == "learner")
        o.first_rank = task_.index, o.group_size = static_cast<int>(cfg_.train.learner_ranks),
        o.store = ready.value("store", std::string());
      if (o.store.empty()) o.group_size = 0, o.first_rank = 0;
      return std::make_unique<dist::LocalGroup>(o);
    };
    auto child = start();
    std::optional<Progress> progress;
    if (task_.procid == 0) progress.emplace(run_dir_ / "metrics.jsonl", cfg_.train.steps);
    bool stopping = false, killed_stuck = false;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (progress) progress->poll();
      if (const int sig = g_launcher_signal.exchange(0); sig != 0 && !stopping) {
        stopping = true;
        if (task_.procid == 0) write_file_atomic(coord_ / "stop", strsignal(sig));
      }
      if (fs::exists(coord_ / "failed")) {
        child->signal(0, SIGTERM);
        child->wait(30);
        return 1;
      }
      if (task_.role == "learner" && (stopping || fs::exists(coord_ / "stop")) && !stop_sent_) {
        stop_sent_ = true;
        child->signal(0, SIGTERM);  // the learner checkpoints, then exits
        child->signal(0, SIGCONT);
      }
      // The learner finished: as the local launcher does, the workers stop first (with the
      // hub there to take what they hold), then the hub (it saves its state).
      const bool finished = task_.role != "learner" && fs::exists(coord_ / "learner-done") &&
                            (task_.role == "worker" || workers_ended());
      if (finished) {
        child->signal(0, SIGTERM);
        child->signal(0, SIGCONT);
        child->wait(30);
        if (task_.role == "worker") write_file_atomic(coord_ / fmt::format("worker-{}-ended", task_.index), "");
        if (task_.role == "hub") {
          write_file_atomic(coord_ / "done", "");
          if (progress) progress.reset();
          finish_run(cfg_, run_dir_);
          const bool stopped = fs::exists(coord_ / "stop");
          std::cerr << fmt::format("{}: {}", me,
                                   stopped ? "stopped; `rlx run CONFIG --resume` in a new step continues from the last checkpoint"
                                           : fmt::format("done; final weights {}", (run_dir_ / "final").string()))
                    << std::endl;
          return stopped ? 130 : 0;
        }
        return 0;
      }
      if (const auto why = stopping || killed_stuck ? "" : stuck_reason(cfg_.train, run_dir_, task_.role, task_.index, started_);
          !why.empty()) {
        std::cerr << fmt::format("{}: stuck: {}; killing it", me, why) << std::endl;
        child->signal(0, SIGKILL);
        killed_stuck = true;  // reported once, until it is reaped and restarted
      }
      if (!child->poll()) continue;
      const auto& e = child->ranks()[0];
      if (task_.role == "learner" && e.ok()) {
        if (task_.index == 0) write_file_atomic(coord_ / "learner-done", "");
        return 0;
      }
      if (task_.role == "worker" && e.ok()) continue;  // the hub has nothing more; wait for the end
      const auto why = fmt::format("{} {} ended: {} (log: {})", task_.role, task_.index, e.describe(), e.err.string());
      // It cannot run (or failed at start as it did the last time): no restart.
      auto failed = role_failure(run_dir_, task_.role.c_str(), task_.index, e);
      if (failed.hopeless(last_failure_)) return fail(me, failed.message(last_failure_));
      last_failure_ = std::move(failed);
      // A learner rank other than 0, once a checkpoint exists: the other ranks re-form the
      // group around its replacement (as under the local launcher).
      if (task_.role == "learner" && task_.index > 0 && !stopping && !fs::exists(coord_ / "learner-done") &&
          restarts < cfg_.train.max_restarts &&
          cfg_.learner.checkpoint_every > 0 && !list_checkpoints(run_dir_ / "checkpoints").empty()) {
        ++restarts;
        std::cerr << fmt::format("{}: {}; restarting it alone: the learner group re-forms around it ({}/{}, "
                                 "train.max_restarts)",
                                 me, why, restarts, cfg_.train.max_restarts)
                  << std::endl;
        child = start();
        killed_stuck = false;
        continue;
      }
      if (task_.role == "worker" && restarts < cfg_.rollout.max_restarts) {
        ++restarts;
        std::cerr << fmt::format("{}: {}; restarting it ({}/{})", me, why, restarts, cfg_.rollout.max_restarts) << std::endl;
        child = start();
        killed_stuck = false;
        continue;
      }
      return fail(me, why);
    }
  }

 private:
  int fail(const std::string& me, const std::string& why) {
    std::cerr << fmt::format("{}: {}; the job step fails (`rlx run CONFIG --resume` continues from the last checkpoint)",
                             me, why)
              << std::endl;
    if (!fs::exists(coord_ / "failed")) write_file_atomic(coord_ / "failed", why + "\n");
    return 1;
  }
  // Every worker task has stopped its worker, or kWorkersEndS passed since the learner
  // finished (a worker's pod that never started, a node that went away).
  bool workers_ended() {
    static constexpr double kWorkersEndS = 40;  // a worker's own stop is bounded by 30 s
    static constexpr double kSayWaitingS = 5;   // a worker stops in well under a second
    if (learner_done_at_ == 0) learner_done_at_ = now_s();
    for (uint32_t i = 0; i < worker_processes(cfg_); ++i)
      if (!fs::exists(coord_ / fmt::format("worker-{}-ended", i))) {
        const double waited = now_s() - learner_done_at_;
        if (waited >= kSayWaitingS && !said_waiting_) {
          said_waiting_ = true;
          std::cerr << fmt::format("rlx run [task {}]: the learner is done; waiting for worker {} to end (the hub stops "
                                   "after at most {:.0f} s)",
                                   task_.procid, i, kWorkersEndS)
                    << std::endl;
        }
        if (waited < kWorkersEndS) return false;
        std::cerr << fmt::format("rlx run [task {}]: worker {} did not end within {:.0f} s of the learner; stopping the hub",
                                 task_.procid, i, kWorkersEndS)
                  << std::endl;
        return true;
      }
    return true;
  }
  json wait_ready() {
    const double deadline = now_s() + 300;
    // Task 0 clears run_dir/tasks before it writes `ready`: wait for this step's.
    while (now_s() < deadline) {
      if (fs::exists(coord_ / "ready")) {
        auto j = json::parse(read_file(coord_ / "ready", 1 << 16), nullptr, false);
        if (!j.is_discarded()) return j;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw Error(fmt::format("rlx run [task {}]: task 0 (the hub) did not prepare {} within 300 s", task_.procid,
                            run_dir_.string()));
  }

  const RunConfig& cfg_;
  RoleTask task_;
  std::string exe_;
  fs::path run_dir_, coord_;
  double started_ = 0, learner_done_at_ = 0;
  bool said_waiting_ = false;
  bool stop_sent_ = false;
  std::optional<RoleFailure> last_failure_;  // how its role ended the last time
};

}  // namespace

int launch_task(const RunConfig& cfg, const RoleTask& task, const std::string& exe, const LaunchOptions& lo) {
  return TaskRunner(cfg, task, exe).run(lo);
}

}  // namespace rlx::launch
