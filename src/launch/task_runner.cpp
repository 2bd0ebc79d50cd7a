// The tasks of a run started as many (Slurm, a Kubernetes Indexed Job): which role a task
// is (task_from_env), and each task's runner: the supervisor's task-file backend.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <thread>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "launch_common.hpp"
#include "launcher_signals.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/dist/local_group.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/launch/launcher.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/launch/supervisor.hpp"
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
  if (t.procid == 0) t.role = Role::hub;
  else if (t.procid <= learners) t.role = Role::learner, t.index = t.procid - 1;
  else t.role = Role::worker, t.index = t.procid - 1 - learners;
  return t;
}

namespace {

// One task of a run started as many (Slurm, a Kubernetes Indexed Job): the task backend of
// the supervisor. Its role runs as a child process; the supervisor decides on it (restart,
// re-form, stuck) as under the local launcher, and the group's shared state is files in
// run_dir/tasks/GROUP/ (RunDir::TaskFiles): ready (the run directory is prepared; the
// store's address), stop (SIGINT/SIGTERM reached task 0), learner-done, worker-N-ended,
// done, failed (the first failure: every task stops).
class TaskRunner {
 public:
  TaskRunner(const RunConfig& cfg, RoleTask task, std::string exe)
      : cfg_(cfg), task_(std::move(task)), exe_(std::move(exe)), run_dir_(RunDir::of(cfg)),
        coord_(run_dir_.task_files(task_.group)), id_{task_.role, task_.index}, sup_(SupervisorPolicy::of(cfg)),
        me_(fmt::format("rlx run [task {}/{}: {} {}]", task_.procid, task_.ntasks, role_name(task_.role), task_.index)) {}

  int run(const LaunchOptions& lo) {
    watch_stop_signals();
    // Across nodes the learner group's store and its Gloo connections use this host's name.
    host_ = task_.tcp ? dist::host_name() : "127.0.0.1";
    std::optional<FileLock> run_lock;
    std::unique_ptr<dist::StoreServer> store;
    if (task_.procid == 0) {
      run_lock.emplace(run_dir_.lock());
      prepare_run_dir(cfg_, lo);
      rlx::remove_tree(run_dir_.tasks());
      run_dir_.remove_endpoints();
      fs::create_directories(coord_.dir);
      if (cfg_.train.learner_ranks > 1) store = std::make_unique<dist::StoreServer>(host_, 0);
      ready_ = {{"store", store ? fmt::format("{}:{}", host_, store->port()) : ""}};
      write_file_atomic(coord_.ready(), ready_.dump());
      std::cerr << fmt::format("{}: {} (logs in {})", me_, run_dir_.string(), run_dir_.logs().string()) << std::endl;
    } else {
      ready_ = wait_ready();
    }
    sup_.begin_attempt(0, now_s());
    child_ = start();
    if (task_.procid == 0) progress_.emplace(run_dir_.metrics(), cfg_.train.steps);
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (const auto code = watch(); code >= 0) return code;
    }
  }

 private:
  // One round of the watch: -1 to go on, else the task's exit code.
  int watch() {
    if (progress_) progress_->poll();
    if (const int sig = take_stop_signal(); sig != 0 && !stopping_) {
      stopping_ = true;
      if (task_.procid == 0) write_file_atomic(coord_.stop(), strsignal(sig));
    }
    if (fs::exists(coord_.failed())) {
      child_->signal(0, SIGTERM);
      child_->wait(30);
      return 1;
    }
    if (task_.role == Role::learner && (stopping_ || fs::exists(coord_.stop())) && !stop_sent_) {
      stop_sent_ = true;
      child_->signal(0, SIGTERM);  // the learner checkpoints, then exits
      child_->signal(0, SIGCONT);
    }
    // The learner finished: as the local launcher does, the workers stop first (with the
    // hub there to take what they hold), then the hub (it saves its state).
    if (task_.role != Role::learner && fs::exists(coord_.learner_done()) && (task_.role == Role::worker || workers_ended()))
      return finish();
    if (!stopping_)
      if (const auto why = sup_.stuck(id_, heartbeat_mtime(run_dir_, id_), wall_now()); !why.empty()) {
        std::cerr << fmt::format("{}: stuck: {}; killing it", me_, why) << std::endl;
        child_->signal(0, SIGKILL);  // reported once, until it is reaped and restarted
      }
    if (!child_->poll()) return -1;
    const RunFacts facts{.stopping = stopping_,
                         .learner_done = fs::exists(coord_.learner_done()),
                         .has_checkpoint = !list_checkpoints(run_dir_.checkpoints()).empty()};
    const auto d = sup_.ended(id_, role_end(run_dir_, id_, child_->ranks()[0]), facts);
    switch (d.verdict) {
      case Verdict::keep_going: return -1;  // a worker the hub has nothing more for: wait for the end
      case Verdict::learner_done:
        if (task_.index == 0) write_file_atomic(coord_.learner_done(), "");
        return 0;
      case Verdict::restart_role:
      case Verdict::reform_learner:  // the other ranks re-form the group around its replacement
        std::cerr << fmt::format("{}: {}", me_, d.why) << std::endl;
        child_ = start();
        return -1;
      default: return fail(d.why);  // the run's restart is the task manager's (a requeue, --resume)
    }
  }
  // The learner is done (and, for the hub, the workers): the child stops; the hub's task
  // ends the run.
  int finish() {
    child_->signal(0, SIGTERM);
    child_->signal(0, SIGCONT);
    child_->wait(30);
    if (task_.role == Role::worker) write_file_atomic(coord_.worker_ended(task_.index), "");
    if (task_.role != Role::hub) return 0;
    write_file_atomic(coord_.done(), "");
    progress_.reset();
    finish_run(cfg_, run_dir_);
    const bool stopped = fs::exists(coord_.stop());
    std::cerr << fmt::format("{}: {}", me_,
                             stopped ? "stopped; `rlx run CONFIG --resume` in a new step continues from the last checkpoint"
                                     : fmt::format("done; final weights {}", run_dir_.final_model().string()))
              << std::endl;
    return stopped ? 130 : 0;
  }
  std::unique_ptr<dist::LocalGroup> start() {
    const auto log_dir = run_dir_.role_logs(task_.role, task_.index, static_cast<int>(starts_));
    ++starts_;
    sup_.started(id_, wall_now());
    dist::LocalGroupOptions o{
        .argv = {exe_, "role", role_name(task_.role), "--config", run_dir_.config().string(), "--run-dir", run_dir_.string(),
                 "--weights", fmt::format("rlx-{}-{}", cfg_.run.name, task_.group), "--exe", exe_, "--index",
                 std::to_string(task_.index), "--transport", task_.tcp ? "tcp" : "local"},
        .env = {fmt::format("RLX_LAUNCHER_PID={}", ::getpid())},
        .log_dir = log_dir,
        .block_sigterm = task_.role == Role::worker};
    if (task_.tcp) o.env.push_back("RLX_COMM_INTERFACE=" + host_);
    // The store is task 0's: a learner rank > 0 restarted by its task re-forms the group.
    if (task_.role == Role::learner && sup_.policy().learner_reform) o.env.push_back(fmt::format("{}=1", kLearnerReformEnv));
    if (task_.role == Role::learner)
      o.first_rank = task_.index, o.group_size = static_cast<int>(cfg_.train.learner_ranks),
      o.store = ready_.value("store", std::string());
    if (o.store.empty()) o.group_size = 0, o.first_rank = 0;
    return std::make_unique<dist::LocalGroup>(o);
  }
  int fail(const std::string& why) {
    std::cerr << fmt::format("{}: {}; the job step fails (`rlx run CONFIG --resume` continues from the last checkpoint)",
                             me_, why)
              << std::endl;
    if (!fs::exists(coord_.failed())) write_file_atomic(coord_.failed(), why + "\n");
    return 1;
  }
  // Every worker task has stopped its worker, or kWorkersEndS passed since the learner
  // finished (a worker's pod that never started, a node that went away).
  bool workers_ended() {
    static constexpr double kWorkersEndS = 40;  // a worker's own stop is bounded by 30 s
    static constexpr double kSayWaitingS = 5;   // a worker stops in well under a second
    if (learner_done_at_ == 0) learner_done_at_ = now_s();
    for (uint32_t i = 0; i < worker_processes(cfg_); ++i)
      if (!fs::exists(coord_.worker_ended(static_cast<int>(i)))) {
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
      if (fs::exists(coord_.ready())) {
        auto j = json::parse(read_file(coord_.ready(), 1 << 16), nullptr, false);
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
  RunDir run_dir_;
  RunDir::TaskFiles coord_;
  RoleId id_;
  Supervisor sup_;
  std::string me_, host_;
  json ready_;
  std::unique_ptr<dist::LocalGroup> child_;
  std::optional<Progress> progress_;
  uint32_t starts_ = 0;
  double learner_done_at_ = 0;
  bool said_waiting_ = false, stop_sent_ = false, stopping_ = false;
};

}  // namespace

int launch_task(const RunConfig& cfg, const RoleTask& task, const std::string& exe, const LaunchOptions& lo) {
  return TaskRunner(cfg, task, exe).run(lo);
}

}  // namespace rlx::launch
