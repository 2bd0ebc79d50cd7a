#include "rlx/serve/metrics_endpoint.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

namespace {
// GET over a plain socket: the reply's bytes.
std::string http_get(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}
}  // namespace

TEST_CASE("metrics: a metrics line as Prometheus gauges", "[serve]") {
  nlohmann::json line = {{"step", 7},     {"reward_mean", 0.25}, {"busy_learner", 0.5}, {"finish", "stop"},
                         {"nan", std::nan("")}, {"ok", true},   {"errors", {{"infra", 2}}}, {"tokens/s", 10}};
  std::string text = rlx::serve::prometheus_gauges(line, "rlx_");
  CHECK_THAT(text, Catch::Contains("# TYPE rlx_step gauge\nrlx_step 7\n"));
  CHECK_THAT(text, Catch::Contains("rlx_reward_mean 0.25\n"));
  CHECK_THAT(text, Catch::Contains("rlx_errors_infra 2\n"));
  CHECK_THAT(text, Catch::Contains("rlx_tokens_s 10\n"));
  CHECK_THAT(text, Catch::Contains("rlx_ok 1\n"));
  CHECK_THAT(text, !Catch::Contains("finish") && !Catch::Contains("nan"));
}

TEST_CASE("metrics: the endpoint answers GET /metrics with the body of the moment", "[serve]") {
  int calls = 0;
  rlx::serve::MetricsEndpoint m("127.0.0.1", 0, [&] { return "rlx_calls " + std::to_string(++calls) + "\n"; });
  REQUIRE(m.port() > 0);
  std::string first = http_get(m.port(), "/metrics");
  CHECK_THAT(first, Catch::StartsWith("HTTP/1.1 200") && Catch::Contains("text/plain; version=0.0.4") && Catch::EndsWith("rlx_calls 1\n"));
  CHECK_THAT(http_get(m.port(), "/metrics"), Catch::EndsWith("rlx_calls 2\n"));
  CHECK_THAT(http_get(m.port(), "/nope"), Catch::StartsWith("HTTP/1.1 404"));
  CHECK_THROWS_WITH(rlx::serve::MetricsEndpoint("127.0.0.1", m.port(), [] { return std::string(); }), Catch::Contains("cannot listen"));
}
