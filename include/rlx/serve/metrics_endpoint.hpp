// Live metrics: Prometheus text over HTTP, for a long run that Grafana or `curl` watches.
// `rlx run` serves its latest metrics line on log.metrics_port.
//
//   rlx::serve::MetricsEndpoint m("127.0.0.1", 9400, [&] { return rlx::serve::prometheus_gauges(line, "rlx_"); });
//   // curl 127.0.0.1:9400/metrics  ->  # TYPE rlx_reward_mean gauge\nrlx_reward_mean 0.43\n...
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace rlx::serve {

// The numbers (and booleans) of a JSON object as Prometheus gauges named PREFIX + key, nested
// objects as PREFIX + outer_inner, characters outside [a-zA-Z0-9_:] as '_'; non-finite
// numbers and other values are left out.
std::string prometheus_gauges(const nlohmann::json& values, std::string_view prefix);

class MetricsEndpoint {
 public:
  // Serves GET /metrics (text/plain; version=0.0.4) with what `body` returns, called on the
  // HTTP thread. Port 0: any free port. Throws rlx::Error when it cannot listen.
  MetricsEndpoint(const std::string& host, int port, std::function<std::string()> body);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlx::serve
