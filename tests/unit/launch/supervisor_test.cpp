#include "rlx/launch/supervisor.hpp"

#include <catch2/catch.hpp>

#include "rlx/launch/config.hpp"

using namespace rlx::launch;

namespace {
SupervisorPolicy policy() {
  return {.heartbeat_timeout_s = 60,
          .start_timeout_s = 300,
          .worker_restarts = 2,
          .run_restarts = 1,
          .learner_reform = true,
          .checkpoints = true,
          .leave_timeout_s = 100,
          .report_every_s = 30,
          .stop_timeout_s = 300};
}

// A role that died by SIGKILL after its start-up (`at_start`: before it said ready).
RoleEnd killed(RoleId id, bool at_start = false, std::string cause = "") {
  RoleEnd e{.how = "killed by signal 9"};
  e.failure = {.id = id,
               .what = std::string(role_name(id.role)) + " ended: killed by signal 9",
               .cause = std::move(cause),
               .at_start = at_start};
  return e;
}
RoleEnd cannot_run(RoleId id) {
  RoleEnd e{.how = "exit 78"};
  e.failure = {.id = id, .what = "ended: exit 78", .cause = "env server cannot start", .cannot_run = true};
  return e;
}
const RoleId kHub{Role::hub, 0}, kLead{Role::learner, 0}, kRank1{Role::learner, 1}, kWorker0{Role::worker, 0};
}  // namespace

TEST_CASE("supervisor: the policy comes from the config", "[launch][supervisor]") {
  rlx::RunConfig cfg;
  cfg.train.learner_ranks = 2;
  cfg.train.max_restarts = 3;
  cfg.rollout.max_restarts = 5;
  const auto p = SupervisorPolicy::of(cfg);
  CHECK(p.learner_reform);
  CHECK(p.run_restarts == 3);
  CHECK(p.worker_restarts == 5);
  CHECK(p.heartbeat_timeout_s == cfg.train.heartbeat_timeout_s);
  cfg.train.learner_ranks = 1;
  CHECK_FALSE(SupervisorPolicy::of(cfg).learner_reform);
}

TEST_CASE("supervisor: a role is stuck without a heartbeat, reported once per start", "[launch][supervisor]") {
  Supervisor s(policy());
  s.begin_attempt(0, 0);
  s.started(kWorker0, 1000);
  CHECK(s.stuck(kWorker0, -1, 1200).empty());   // still starting: 200 s < start_timeout_s
  CHECK(s.stuck(kWorker0, 900, 1200).empty());  // a predecessor's beat does not count
  const auto slow = s.stuck(kWorker0, -1, 1301);
  CHECK(slow.find("no first heartbeat 301 s after its start (train.start_timeout_s)") != std::string::npos);
  CHECK(s.stuck(kWorker0, -1, 1400).empty());  // reported (and killed) once
  CHECK(s.killed_stuck() == 1);
  s.started(kWorker0, 2000);                     // its restart: judged again
  CHECK(s.stuck(kWorker0, 2010, 2069).empty());  // beat 59 s ago
  CHECK(s.stuck(kWorker0, 2010, 2071).find("no heartbeat for 61 s (train.heartbeat_timeout_s)") != std::string::npos);
  CHECK(s.killed_stuck() == 2);
}

TEST_CASE("supervisor: a worker is restarted up to rollout.max_restarts, then the run restarts",
          "[launch][supervisor]") {
  Supervisor s(policy());
  s.begin_attempt(0, 0);
  CHECK(s.ended(kWorker0, {.ok = true}, {}).verdict == Verdict::keep_going);  // the hub had nothing more
  auto d = s.ended(kWorker0, killed(kWorker0), {});
  CHECK(d.verdict == Verdict::restart_role);
  CHECK(d.why.find("restarting it (1/2)") != std::string::npos);
  CHECK(s.ended(kWorker0, killed(kWorker0), {}).verdict == Verdict::restart_role);
  CHECK(s.worker_restarts() == 2);
  d = s.ended(kWorker0, killed(kWorker0), {});
  CHECK(d.verdict == Verdict::restart_run);
  CHECK(d.why.find("it was restarted 2 times (rollout.max_restarts)") != std::string::npos);
  // The run restarts once (train.max_restarts = 1), then gives up.
  d = s.after_attempt(d);
  CHECK(d.verdict == Verdict::restart_run);
  CHECK(d.why.find("restarting the run from its last checkpoint (1/1)") != std::string::npos);
  s.begin_attempt(1, 0);
  CHECK(s.worker_restarts() == 0);  // counted per attempt
  d = s.after_attempt(s.ended(kHub, killed(kHub), {}));
  CHECK(d.verdict == Verdict::give_up);
  CHECK(d.why.find("the run was restarted 1 times (train.max_restarts); stopping") != std::string::npos);
}

TEST_CASE("supervisor: a role that cannot run, or fails at start twice the same way, is hopeless",
          "[launch][supervisor]") {
  Supervisor s(policy());
  s.begin_attempt(0, 0);
  auto d = s.ended(kWorker0, cannot_run(kWorker0), {});
  CHECK(d.verdict == Verdict::give_up);
  CHECK(d.hopeless);
  CHECK(d.why == "worker 0 cannot run: env server cannot start");

  // The same error at start, twice in a row: no third try (a worker within an attempt).
  Supervisor w(policy());
  w.begin_attempt(0, 0);
  CHECK(w.ended(kWorker0, killed(kWorker0, true, "error: bad"), {}).verdict == Verdict::restart_role);
  d = w.ended(kWorker0, killed(kWorker0, true, "error: bad"), {});
  CHECK(d.verdict == Verdict::give_up);
  CHECK(d.why.find("failed at start twice with the same error") != std::string::npos);
  // Another cause is worth a restart.
  Supervisor w2(policy());
  w2.begin_attempt(0, 0);
  CHECK(w2.ended(kWorker0, killed(kWorker0, true, "error: a"), {}).verdict == Verdict::restart_role);
  CHECK(w2.ended(kWorker0, killed(kWorker0, true, "error: b"), {}).verdict == Verdict::restart_role);

  // The hub, across attempts: the second attempt fails as the first did.
  Supervisor h(policy());
  h.begin_attempt(0, 0);
  CHECK(h.ended(kHub, killed(kHub, true, "error: port"), {}).verdict == Verdict::restart_run);
  h.begin_attempt(1, 0);
  d = h.ended(kHub, killed(kHub, true, "error: port"), {});
  CHECK(d.verdict == Verdict::give_up);
  REQUIRE(h.failure());
  CHECK(h.failure()->id == kHub);
}

TEST_CASE("supervisor: a learner rank > 0 is restarted alone once a checkpoint exists; rank 0 restarts the run",
          "[launch][supervisor]") {
  Supervisor s(policy());
  s.begin_attempt(0, 0);
  const RunFacts ready{.has_checkpoint = true};
  CHECK(s.ended(kRank1, killed(kRank1), {}).verdict == Verdict::restart_run);  // no checkpoint yet
  auto d = s.ended(kRank1, killed(kRank1), ready);
  CHECK(d.verdict == Verdict::reform_learner);
  CHECK(d.why.find("restarting it alone: the learner group re-forms around it (1/1, train.max_restarts)") !=
        std::string::npos);
  CHECK(s.learner_rank_restarts() == 1);
  CHECK(s.ended(kRank1, killed(kRank1), ready).verdict == Verdict::restart_run);  // train.max_restarts spent
  Supervisor t(policy());
  t.begin_attempt(0, 0);
  CHECK(t.ended(kLead, killed(kLead), ready).verdict == Verdict::restart_run);
  CHECK(t.ended(kRank1, killed(kRank1), {.stopping = true, .has_checkpoint = true}).verdict == Verdict::restart_run);
  CHECK(t.ended(kRank1, killed(kRank1), {.lead_running = false, .has_checkpoint = true}).verdict ==
        Verdict::restart_run);
  CHECK(t.ended(kRank1, killed(kRank1), {.learner_done = true, .has_checkpoint = true}).verdict ==
        Verdict::restart_run);
  auto no_reform = policy();
  no_reform.learner_reform = false;
  Supervisor u(no_reform);
  u.begin_attempt(0, 0);
  CHECK(u.ended(kRank1, killed(kRank1), ready).verdict == Verdict::restart_run);
}

TEST_CASE("supervisor: the learner's end; asked to stop, a SIGTERM is a clean end", "[launch][supervisor]") {
  Supervisor s(policy());
  s.begin_attempt(0, 0);
  CHECK(s.ended(kLead, {.ok = true}, {}).verdict == Verdict::learner_done);
  RoleEnd term = killed(kLead);
  term.stop_signal = true;
  CHECK(s.ended(kLead, term, {.stopping = true}).verdict == Verdict::learner_done);
  CHECK(s.ended(kLead, term, {}).verdict == Verdict::restart_run);  // nobody asked it to stop
}

TEST_CASE("supervisor: scaling starts the lowest free workers and sends the newest away, within a deadline",
          "[launch][supervisor]") {
  auto plan = Supervisor::scale({}, {}, 3);
  CHECK(plan.start == std::vector<int>{0, 1, 2});
  CHECK(plan.leave.empty());
  // Worker 1 is gone, worker 3 is already leaving: two more wanted than the two active.
  plan = Supervisor::scale({true, false, true, true}, {false, false, false, true}, 4);
  CHECK(plan.start == std::vector<int>{1, 4});
  plan = Supervisor::scale({true, true, true}, {false, false, false}, 1);
  CHECK(plan.leave == std::vector<int>{2, 1});
  CHECK(plan.start.empty());

  Supervisor s(policy());
  s.begin_attempt(0, 0);
  s.asked_to_leave(2, 10);
  CHECK(s.leaving(2));
  CHECK_FALSE(s.leave_overdue(2, 110));
  CHECK(s.leave_overdue(2, 111));
  auto d = s.ended({Role::worker, 2}, {.ok = true, .how = "exit 0"}, {});
  CHECK(d.verdict == Verdict::worker_left);
  CHECK(d.why == "worker 2 left (clean)");
  CHECK_FALSE(s.leaving(2));
  // A worker that left is not a failure, even killed: nothing is restarted for it.
  s.asked_to_leave(1, 10);
  CHECK(s.ended({Role::worker, 1}, killed({Role::worker, 1}), {}).verdict == Verdict::worker_left);
  CHECK(s.worker_restarts() == 0);
}

TEST_CASE("supervisor: a stop has a deadline; quiet runs are reported every report_every_s", "[launch][supervisor]") {
  Supervisor s(policy());
  s.begin_attempt(0, 100);
  CHECK_FALSE(s.report_due(100, 129));
  CHECK(s.report_due(100, 131));
  CHECK_FALSE(s.report_due(100, 150));  // reported at 131
  CHECK(s.report_due(100, 162));
  CHECK_FALSE(s.report_due(170, 190));  // a step at 170
  CHECK_FALSE(s.stop_overdue(1000));
  s.stop_requested(1000);
  CHECK(s.stopping());
  CHECK_FALSE(s.report_due(100, 5000));  // nothing reported while stopping
  CHECK_FALSE(s.stop_overdue(1299));
  CHECK(s.stop_overdue(1300));
}
