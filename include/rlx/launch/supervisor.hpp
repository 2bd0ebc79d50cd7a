// The supervisor of a run: every decision on its roles (restart one, re-form the learner
// group, restart the run, give up, kill one found stuck, scale the workers) as pure code
// over what the roles did and a clock passed in. Two backends carry its decisions out:
// local processes (launcher.cpp, local_roles.cpp) and one task per role under Slurm or
// Kubernetes (task_runner.cpp). Its tests drive it with a fake clock and no process.
//
//   rlx::launch::Supervisor sup(rlx::launch::SupervisorPolicy::of(cfg));
//   sup.started({Role::worker, 0}, now);
//   if (auto why = sup.stuck({Role::worker, 0}, beat, now); !why.empty()) kill(...);
//   auto d = sup.ended({Role::worker, 0}, end, {});
//   if (d.verdict == Verdict::restart_role) start_worker(0);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rlx/launch/role.hpp"

namespace rlx {
struct RunConfig;
}

namespace rlx::launch {

// One process of a run: its role and its index (learner rank, worker index; 0 for the hub).
struct RoleId {
  Role role = Role::hub;
  int index = 0;
  auto operator<=>(const RoleId&) const = default;
};

// How a role ended, as the restart policy weighs it.
struct RoleFailure {
  RoleId id;
  std::string what;         // "worker 0 ended: exit 1 (log: ...)"
  std::string cause;        // the role's own words: why it cannot run, else its last error line
  bool at_start = false;    // before its start-up was over (it never said ready)
  bool cannot_run = false;  // it said it cannot run (kExitCannotRun) or its config is wrong (exit 2)

  // Restarting will not help: it cannot run, or it failed at start with the same error as
  // the last time.
  bool hopeless(const std::optional<RoleFailure>& before) const;
  std::string message(const std::optional<RoleFailure>& before) const;
};

// A role's process that ended.
struct RoleEnd {
  bool ok = false;           // exit 0
  bool stop_signal = false;  // ended by SIGTERM (the stop it was asked for)
  std::string how;           // "exit 1", "killed by signal 9", ...
  RoleFailure failure;       // how it ended (what, cause) when not ok
};

// What the supervisor knows of the run around an ended role.
struct RunFacts {
  bool stopping = false;        // SIGINT/SIGTERM: the run is stopping
  bool lead_running = true;     // learner rank 0 still runs
  bool learner_done = false;    // the learner finished (a rank ending after it has nothing to rejoin)
  bool has_checkpoint = false;  // a learner checkpoint exists to re-form the group from
};

enum class Verdict {
  keep_going,      // nothing to do
  restart_role,    // start the role again (a worker; its leases are issued again)
  reform_learner,  // restart this learner rank alone: the group re-forms around it
  worker_left,     // a worker asked to leave (scale-down) did
  learner_done,    // the learner finished: stop the workers, then the hub
  restart_run,     // every role starts again from the last checkpoint
  give_up,         // restarting will not help (or the restarts are spent): the run stops
};

struct Decision {
  Verdict verdict = Verdict::keep_going;
  std::string why;        // what happened and what is done, for the console
  bool hopeless = false;  // give_up because a restart would fail the same way
};

struct SupervisorPolicy {
  double heartbeat_timeout_s = 60;  // train.heartbeat_timeout_s: silent longer is stuck
  double start_timeout_s = 600;     // train.start_timeout_s: no first beat for longer is stuck
  uint32_t worker_restarts = 3;     // rollout.max_restarts: each worker, in an attempt
  uint32_t run_restarts = 0;        // train.max_restarts: the run's, and learner ranks > 0 restarted alone
  bool learner_reform = false;      // train.learner_ranks > 1 and train.max_restarts > 0
  bool checkpoints = true;          // learner.checkpoint_every > 0
  double leave_timeout_s = 600;     // train.batch_timeout_s: a worker asked to leave is killed after
  double report_every_s = 30;       // train.report_every_s: "no step for N s" at most this often
  double stop_timeout_s = 300;      // the learner's checkpoint after SIGINT/SIGTERM
  static SupervisorPolicy of(const RunConfig& cfg);
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorPolicy policy) : p_(policy) {}
  const SupervisorPolicy& policy() const { return p_; }

  // A new attempt of the run at `now` (the clock of report_due): the per-attempt counts
  // start over; the last attempt's failure is kept (a role failing at start twice the same
  // way is hopeless).
  void begin_attempt(uint32_t attempt, double now);
  uint32_t attempt() const { return attempt_; }

  // A process of `id` started at `now` (wall clock, as heartbeats' mtimes): until its first
  // heartbeat, the stuck clock runs from here.
  void started(RoleId id, double now);
  // "" or why `id` is stuck (once per start): its last heartbeat `beat` (the file's mtime;
  // -1, or older than its start: none yet) older than heartbeat_timeout_s, or no first beat
  // start_timeout_s after its start.
  std::string stuck(RoleId id, double beat, double now);

  // A role's process ended: what to do.
  Decision ended(RoleId id, const RoleEnd& end, const RunFacts& facts);
  // The attempt ends with `d` (restart_run): the next attempt, or give_up when
  // train.max_restarts are spent (its why says so).
  Decision after_attempt(const Decision& d) const;

  // Workers: which to start and which to ask to leave for `wanted` active ones. `running[w]`:
  // worker w has a process; `leaving[w]`: it was asked to leave. New ones fill the lowest
  // free indices; the newest active ones leave.
  struct ScalePlan {
    std::vector<int> start, leave;
  };
  static ScalePlan scale(const std::vector<bool>& running, const std::vector<bool>& leaving, uint32_t wanted);
  // Worker `w` was asked to leave at `now`; leave_overdue() says when to kill it instead.
  void asked_to_leave(int w, double now);
  bool leaving(int w) const { return leave_by_.contains(w); }
  bool leave_overdue(int w, double now) const;

  // SIGINT/SIGTERM at `now` (this clock and report_due's: any, the same for every call):
  // the learner checkpoints; stop_overdue() once it took too long.
  void stop_requested(double now);
  bool stopping() const { return stop_by_ > 0; }
  bool stop_overdue(double now) const { return stop_by_ > 0 && now >= stop_by_; }
  // True when "no step for N s" is due (no step since `last_step_at`, nor a report since).
  bool report_due(double last_step_at, double now);

  // For the live metrics: in this attempt.
  uint32_t worker_restarts() const;
  uint32_t learner_rank_restarts() const { return learner_rank_restarts_; }
  uint32_t killed_stuck() const { return killed_stuck_; }
  // The failure that ended the attempt (restart_run or give_up on a learner or the hub).
  const std::optional<RoleFailure>& failure() const { return failure_; }

 private:
  Decision worker_ended(RoleId id, const RoleEnd& end);
  Decision learner_ended(RoleId id, const RoleEnd& end, const RunFacts& facts);
  Decision run_ended(const RoleFailure& f, const std::optional<RoleFailure>& before);
  struct Slot {
    double started = 0;
    bool flagged_stuck = false;               // reported once per start
    uint32_t restarts = 0;                    // after deaths, in this attempt
    std::optional<RoleFailure> last_failure;  // how it ended the last time
  };
  SupervisorPolicy p_;
  uint32_t attempt_ = 0;
  std::map<RoleId, Slot> slots_;
  std::map<int, double> leave_by_;  // worker -> when it is killed if still there
  uint32_t learner_rank_restarts_ = 0, killed_stuck_ = 0;
  std::optional<RoleFailure> failure_, failed_before_;  // this attempt's, the last attempt's
  double stop_by_ = 0, reported_at_ = 0;
};

}  // namespace rlx::launch
