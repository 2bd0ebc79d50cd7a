#include "local_roles.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "launch_common.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/learner/checkpoint.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;

LocalRoles::LocalRoles(const RunConfig& cfg, const RunDir& run_dir, const std::string& exe, int attempt,
                       Supervisor& sup)
    : cfg_(cfg), run_dir_(run_dir), exe_(exe), attempt_(attempt), sup_(sup) {
  weights_ = fmt::format("rlx-{}-{}-{}", cfg.run.name, ::getpid(), attempt);
  env_ = {fmt::format("RLX_LAUNCHER_PID={}", ::getpid())};
  tcp_ = cfg.train.transport == Transport::tcp;
  run_dir.remove_endpoints();  // a former attempt's: roles wait for this one's
  hub_ = start(Role::hub, 0);
  // A learner rank other than 0 that dies may be restarted alone: the group re-forms around it.
  learner_ = start(Role::learner, 0, static_cast<int>(cfg.train.learner_ranks), 0,
                   sup.policy().learner_reform
                       ? std::function<bool(int, const dist::RankExit&)>(
                             [this](int r, const dist::RankExit& e) { return replace_learner_rank(r, e); })
                       : nullptr);
  colocated_ = cfg.train.placement == Placement::colocated;  // the rollout engine is in the learner
  if (!colocated_) scale(run_dir_.scaled_workers(cfg.rollout.workers));
}

Decision LocalRoles::poll(bool stopping) {
  stopping_ = stopping;
  if (!stopping) kill_stuck();
  hub_->poll();
  if (learner_->poll()) {
    // Asked to stop, a learner still starting ends by the signal (it had nothing to save).
    const auto& ranks = learner_->ranks();
    const auto clean = [&](const dist::RankExit& e) { return e.ok() || (stopping && e.signal == SIGTERM); };
    if (std::all_of(ranks.begin(), ranks.end(), clean)) return {Verdict::learner_done, ""};
    // The rank that failed first (the others were stopped because of it).
    size_t r = 0;
    if (learner_->first_failed() >= 0)
      r = static_cast<size_t>(learner_->first_failed());
    else
      while (r + 1 < ranks.size() && (ranks[r].ok() || ranks[r].signal == SIGTERM || ranks[r].signal == SIGKILL)) ++r;
    const RoleId id{Role::learner, static_cast<int>(r)};
    return sup_.ended(id, role_end(run_dir_, id, ranks[r]), {.stopping = stopping, .lead_running = false});
  }
  if (stopping) return {};
  if (!hub_->running(0)) return sup_.ended({Role::hub, 0}, role_end(run_dir_, {Role::hub, 0}, hub_->ranks()[0]), {});
  if (auto d = poll_workers(); d.verdict != Verdict::keep_going) return d;
  if (colocated_ && !said_no_scale_ && fs::exists(run_dir_.scale_request())) {
    said_no_scale_ = true;
    std::cerr << "rlx run: rlx scale does not apply to a colocated run (its rollout engine is in the learner "
                 "process); ignored"
              << std::endl;
  }
  if (!colocated_) {
    const auto wanted = run_dir_.scaled_workers(cfg_.rollout.workers);
    if (wanted != active_workers()) {
      std::cerr << fmt::format("rlx run: rollout workers {} -> {} (rlx scale)", active_workers(), wanted) << std::endl;
      scale(wanted);
    }
  }
  return {};
}

Decision LocalRoles::poll_workers() {
  for (size_t w = 0; w < workers_.size(); ++w) {
    auto& slot = workers_[w];
    const int index = static_cast<int>(w);
    if (!slot.group) continue;
    if (!slot.group->poll()) {
      if (sup_.leave_overdue(index, now_s())) {
        std::cerr << fmt::format("rlx run: worker {} did not leave within {} s; killing it", w,
                                 cfg_.train.batch_timeout_s)
                  << std::endl;
        slot.group->signal(0, SIGKILL);
      }
      continue;
    }
    const RoleId id{Role::worker, index};
    auto d = sup_.ended(id, role_end(run_dir_, id, slot.group->ranks()[0]), {});
    switch (d.verdict) {
      case Verdict::keep_going:
        break;
      case Verdict::worker_left:
        std::cerr << "rlx run: " << d.why << std::endl;
        slot.group.reset();
        break;
      case Verdict::restart_role:
        std::cerr << "rlx run: " << d.why << std::endl;
        start_worker(w);  // its leases are issued again by the hub; its episodes continue from their checkpoints
        break;
      default:
        return d;
    }
  }
  return {};
}

// Starts workers, or asks the newest ones to leave (SIGUSR1: each finishes and sends the
// groups it holds, then exits), until `n` are active.
void LocalRoles::scale(uint32_t n) {
  std::vector<bool> running, leaving;
  for (size_t w = 0; w < workers_.size(); ++w)
    running.push_back(workers_[w].group != nullptr), leaving.push_back(sup_.leaving(static_cast<int>(w)));
  const auto plan = Supervisor::scale(running, leaving, n);
  for (const int w : plan.start) {
    if (static_cast<size_t>(w) >= workers_.size()) workers_.resize(static_cast<size_t>(w) + 1);
    start_worker(static_cast<size_t>(w));
  }
  for (const int w : plan.leave) {
    sup_.asked_to_leave(w, now_s());
    workers_[static_cast<size_t>(w)].group->signal(0, SIGUSR1);
  }
}

uint32_t LocalRoles::active_workers() const {
  uint32_t n = 0;
  for (size_t w = 0; w < workers_.size(); ++w) n += workers_[w].group && !sup_.leaving(static_cast<int>(w)) ? 1 : 0;
  return n;
}

void LocalRoles::signal_learner(int sig) {
  for (int r = 0; r < static_cast<int>(cfg_.train.learner_ranks); ++r)
    learner_->signal(r, sig), learner_->signal(r, SIGCONT);
}

void LocalRoles::stop_rest() {
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

void LocalRoles::stop_all(double learner_wait_s) {
  if (hub_->running(0) && !learner_->poll()) {
    signal_learner(SIGTERM);
    learner_->wait(learner_wait_s);
  }
  stop_rest();
}

std::string LocalRoles::doing() const {
  std::vector<std::string> parts;
  const double now = wall_now();
  auto add = [&](Role role, int index) {
    const auto b = read_heartbeat(run_dir_, role, index);
    if (b.status.empty()) return parts.push_back(fmt::format("{} {}: no heartbeat yet", role_name(role), index));
    auto text = fmt::format("{} {}: {} ({:.0f} s)", role_name(role), index, b.status, std::max(0.0, now - b.since));
    if (now - b.beat > 5) text += fmt::format(" [silent for {:.0f} s]", now - b.beat);
    parts.push_back(std::move(text));
  };
  add(Role::learner, 0);
  add(Role::hub, 0);
  for (size_t w = 0; w < workers_.size(); ++w)
    if (workers_[w].group) add(Role::worker, static_cast<int>(w));
  if (active_workers() == 0 && !colocated_) parts.push_back("no rollout worker (rlx scale to 0: rollout paused)");
  return fmt::format("{}", fmt::join(parts, "; "));
}

// A role whose heartbeat (or, before its first, its start) is older than the timeout is
// stuck: it is reported and killed, and the ordinary restart policy follows.
void LocalRoles::kill_stuck() {
  auto check = [&](RoleId id, dist::LocalGroup& g, int rank) {
    if (!g.running(rank)) return;
    const auto why = sup_.stuck(id, heartbeat_mtime(run_dir_, id), wall_now());
    if (why.empty()) return;
    std::cerr << fmt::format("rlx run: {} {} (pid {}) is stuck: {}; killing it", role_name(id.role), id.index,
                             g.ranks()[static_cast<size_t>(rank)].pid, why)
              << std::endl;
    g.signal(rank, SIGKILL);
  };
  check({Role::hub, 0}, *hub_, 0);
  for (int r = 0; r < static_cast<int>(cfg_.train.learner_ranks); ++r) check({Role::learner, r}, *learner_, r);
  for (size_t w = 0; w < workers_.size(); ++w)
    if (workers_[w].group) check({Role::worker, static_cast<int>(w)}, *workers_[w].group, 0);
}

void LocalRoles::start_worker(size_t w) {
  auto& slot = workers_[w];
  slot.group = start(Role::worker, static_cast<int>(w), 1, slot.starts++);
}

// LocalGroupOptions::replace of the learner group: the supervisor says whether a dead rank
// is restarted alone; its replacement and the other ranks re-form the group and resume
// from the newest checkpoint, rank 0 training the steps since again.
bool LocalRoles::replace_learner_rank(int rank, const dist::RankExit& e) {
  const RoleId id{Role::learner, rank};
  const RunFacts facts{.stopping = stopping_,
                       .lead_running = learner_->running(0),
                       .has_checkpoint = !list_checkpoints(run_dir_.checkpoints()).empty()};
  const auto d = sup_.ended(id, role_end(run_dir_, id, e), facts);
  if (d.verdict != Verdict::reform_learner) return false;
  sup_.started(id, wall_now());
  std::cerr << "rlx run: " << d.why << std::endl;
  return true;
}

std::unique_ptr<dist::LocalGroup> LocalRoles::start(Role role, int index, int world, uint32_t earlier,
                                                    std::function<bool(int, const dist::RankExit&)> replace) {
  for (int r = 0; r < world; ++r) sup_.started({role, index + r}, wall_now());
  auto env = env_;
  if (replace) env.push_back(fmt::format("{}=1", kLearnerReformEnv));
  return std::make_unique<dist::LocalGroup>(
      dist::LocalGroupOptions{.world_size = world,
                              .argv = {exe_, "role", role_name(role), "--config", run_dir_.config().string(),
                                       "--run-dir", run_dir_.string(), "--weights", weights_, "--exe", exe_, "--index",
                                       std::to_string(index), "--transport", tcp_ ? "tcp" : "local"},
                              .env = std::move(env),
                              .log_dir = run_dir_.role_logs(role, index, attempt_ * 1000 + static_cast<int>(earlier)),
                              .replace = std::move(replace),
                              .block_sigterm = role == Role::worker});
}

}  // namespace rlx::launch
