// The supervisor's decisions (include/rlx/launch/supervisor.hpp): pure code, no process,
// no file, no clock of its own.
#include "rlx/launch/supervisor.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "rlx/launch/config.hpp"

namespace rlx::launch {

bool RoleFailure::hopeless(const std::optional<RoleFailure>& before) const {
  return cannot_run ||
         (at_start && before && before->at_start && before->id == id && !cause.empty() && before->cause == cause);
}

std::string RoleFailure::message(const std::optional<RoleFailure>& before) const {
  if (cannot_run)
    return fmt::format("{} {} cannot run: {}", role_name(id.role), id.index, cause.empty() ? what : cause);
  return fmt::format("{} {} failed at start twice with the same error ({}); restarting will not help: {}",
                     role_name(id.role), id.index, what, cause);
}

SupervisorPolicy SupervisorPolicy::of(const RunConfig& cfg) {
  return {.heartbeat_timeout_s = cfg.train.heartbeat_timeout_s,
          .start_timeout_s = cfg.train.start_timeout_s,
          .worker_restarts = cfg.rollout.max_restarts,
          .run_restarts = cfg.train.max_restarts,
          .learner_reform = cfg.train.learner_ranks > 1 && cfg.train.max_restarts > 0,
          .checkpoints = cfg.learner.checkpoint_every > 0,
          .leave_timeout_s = cfg.train.batch_timeout_s,
          .report_every_s = cfg.train.report_every_s};
}

void Supervisor::begin_attempt(uint32_t attempt, double now) {
  attempt_ = attempt;
  failed_before_ = std::move(failure_);
  failure_.reset();
  slots_.clear();
  leave_by_.clear();
  learner_rank_restarts_ = killed_stuck_ = 0;
  reported_at_ = now;
}

void Supervisor::started(RoleId id, double now) {
  auto& s = slots_[id];
  s.started = now;
  s.flagged_stuck = false;
  if (id.role == Role::worker) leave_by_.erase(id.index);
}

std::string Supervisor::stuck(RoleId id, double beat, double now) {
  auto& s = slots_[id];
  if (s.flagged_stuck) return "";         // killed, not reaped yet
  const bool beaten = beat >= s.started;  // an older file is a predecessor's
  const double silent = now - (beaten ? beat : s.started);
  std::string why;
  if (beaten && silent > p_.heartbeat_timeout_s)
    why = fmt::format("no heartbeat for {:.0f} s (train.heartbeat_timeout_s)", silent);
  else if (!beaten && silent > p_.start_timeout_s)
    why = fmt::format("no first heartbeat {:.0f} s after its start (train.start_timeout_s)", silent);
  if (!why.empty()) s.flagged_stuck = true, ++killed_stuck_;
  return why;
}

Decision Supervisor::ended(RoleId id, const RoleEnd& end, const RunFacts& facts) {
  switch (id.role) {
    case Role::worker:
      return worker_ended(id, end);
    case Role::learner:
      return learner_ended(id, end, facts);
    case Role::hub:
      break;
  }
  return run_ended(end.failure, failed_before_);
}

Decision Supervisor::worker_ended(RoleId id, const RoleEnd& end) {
  if (leave_by_.erase(id.index) > 0)  // its leases were sent, or the hub issues them again
    return {Verdict::worker_left, fmt::format("worker {} left ({})", id.index, end.ok ? "clean" : end.how)};
  if (end.ok) return {};  // the hub has nothing more for it
  auto& s = slots_[id];
  const auto& f = end.failure;
  if (f.hopeless(s.last_failure)) {
    failure_ = f;
    return {Verdict::give_up, f.message(s.last_failure), true};
  }
  s.last_failure = f;
  if (s.restarts >= p_.worker_restarts)
    return {Verdict::restart_run,
            fmt::format("{}; it was restarted {} times (rollout.max_restarts)", f.what, s.restarts)};
  ++s.restarts;  // its leases are issued again by the hub; its episodes continue from their checkpoints
  return {Verdict::restart_role, fmt::format("{}; restarting it ({}/{})", f.what, s.restarts, p_.worker_restarts)};
}

Decision Supervisor::learner_ended(RoleId id, const RoleEnd& end, const RunFacts& facts) {
  // Asked to stop, a learner still starting ends by the signal (it had nothing to save).
  if (end.ok || (facts.stopping && end.stop_signal)) return {Verdict::learner_done, ""};
  auto& s = slots_[id];
  const auto& f = end.failure;
  if (f.hopeless(s.last_failure)) return run_ended(f, s.last_failure);
  // A rank other than 0 is restarted alone once a checkpoint exists: its replacement and the
  // other ranks re-form the group from it (rank 0 holds the hub's batches and the weights'
  // endpoint: its death restarts the run, as a rank's does before any checkpoint).
  if (id.index > 0 && p_.learner_reform && !facts.stopping && facts.lead_running && !facts.learner_done &&
      p_.checkpoints && facts.has_checkpoint && learner_rank_restarts_ < p_.run_restarts) {
    s.last_failure = f;
    ++learner_rank_restarts_;
    return {Verdict::reform_learner,
            fmt::format("{}; restarting it alone: the learner group re-forms around it ({}/{}, train.max_restarts)",
                        f.what, learner_rank_restarts_, p_.run_restarts)};
  }
  return run_ended(f, failed_before_);
}

Decision Supervisor::run_ended(const RoleFailure& f, const std::optional<RoleFailure>& before) {
  failure_ = f;
  if (f.hopeless(before)) return {Verdict::give_up, f.message(before), true};
  return {Verdict::restart_run, f.what};
}

Decision Supervisor::after_attempt(const Decision& d) const {
  if (d.verdict != Verdict::restart_run) return d;
  if (attempt_ >= p_.run_restarts)
    return {Verdict::give_up,
            fmt::format("{}; the run was restarted {} times (train.max_restarts); stopping", d.why, attempt_)};
  return {Verdict::restart_run,
          fmt::format("{}; restarting the run from its last checkpoint ({}/{})", d.why, attempt_ + 1, p_.run_restarts)};
}

Supervisor::ScalePlan Supervisor::scale(const std::vector<bool>& running, const std::vector<bool>& leaving,
                                        uint32_t wanted) {
  ScalePlan plan;
  uint32_t active = 0;
  for (size_t w = 0; w < running.size(); ++w) active += running[w] && !leaving[w] ? 1 : 0;
  for (size_t w = 0; active < wanted; ++w)
    if (w >= running.size() || !running[w]) plan.start.push_back(static_cast<int>(w)), ++active;
  for (size_t w = running.size(); active > wanted && w-- > 0;)
    if (running[w] && !leaving[w]) plan.leave.push_back(static_cast<int>(w)), --active;
  return plan;
}

void Supervisor::asked_to_leave(int w, double now) { leave_by_[w] = now + p_.leave_timeout_s; }

bool Supervisor::leave_overdue(int w, double now) const {
  const auto it = leave_by_.find(w);
  return it != leave_by_.end() && now > it->second;
}

void Supervisor::stop_requested(double now) { stop_by_ = now + p_.stop_timeout_s; }

bool Supervisor::report_due(double last_step_at, double now) {
  if (stopping() || now - std::max(last_step_at, reported_at_) < p_.report_every_s) return false;
  reported_at_ = now;
  return true;
}

uint32_t Supervisor::worker_restarts() const {
  uint32_t n = 0;
  for (const auto& [id, s] : slots_)
    if (id.role == Role::worker) n += s.restarts;
  return n;
}

}  // namespace rlx::launch
