// The launcher's live metrics (log.metrics_port): the latest step's line and the run's state
// as Prometheus gauges on http://HOST:PORT/metrics, updated by the watch loop (launcher.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "rlx/launch/config.hpp"
#include "rlx/serve/metrics_endpoint.hpp"

namespace rlx::launch {

class Supervisor;

// What the endpoint shows.
struct LiveState {
  nlohmann::json line;      // the latest step's metrics line (null before the first)
  double last_step_at = 0;  // now_s() of the latest step
  uint32_t attempt = 0;
  uint64_t worker_restarts = 0, killed_stuck = 0, rank_restarts = 0;  // over every attempt of this launcher
};
// The endpoint's text at `now` (now_s()); `steps`: train.steps.
std::string prometheus_text(const LiveState& s, int64_t steps, double now);

class LiveMetrics {
 public:
  // Serves when log.metrics_port > 0 (and says where on stderr); otherwise does nothing.
  explicit LiveMetrics(const RunConfig& cfg);
  // After each watch round: `line` the latest step's (null: none yet), the supervisor's
  // counts of this attempt.
  void update(const nlohmann::json& line, double last_step_at, uint32_t attempt, const Supervisor& sup);

 private:
  struct Shared {
    std::mutex mu;
    LiveState state;
    uint64_t earlier_restarts = 0, earlier_stuck = 0, earlier_ranks = 0;  // of the attempts before this one
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::optional<serve::MetricsEndpoint> endpoint_;
};

}  // namespace rlx::launch
