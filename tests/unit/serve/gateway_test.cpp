#include "rlx/serve/gateway.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "../helpers.hpp"

// The gateway as a sandboxed program reaches it: HTTP over its unix socket. What the program
// sends is hostile input too: malformed bodies get a 400 or 413 and never reach the caller.

using json = nlohmann::ordered_json;

namespace {

std::string http_exchange(const std::filesystem::path& socket, const std::string& request) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{.tv_sec = 30, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, socket.c_str(), sizeof a.sun_path - 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  std::thread sender([&] {  // sent while the answer is read: a refusal may come before the end
    for (size_t at = 0; at < request.size();) {
      ssize_t n = ::send(fd, request.data() + at, request.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
  });
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  sender.join();
  ::close(fd);
  return out;
}

std::string post(const std::string& body) {
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

int status_of(const std::string& reply) { return reply.rfind("HTTP/1.1 ", 0) == 0 ? std::stoi(reply.substr(9, 3)) : 0; }

}  // namespace

TEST_CASE("gateway: deep, out-of-range and oversized bodies are refused before the caller sees them", "[serve]") {
  rlx::test::TempDir dir;
  rlx::serve::Gateway gw(dir / "gw.sock", {.max_body_bytes = 256 << 10});
  const std::string deep = std::string(50000, '[') + std::string(50000, ']');
  std::string r = http_exchange(gw.socket_path(), post(R"({"model": "policy", "messages": )" + deep + "}"));
  CHECK(status_of(r) == 400);
  CHECK_THAT(r, Catch::Contains("nested deeper than 128"));
  r = http_exchange(gw.socket_path(), post(R"({"model": "policy", "messages": [], "temperature": 1e999})"));
  CHECK(status_of(r) == 400);
  CHECK_THAT(r, Catch::Contains("out of range"));
  std::string chunked = "POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 64; ++i) chunked += "4000\r\n" + std::string(0x4000, 'x') + "\r\n";
  chunked += "0\r\n\r\n";
  r = http_exchange(gw.socket_path(), chunked);
  CHECK(status_of(r) == 413);
  CHECK_FALSE(gw.next(0.2, nullptr).has_value());  // none of them came through

  // A good request still does.
  std::thread program([&] { r = http_exchange(gw.socket_path(), post(R"({"model": "policy", "messages": [{"role": "user", "content": "hi"}]})")); });
  auto call = gw.next(30, nullptr);
  REQUIRE(call.has_value());
  CHECK((*call)["messages"][0]["content"] == "hi");
  gw.reply(200, json{{"ok", true}});
  program.join();
  CHECK(status_of(r) == 200);
}
