// Prometheus text over cpp-httplib; see rlx/serve/metrics_endpoint.hpp.
#include "rlx/serve/metrics_endpoint.hpp"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "rlx/core/error.hpp"
#include "serve/port_check.hpp"

namespace rlx::serve {
namespace {

std::string metric_name(std::string_view prefix, const std::string& key) {
  std::string out(prefix);
  for (char c : key) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':') ? c : '_';
  return out;
}

void gauges(std::string& out, const nlohmann::json& j, const std::string& prefix) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_object()) {
      gauges(out, *it, metric_name(prefix, it.key()) + "_");
      continue;
    }
    if (!it->is_number() && !it->is_boolean()) continue;
    const double v = it->is_boolean() ? (it->get<bool>() ? 1.0 : 0.0) : it->get<double>();
    if (!std::isfinite(v)) continue;
    const std::string name = metric_name(prefix, it.key());
    out += fmt::format("# TYPE {} gauge\n{} {}\n", name, name, v);
  }
}

}  // namespace

std::string prometheus_gauges(const nlohmann::json& values, std::string_view prefix) {
  std::string out;
  if (values.is_object()) gauges(out, values, std::string(prefix));
  return out;
}

struct MetricsEndpoint::Impl {
  httplib::Server http;
  std::thread thread;
  int port = -1;
};

MetricsEndpoint::MetricsEndpoint(const std::string& host, int port, std::function<std::string()> body)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.http.set_keep_alive_timeout(2);
  s.http.Get("/metrics", [body = std::move(body)](const httplib::Request&, httplib::Response& r) {
    r.set_content(body(), "text/plain; version=0.0.4");
  });
  if (port != 0)
    if (auto why = detail::port_unavailable(host, port); !why.empty())
      RLX_CHECK(false, "metrics: cannot listen on {}:{}: {}", host, port, why);
  s.port = port == 0 ? s.http.bind_to_any_port(host) : (s.http.bind_to_port(host, port) ? port : -1);
  RLX_CHECK(s.port > 0, "metrics: cannot listen on {}:{} (in use, or not an address of this machine)", host, port);
  s.thread = std::thread([&s] { s.http.listen_after_bind(); });
  // httplib's stop() before its loop runs is lost: ready means running.
  for (int i = 0; i < 500 && !s.http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  RLX_CHECK(s.http.is_running(), "metrics: the HTTP server did not start");
}

MetricsEndpoint::~MetricsEndpoint() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int MetricsEndpoint::port() const { return impl_->port; }

}  // namespace rlx::serve
