// The gateway's endpoint; see rlx/serve/gateway.hpp. cpp-httplib serves HTTP on a loopback
// port of this host; the program's unix socket is bridged to it byte for byte (Debian 12's
// cpp-httplib 0.11 cannot listen on a unix socket). Only the bridge's socket is bound into a
// sandbox, whose network namespace has no interface: the program reaches nothing else.
#include "rlx/serve/gateway.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "rlx/core/error.hpp"
#include "rlx/core/json.hpp"
#include "serve/http_server.hpp"

namespace rlx::serve {
namespace {

using json = nlohmann::ordered_json;
constexpr int kMaxConnections = 8;

json error_body(const std::string& message) {
  return {{"error", {{"message", message}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", nullptr}}}};
}

}  // namespace

// A program's call waiting for its answer. Outside the anonymous namespace because
// Gateway::Impl holds it (GCC's -Wsubobject-linkage in unity builds).
namespace detail {
struct Call {
  json body;
  std::mutex mu;
  std::condition_variable cv;
  bool answered = false;
  int status = 0;
  json reply;

  void answer(int s, json b) {
    {
      std::lock_guard lock(mu);
      if (answered) return;
      answered = true;
      status = s;
      reply = std::move(b);
    }
    cv.notify_all();
  }
};
}  // namespace detail
using detail::Call;

namespace {

// Copies bytes both ways between two sockets until both sides are done or `stop` is set.
void relay(int a, int b, const std::atomic<bool>& stop) {
  char buf[16384];
  bool a_open = true, b_open = true;
  while (!stop && (a_open || b_open)) {
    pollfd fds[2] = {{a, static_cast<short>(a_open ? POLLIN : 0), 0}, {b, static_cast<short>(b_open ? POLLIN : 0), 0}};
    int n = ::poll(fds, 2, 100);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int from = i == 0 ? a : b, to = i == 0 ? b : a;
      ssize_t got = ::read(from, buf, sizeof buf);
      if (got <= 0) {
        (i == 0 ? a_open : b_open) = false;
        ::shutdown(to, SHUT_WR);
        continue;
      }
      for (ssize_t off = 0; off < got;) {
        ssize_t put = ::write(to, buf + off, static_cast<size_t>(got - off));
        if (put <= 0) {
          if (put < 0 && errno == EINTR) continue;
          return;
        }
        off += put;
      }
    }
  }
}

}  // namespace

// The program's requests: the bridge admits kMaxConnections, all from loopback; each must
// arrive whole within 30 s.
detail::ConnectionLimits connection_limits(const GatewayOptions& o) {
  return {.max_connections = kMaxConnections, .max_connections_per_peer = kMaxConnections, .max_body_bytes = o.max_body_bytes};
}

struct Gateway::Impl {
  explicit Impl(GatewayOptions o)
      : options(o), http(connection_limits(o), [](const httplib::Request& q, int status, const std::string& message) {
          if (status == 404) return error_body(fmt::format("the gateway serves POST /v1/chat/completions, not {} {}", q.method, q.path)).dump();
          return error_body(message).dump();
        }) {}

  std::filesystem::path socket_path;
  GatewayOptions options;
  detail::BoundedServer http;
  int port = -1;
  int listen_fd = -1;
  std::thread http_thread, bridge_thread;
  std::atomic<bool> stopping{false};
  // Shared with the detached relay threads, which may outlive this object by a moment.
  std::shared_ptr<std::atomic<bool>> relays_stop = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<int>> connections = std::make_shared<std::atomic<int>>(0);

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Call>> queue;
  std::shared_ptr<Call> current;

  void routes() {
    http.Get("/v1/models", [](const httplib::Request&, httplib::Response& r) {
      json m = {{"object", "list"}, {"data", json::array({{{"id", "policy"}, {"object", "model"}, {"created", 0}, {"owned_by", "rlx"}}})}};
      r.set_content(m.dump(), "application/json");
    });
    http.post("/v1/chat/completions", [this](const httplib::Request&, const std::string& body, httplib::Response& r) { handle(body, r); });
  }

  void handle(const std::string& body, httplib::Response& r) {
    auto call = std::make_shared<Call>();
    try {
      call->body = parse_json<json>(body, "the request body");
    } catch (const JsonError& e) {
      r.status = 400;
      r.set_content(error_body(e.what()).dump(), "application/json");
      return;
    }
    if (!call->body.is_object()) {
      r.status = 400;
      r.set_content(error_body("the request body must be a JSON object").dump(), "application/json");
      return;
    }
    if (auto s = call->body.find("stream"); s != call->body.end() && !s->is_null() && (!s->is_boolean() || s->get<bool>())) {
      r.status = 400;
      r.set_content(error_body("the gateway does not stream: call without 'stream'").dump(), "application/json");
      return;
    }
    {
      std::lock_guard lock(mu);
      if (current || !queue.empty()) {
        r.status = 409;
        r.set_content(error_body("the gateway serves one request at a time: wait for the answer first").dump(), "application/json");
        return;
      }
      queue.push_back(call);
    }
    cv.notify_all();
    std::unique_lock lock(call->mu);
    if (!call->cv.wait_for(lock, std::chrono::duration<double>(options.reply_timeout_s), [&] { return call->answered; })) {
      lock.unlock();
      call->answer(504, error_body("no answer in time"));
      lock.lock();
    }
    r.status = call->status;
    r.set_content(call->reply.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  void bridge_loop() {
    while (!stopping) {
      pollfd p{listen_fd, POLLIN, 0};
      int n = ::poll(&p, 1, 100);
      if (n <= 0) continue;
      int client = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      if (connections->load() >= kMaxConnections) {
        ::close(client);
        continue;
      }
      int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (upstream < 0 || ::connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        if (upstream >= 0) ::close(upstream);
        ::close(client);
        continue;
      }
      ++*connections;
      // Detached; the destructor stops the relays and waits a moment for them to close.
      std::thread([stop = relays_stop, live = connections, client, upstream] {
        relay(client, upstream, *stop);
        ::close(client);
        ::close(upstream);
        --*live;
      }).detach();
    }
  }
};

Gateway::Gateway(std::filesystem::path socket_path, GatewayOptions options) : impl_(std::make_unique<Impl>(options)) {
  Impl& s = *impl_;
  s.socket_path = std::move(socket_path);
  const std::string path = s.socket_path.string();
  sockaddr_un addr{};
  RLX_CHECK(path.size() < sizeof(addr.sun_path), "gateway socket path {} is longer than {} bytes", path, sizeof(addr.sun_path) - 1);
  std::filesystem::remove(s.socket_path);
  s.listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  RLX_CHECK(s.listen_fd >= 0, "gateway: socket(): {}", std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  RLX_CHECK(::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(s.listen_fd, 16) == 0,
            "gateway: cannot listen on {}: {}", path, std::strerror(errno));
  ::chmod(path.c_str(), 0666);  // the sandbox's user is another uid
  s.routes();
  s.port = s.http.bind_to_any_port("127.0.0.1");
  RLX_CHECK(s.port > 0, "gateway: cannot listen on a loopback port");
  s.http_thread = std::thread([&s] { s.http.listen_after_bind(); });
  s.bridge_thread = std::thread([&s] { s.bridge_loop(); });
  // httplib's stop() before its loop runs is lost (the loop would never end): the gateway
  // is ready, and can be destroyed, only once it runs.
  for (int i = 0; i < 500 && !s.http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  RLX_CHECK(s.http.is_running(), "gateway: the HTTP server did not start");
}

Gateway::~Gateway() {
  Impl& s = *impl_;
  reset();
  s.stopping = true;
  s.http.stop();
  if (s.http_thread.joinable()) s.http_thread.join();
  if (s.bridge_thread.joinable()) s.bridge_thread.join();
  *s.relays_stop = true;
  for (int i = 0; i < 50 && s.connections->load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::close(s.listen_fd);
  std::error_code ec;
  std::filesystem::remove(s.socket_path, ec);
}

std::optional<json> Gateway::next(double timeout_s, const std::function<bool()>& give_up) {
  Impl& s = *impl_;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::unique_lock lock(s.mu);
  while (s.queue.empty()) {
    if (give_up && give_up()) return std::nullopt;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    s.cv.wait_for(lock, std::chrono::milliseconds(20));
  }
  s.current = s.queue.front();
  s.queue.pop_front();
  return s.current->body;
}

void Gateway::reply(int status, const json& body) {
  Impl& s = *impl_;
  std::shared_ptr<Call> call;
  {
    std::lock_guard lock(s.mu);
    call = std::move(s.current);
    s.current.reset();
  }
  RLX_CHECK(call, "gateway: reply() without a request from next()");
  call->answer(status, body);
}

void Gateway::reset() {
  Impl& s = *impl_;
  std::deque<std::shared_ptr<Call>> dropped;
  {
    std::lock_guard lock(s.mu);
    dropped.swap(s.queue);
    if (s.current) dropped.push_back(std::move(s.current));
    s.current.reset();
  }
  for (auto& c : dropped) c->answer(503, error_body("the episode ended"));
}

const std::filesystem::path& Gateway::socket_path() const { return impl_->socket_path; }

}  // namespace rlx::serve
