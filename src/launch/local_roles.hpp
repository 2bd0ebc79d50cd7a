// The processes of one attempt of a local run (`rlx run` without a task manager): the hub,
// the learner group and the rollout workers as LocalGroups, their restarts, `rlx scale`,
// and the roles found stuck. src/launch/launcher.cpp runs the attempts around it.
#pragma once

#include <signal.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "launch_common.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/log.hpp"
#include "rlx/dist/local_group.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/learner/checkpoint.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

// The number of rollout workers asked for by `rlx scale` (run_dir/scale.json), else `fallback`.
inline uint32_t scaled_workers(const fs::path& run_dir, uint32_t fallback) {
  std::ifstream f(run_dir / "scale.json");
  if (!f) return fallback;
  const auto j = json::parse(f, nullptr, false);
  const auto n = j.is_object() ? j.value("workers", int64_t{0}) : 0;
  if (n < 0 || n > 1024 || !j.is_object() || !j.contains("workers")) {
    log::warn("{}: \"workers\" must be 0 to 1024; keeping {}", (run_dir / "scale.json").string(), fallback);
    return fallback;
  }
  return static_cast<uint32_t>(n);
}

// The processes of one attempt of a run: the hub, the learner group, and each rollout
// worker in a group of its own (restarted alone when it dies; started or asked to leave
// when `rlx scale` changes their number).
class Roles {
 public:
  Roles(const RunConfig& cfg, const fs::path& run_dir, const std::string& exe, int attempt)
      : cfg_(cfg), run_dir_(run_dir), exe_(exe), attempt_(attempt) {
    weights_ = fmt::format("rlx-{}-{}-{}", cfg.run.name, ::getpid(), attempt);
    env_ = {fmt::format("RLX_LAUNCHER_PID={}", ::getpid())};
    tcp_ = cfg.train.transport == Transport::tcp;
    remove_endpoints(run_dir);  // a former attempt's: roles wait for this one's
    hub_ = start("hub", 0);
    // A learner rank other than 0 that dies is restarted alone and the group re-forms around
    // it (rank 0 holds the hub's batches and the weights' endpoint: its death restarts the run).
    const bool reform = cfg.train.learner_ranks > 1 && cfg.train.max_restarts > 0;
    learner_ = start("learner", 0, static_cast<int>(cfg.train.learner_ranks), 0,
                     reform ? std::function<bool(int, const dist::RankExit&)>(
                                  [this](int r, const dist::RankExit& e) { return replace_learner_rank(r, e); })
                            : nullptr);
    colocated_ = cfg.train.placement == Placement::colocated;  // the rollout engine is in the learner
    if (!colocated_) scale(scaled_workers(run_dir_, cfg.rollout.workers));
  }

  enum class State { running, learner_done, failed, hopeless };
  // Worker restarts after deaths, and roles killed as stuck, in this attempt (live metrics).
  uint32_t worker_restarts() const {
    uint32_t n = 0;
    for (const auto& w : workers_) n += w.restarts;
    return n;
  }
  size_t killed_stuck() const { return killed_stuck_.size(); }
  uint32_t learner_rank_restarts() const { return learner_rank_restarts_; }

  // Polls every role once; restarts dead workers (bounded). `why` names a failure, and
  // failure() says how it ended. `hopeless`: a role cannot run (restarting will not help).
  State poll(bool stopping, std::string& why) {
    stopping_ = stopping;
    if (!stopping) kill_stuck();
    hub_->poll();
    const bool learner_done = learner_->poll();
    // Asked to stop, a learner still starting ends by the signal (it had nothing to save).
    const auto clean = [&](const dist::RankExit& e) { return e.ok() || (stopping && e.signal == SIGTERM); };
    if (learner_done && std::all_of(learner_->ranks().begin(), learner_->ranks().end(), clean)) return State::learner_done;
    if (learner_done && !stopping) {
      // The rank that failed first (the others were stopped because of it).
      const auto& ranks = learner_->ranks();
      size_t r = 0;
      if (learner_->first_failed() >= 0) r = static_cast<size_t>(learner_->first_failed());
      else
        while (r + 1 < ranks.size() && (ranks[r].ok() || ranks[r].signal == SIGTERM || ranks[r].signal == SIGKILL)) ++r;
      failure_ = role_failure(run_dir_, "learner", static_cast<int>(r), ranks[r]);
      why = describe("learner", static_cast<int>(r), ranks[r]);
      return failure_->cannot_run ? State::hopeless : State::failed;
    }
    if (!hub_->running(0) && !stopping) {
      failure_ = role_failure(run_dir_, "hub", 0, hub_->ranks()[0]);
      why = describe("hub", 0, hub_->ranks()[0]);
      return failure_->cannot_run ? State::hopeless : State::failed;
    }
    for (size_t w = 0; w < workers_.size() && !stopping; ++w) {
      auto& slot = workers_[w];
      if (!slot.group || !slot.group->poll()) {
        if (slot.group && slot.leaving && now_s() > slot.leave_deadline) {
          std::cerr << fmt::format("rlx run: worker {} did not leave within {} s; killing it", w, cfg_.train.batch_timeout_s)
                    << std::endl;
          slot.group->signal(0, SIGKILL);
        }
        continue;
      }
      const auto& e = slot.group->ranks()[0];
      if (slot.leaving) {  // its leases were sent, or the hub issues them again
        std::cerr << fmt::format("rlx run: worker {} left ({})", w, e.ok() ? "clean" : e.describe()) << std::endl;
        slot.group.reset();
        continue;
      }
      if (e.ok()) continue;
      const auto what = describe("worker", static_cast<int>(w), e);
      auto failed = role_failure(run_dir_, "worker", static_cast<int>(w), e);
      if (failed.hopeless(slot.failure)) {
        why = failed.message(slot.failure);
        failure_ = std::move(failed);
        return State::hopeless;
      }
      slot.failure = std::move(failed);
      if (slot.restarts >= cfg_.rollout.max_restarts)
        return why = fmt::format("{}; it was restarted {} times (rollout.max_restarts)", what, slot.restarts), State::failed;
      ++slot.restarts;
      std::cerr << fmt::format("rlx run: {}; restarting it ({}/{})", what, slot.restarts, cfg_.rollout.max_restarts)
                << std::endl;
      start_worker(w);  // its leases are issued again by the hub; its episodes continue from their checkpoints
    }
    if (!stopping && colocated_ && !said_no_scale_ && fs::exists(run_dir_ / "scale.json")) {
      said_no_scale_ = true;
      std::cerr << "rlx run: rlx scale does not apply to a colocated run (its rollout engine is in the learner "
                   "process); ignored"
                << std::endl;
    }
    if (!stopping && !colocated_) {
      const auto wanted = scaled_workers(run_dir_, cfg_.rollout.workers);
      if (wanted != active_workers()) {
        std::cerr << fmt::format("rlx run: rollout workers {} -> {} (rlx scale)", active_workers(), wanted) << std::endl;
        scale(wanted);
      }
    }
    return State::running;
  }
  // Starts workers, or asks the newest ones to leave (SIGUSR1: each finishes and sends the
  // groups it holds, then exits), until `n` are active.
  void scale(uint32_t n) {
    for (size_t w = 0; active_workers() < n; ++w) {
      if (w == workers_.size()) workers_.emplace_back();
      if (!workers_[w].group) start_worker(w);
    }
    for (size_t w = workers_.size(); active_workers() > n && w-- > 0;) {
      auto& slot = workers_[w];
      if (!slot.group || slot.leaving) continue;
      slot.leaving = true;
      slot.leave_deadline = now_s() + cfg_.train.batch_timeout_s;
      slot.group->signal(0, SIGUSR1);
    }
  }
  uint32_t active_workers() const {
    return static_cast<uint32_t>(
        std::count_if(workers_.begin(), workers_.end(), [](const WorkerSlot& s) { return s.group && !s.leaving; }));
  }
  // A stopped (SIGSTOP) rank is continued, so that it hears `sig`.
  void signal_learner(int sig) {
    for (int r = 0; r < static_cast<int>(cfg_.train.learner_ranks); ++r) learner_->signal(r, sig), learner_->signal(r, SIGCONT);
  }
  bool learner_running() { return !learner_->poll(); }
  // The learner finished: stop the workers, then the hub (it saves its state). A worker
  // ends its lease or env call at once on SIGTERM; one that has not within kWorkerStopS
  // (stopped, hung) is killed: the hub issues its leases again on --resume.
  void stop_rest() {
    static constexpr double kWorkerStopS = 10, kHubStopS = 30;
    for (auto& w : workers_)
      if (w.group) w.group->signal(0, SIGTERM), w.group->signal(0, SIGCONT);
    const double workers_end = now_s() + kWorkerStopS;
    for (auto& w : workers_)
      if (w.group) w.group->wait(std::max(0.0, workers_end - now_s()));
    hub_->signal(0, SIGTERM);
    hub_->signal(0, SIGCONT);
    hub_->wait(kHubStopS);
  }
  // A run that cannot go on: the learner checkpoints when it can (the hub still runs), then
  // the rest stops.
  void stop_all(double learner_wait_s) {
    if (hub_->running(0) && learner_running()) {
      signal_learner(SIGTERM);
      learner_->wait(learner_wait_s);
    }
    stop_rest();
  }
  const dist::RankExit& learner_exit() const { return learner_->ranks()[0]; }
  const std::optional<RoleFailure>& failure() const { return failure_; }
  // What each role is doing, from its heartbeat: "learner 0: waiting for ... (12 s); ...".
  std::string doing() const {
    std::vector<std::string> parts;
    const double now = wall_now();
    auto add = [&](const char* role, int index) {
      const auto b = read_heartbeat(run_dir_, role, index);
      if (b.status.empty()) return parts.push_back(fmt::format("{} {}: no heartbeat yet", role, index));
      auto text = fmt::format("{} {}: {} ({:.0f} s)", role, index, b.status, std::max(0.0, now - b.since));
      if (now - b.beat > 5) text += fmt::format(" [silent for {:.0f} s]", now - b.beat);
      parts.push_back(std::move(text));
    };
    add("learner", 0);
    add("hub", 0);
    for (size_t w = 0; w < workers_.size(); ++w)
      if (workers_[w].group) add("worker", static_cast<int>(w));
    if (active_workers() == 0 && !colocated_) parts.push_back("no rollout worker (rlx scale to 0: rollout paused)");
    return fmt::format("{}", fmt::join(parts, "; "));
  }

 private:
  // A role whose heartbeat (or, before its first, its start) is older than the timeout
  // is stuck: it is reported and killed, and the ordinary restart policy follows.
  void kill_stuck() {
    auto check = [&](const char* role, int index, dist::LocalGroup& g, int rank) {
      if (!g.running(rank)) return;
      const auto pid = g.ranks()[static_cast<size_t>(rank)].pid;
      if (killed_stuck_.contains(pid)) return;  // killed, not reaped yet
      const auto why = stuck_reason(cfg_.train, run_dir_, role, index, started_.at(fmt::format("{}-{}", role, index)));
      if (why.empty()) return;
      killed_stuck_.insert(pid);
      std::cerr << fmt::format("rlx run: {} {} (pid {}) is stuck: {}; killing it", role, index, pid, why) << std::endl;
      g.signal(rank, SIGKILL);
    };
    check("hub", 0, *hub_, 0);
    for (int r = 0; r < static_cast<int>(cfg_.train.learner_ranks); ++r) check("learner", r, *learner_, r);
    for (size_t w = 0; w < workers_.size(); ++w)
      if (workers_[w].group) check("worker", static_cast<int>(w), *workers_[w].group, 0);
  }
  void start_worker(size_t w) {
    auto& slot = workers_[w];
    slot.group = start("worker", static_cast<int>(w), 1, slot.starts++);
    slot.leaving = false;
  }
  // LocalGroupOptions::replace of the learner group: a dead rank > 0 is restarted alone
  // (train.max_restarts times in an attempt); its replacement and the other ranks re-form the
  // group and resume from the newest checkpoint, rank 0 training the steps since again.
  bool replace_learner_rank(int rank, const dist::RankExit& e) {
    if (rank == 0 || stopping_ || !learner_->running(0) || learner_rank_restarts_ >= cfg_.train.max_restarts)
      return false;
    // The group resumes from a checkpoint, and rank 0 keeps the batches since only when it
    // checkpoints: else the run restarts (from the start, or from the checkpoint it resumed).
    if (cfg_.learner.checkpoint_every == 0 || list_checkpoints(run_dir_ / "checkpoints").empty()) return false;
    ++learner_rank_restarts_;
    started_[fmt::format("learner-{}", rank)] = wall_now();
    std::cerr << fmt::format("rlx run: {}; restarting it alone: the learner group re-forms around it ({}/{}, "
                             "train.max_restarts)",
                             describe("learner", rank, e), learner_rank_restarts_, cfg_.train.max_restarts)
              << std::endl;
    return true;
  }
  // `earlier`: how many times this role and index were started before in this attempt.
  std::unique_ptr<dist::LocalGroup> start(const char* role, int index, int world = 1, uint32_t earlier = 0,
                                          std::function<bool(int, const dist::RankExit&)> replace = nullptr) {
    for (int r = 0; r < world; ++r) started_[fmt::format("{}-{}", role, index + r)] = wall_now();
    const auto resolved = run_dir_ / "config.yaml";
    auto log_dir = run_dir_ / "logs" / fmt::format("{}-{}", role, index);
    if (attempt_ > 0 || earlier > 0) log_dir += fmt::format(".{}", attempt_ * 1000 + static_cast<int>(earlier));
    return std::make_unique<dist::LocalGroup>(dist::LocalGroupOptions{
        .world_size = world,
        .argv = {exe_, "role", role, "--config", resolved.string(), "--run-dir", run_dir_.string(), "--weights", weights_,
                 "--exe", exe_, "--index", std::to_string(index), "--transport", tcp_ ? "tcp" : "local"},
        .env = replace ? with(env_, fmt::format("{}=1", kLearnerReformEnv)) : env_,
        .log_dir = log_dir,
        .replace = std::move(replace),
        .block_sigterm = std::string_view(role) == "worker"});
  }
  static std::vector<std::string> with(std::vector<std::string> v, std::string more) {
    v.push_back(std::move(more));
    return v;
  }
  static std::string describe(const char* role, int index, const dist::RankExit& e) {
    return fmt::format("{} {} ended: {} (log: {})", role, index, e.describe(), e.err.string());
  }
  const RunConfig& cfg_;
  fs::path run_dir_;
  std::string exe_, weights_;
  int attempt_;
  bool tcp_ = false;
  bool colocated_ = false, said_no_scale_ = false;
  bool stopping_ = false;
  uint32_t learner_rank_restarts_ = 0;  // learner ranks > 0 restarted alone (the group re-formed)
  std::vector<std::string> env_;
  std::unique_ptr<dist::LocalGroup> hub_, learner_;
  struct WorkerSlot {  // worker index = position
    std::unique_ptr<dist::LocalGroup> group;  // null: not running (scaled down)
    uint32_t restarts = 0;                    // after deaths (rollout.max_restarts)
    uint32_t starts = 0;
    std::optional<RoleFailure> failure;       // how it ended the last time
    bool leaving = false;  // asked to leave by a scale-down
    double leave_deadline = 0;
  };
  std::vector<WorkerSlot> workers_;
  std::map<std::string, double> started_;  // role-index -> when it was (re)started (wall clock)
  std::set<pid_t> killed_stuck_;           // roles killed as stuck (reported once)
  std::optional<RoleFailure> failure_;      // the failure poll() reported
};

}  // namespace rlx::launch
