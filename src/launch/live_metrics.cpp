#include "live_metrics.hpp"

#include <iostream>

#include <fmt/format.h>

#include "rlx/core/clock.hpp"
#include "rlx/launch/supervisor.hpp"

namespace rlx::launch {

std::string prometheus_text(const LiveState& s, int64_t steps, double now) {
  std::string out = serve::prometheus_gauges(s.line, "rlx_");
  out += fmt::format("# TYPE rlx_up gauge\nrlx_up 1\n# TYPE rlx_train_steps gauge\nrlx_train_steps {}\n", steps);
  out += fmt::format("# TYPE rlx_attempt gauge\nrlx_attempt {}\n", s.attempt);
  out += fmt::format("# TYPE rlx_seconds_since_step gauge\nrlx_seconds_since_step {:.3f}\n", now - s.last_step_at);
  // Errors by kind, from the launcher's side (the hub's kinds are in the line, rlx_errors_*).
  out += fmt::format("# TYPE rlx_errors_worker_restarts counter\nrlx_errors_worker_restarts {}\n", s.worker_restarts);
  out += fmt::format("# TYPE rlx_errors_killed_stuck counter\nrlx_errors_killed_stuck {}\n", s.killed_stuck);
  out += fmt::format("# TYPE rlx_errors_learner_rank_restarts counter\nrlx_errors_learner_rank_restarts {}\n",
                     s.rank_restarts);
  out += fmt::format("# TYPE rlx_errors_run_restarts counter\nrlx_errors_run_restarts {}\n", s.attempt);
  return out;
}

LiveMetrics::LiveMetrics(const RunConfig& cfg) {
  if (cfg.log.metrics_port <= 0) return;
  shared_->state.last_step_at = now_s();
  endpoint_.emplace(cfg.log.metrics_host, cfg.log.metrics_port, [shared = shared_, steps = cfg.train.steps] {
    std::lock_guard lock(shared->mu);
    return prometheus_text(shared->state, steps, now_s());
  });
  std::cerr << fmt::format("rlx run: live metrics on http://{}:{}/metrics", cfg.log.metrics_host, endpoint_->port())
            << std::endl;
}

void LiveMetrics::update(const nlohmann::json& line, double last_step_at, uint32_t attempt, const Supervisor& sup) {
  if (!endpoint_) return;
  std::lock_guard lock(shared_->mu);
  auto& s = shared_->state;
  if (!line.is_null()) s.line = line;
  s.last_step_at = last_step_at;
  if (s.attempt != attempt)
    shared_->earlier_restarts = s.worker_restarts, shared_->earlier_stuck = s.killed_stuck,
    shared_->earlier_ranks = s.rank_restarts;
  s.attempt = attempt;
  s.worker_restarts = shared_->earlier_restarts + sup.worker_restarts();
  s.killed_stuck = shared_->earlier_stuck + sup.killed_stuck();
  s.rank_restarts = shared_->earlier_ranks + sup.learner_rank_restarts();
}

}  // namespace rlx::launch
