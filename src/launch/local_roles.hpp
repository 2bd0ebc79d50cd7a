// The local backend of the supervisor: the processes of one attempt of a run on this host
// (`rlx run` without a task manager): the hub, the learner group and the rollout workers as
// LocalGroups. It reports what they do to the Supervisor and carries out its decisions
// (restart a worker, re-form the learner group, kill one stuck, scale the workers);
// launcher.cpp runs the attempts around it.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rlx/dist/local_group.hpp"
#include "rlx/launch/config.hpp"
#include "rlx/launch/run_dir.hpp"
#include "rlx/launch/supervisor.hpp"

namespace rlx::launch {

class LocalRoles {
 public:
  // Starts the hub, the learner group and (split placement) the workers `rlx scale` asks for.
  LocalRoles(const RunConfig& cfg, const RunDir& run_dir, const std::string& exe, int attempt, Supervisor& sup);

  // Polls every role once and carries out the supervisor's decisions. Returns the decision
  // that ends the attempt (learner_done, restart_run, give_up), else keep_going.
  Decision poll(bool stopping);
  // A stopped (SIGSTOP) rank is continued, so that it hears `sig`.
  void signal_learner(int sig);
  // The learner finished: stop the workers, then the hub (it saves its state). A worker
  // ends its lease or env call at once on SIGTERM; one that has not within kWorkerStopS
  // (stopped, hung) is killed: the hub issues its leases again on --resume.
  void stop_rest();
  // A run that cannot go on: the learner checkpoints when it can (the hub still runs), then
  // the rest stops.
  void stop_all(double learner_wait_s);
  const dist::RankExit& learner_exit() const { return learner_->ranks()[0]; }
  // What each role is doing, from its heartbeat: "learner 0: waiting for ... (12 s); ...".
  std::string doing() const;

 private:
  void kill_stuck();
  Decision poll_workers();
  void scale(uint32_t n);
  uint32_t active_workers() const;
  void start_worker(size_t w);
  bool replace_learner_rank(int rank, const dist::RankExit& e);
  // `earlier`: how many times this role and index were started before in this attempt.
  std::unique_ptr<dist::LocalGroup> start(Role role, int index, int world = 1, uint32_t earlier = 0,
                                          std::function<bool(int, const dist::RankExit&)> replace = nullptr);

  const RunConfig& cfg_;
  RunDir run_dir_;
  std::string exe_, weights_;
  int attempt_;
  Supervisor& sup_;
  bool tcp_ = false;
  bool colocated_ = false, said_no_scale_ = false;
  bool stopping_ = false;
  std::vector<std::string> env_;
  std::unique_ptr<dist::LocalGroup> hub_, learner_;
  struct WorkerSlot {                         // worker index = position
    std::unique_ptr<dist::LocalGroup> group;  // null: not running (scaled down)
    uint32_t starts = 0;
  };
  std::vector<WorkerSlot> workers_;
};

}  // namespace rlx::launch
