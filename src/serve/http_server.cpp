// cpp-httplib with bounded requests and connections; see serve/http_server.hpp.
#include "serve/http_server.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rlx::serve::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kMaxHeaderBytes = 64 << 10;  // request line and headers
constexpr size_t kReceiveBytes = 16 << 10;
// Waits are cut into slices this long so that a stopping server is noticed.
constexpr int kSliceMs = 100;
// After an error that leaves part of a request unread, the rest is read and dropped this long
// before the socket is closed: closing with unread bytes would reset the connection, and the
// client could lose the answer.
constexpr auto kLinger = std::chrono::milliseconds(1000);
constexpr auto kRejectLinger = std::chrono::milliseconds(250);

int ms_until(Clock::time_point t) {
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, kSliceMs));
}

// Whether the peer may still read what we write: no error, no hang-up, no EOF (a client that
// closed its socket, or shut down its sending side). Data it sent ahead does not count.
bool peer_open(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  int r = ::poll(&p, 1, 0);
  if (r < 0) return errno == EINTR;
  if (r == 0) return true;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return false;
  char b;
  ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (r != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    port = ntohs(v6->sin6_port);
  }
  ip = text;
}

// One connection, as the thread that serves it sees it.
struct Connection {
  Connection(int fd, const ConnectionLimits& limits, const std::atomic<socket_t>& listener)
      : fd(fd), limits(limits), listener(listener), buf(kReceiveBytes) {
    address_of(fd, true, peer, peer_port);
    address_of(fd, false, local, local_port);
  }

  int fd;
  const ConnectionLimits& limits;
  const std::atomic<socket_t>& listener;  // INVALID_SOCKET once the server stops
  std::string peer, local;
  int peer_port = -1, local_port = -1;
  std::vector<char> buf;  // received and not yet read by httplib (a pipelined request's start)
  size_t off = 0, len = 0;

  // The request being read.
  Clock::time_point deadline;
  int64_t consumed = 0, cap = 0;  // its bytes read so far, and how many it may have
  bool in_body = false;           // its headers are read
  bool timed_out = false, over_limit = false;
  bool must_close = false;  // an answer left bytes unread, or a handler asked

  bool stopping() const { return listener.load() == INVALID_SOCKET; }

  // Waits for the first byte of the next request (keep-alive).
  bool wait_request() {
    if (off < len) return true;
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits.keep_alive_timeout_s));
    while (!stopping()) {
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, ms_until(until));
      if (r < 0 && errno != EINTR) return false;
      if (r > 0) return true;
      if (Clock::now() >= until) return false;
    }
    return false;
  }

  void begin_request() {
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits.request_read_timeout_s));
    consumed = 0;
    cap = kMaxHeaderBytes;
    in_body = timed_out = over_limit = false;
  }

  // More bytes into `buf`, by the request's deadline: > 0 bytes, 0 at EOF, -1 on an error,
  // the deadline or a stop.
  ssize_t receive() {
    while (true) {
      if (stopping()) return -1;
      if (Clock::now() >= deadline) {
        timed_out = true;
        return -1;
      }
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, ms_until(deadline));
      if (r < 0 && errno != EINTR) return -1;
      if (r <= 0) continue;
      ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) off = 0, len = static_cast<size_t>(n);
      return n;
    }
  }

  ssize_t read(char* out, size_t size) {
    if (off == len) {
      ssize_t n = receive();
      if (n <= 0) return n;
    }
    if (consumed >= cap) {
      over_limit = true;
      return -1;
    }
    size_t n = std::min({size, len - off, static_cast<size_t>(cap - consumed)});
    std::memcpy(out, buf.data() + off, n);
    off += n;
    consumed += static_cast<int64_t>(n);
    return static_cast<ssize_t>(n);
  }

  bool writable() const {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits.write_timeout_s));
    while (true) {  // a stopping server still writes its last answers
      pollfd p{fd, POLLOUT, 0};
      int r = ::poll(&p, 1, ms_until(until));
      if (r < 0 && errno != EINTR) return false;
      if (r > 0) return (p.revents & POLLOUT) && peer_open(fd);
      if (Clock::now() >= until) return false;
    }
  }

  ssize_t write(const char* data, size_t size) {
    if (!writable()) return -1;
    ssize_t n;
    do n = ::send(fd, data, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }

  void send_all(const std::string& bytes) {
    for (size_t at = 0; at < bytes.size();) {
      ssize_t n = write(bytes.data() + at, bytes.size() - at);
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
  }

  // Closes the socket; after `linger` > 0, first reads and drops what the client still sends
  // (until it closes too, or `linger` passes), so that the answer is not lost to a reset.
  void close(Clock::duration linger) {
    if (linger > Clock::duration::zero()) {
      ::shutdown(fd, SHUT_WR);
      const auto until = Clock::now() + linger;
      char drop[4096];
      while (Clock::now() < until && !stopping()) {
        pollfd p{fd, POLLIN, 0};
        int r = ::poll(&p, 1, ms_until(until));
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        if (::recv(fd, drop, sizeof drop, 0) <= 0) break;
      }
    }
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }
};

thread_local Connection* tl_connection = nullptr;

// httplib's Stream over a Connection, for one request.
class RequestStream final : public httplib::Stream {
 public:
  explicit RequestStream(Connection& c) : c_(c) {}
  bool is_readable() const override { return c_.off < c_.len || (!c_.stopping() && Clock::now() < c_.deadline); }
  bool is_writable() const override { return c_.writable(); }
  ssize_t read(char* ptr, size_t size) override { return c_.read(ptr, size); }
  ssize_t write(const char* ptr, size_t size) override { return c_.write(ptr, size); }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { ip = c_.peer, port = c_.peer_port; }
  void get_local_ip_and_port(std::string& ip, int& port) const override { ip = c_.local, port = c_.local_port; }
  socket_t socket() const override { return c_.fd; }

 private:
  Connection& c_;
};

// A thread per connection, started when one is needed, up to `max` (later connections wait
// for a thread); idle threads are reused.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max) : max_(max) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(fn));
      if (jobs_.size() > idle_ && threads_.size() < max_) threads_.emplace_back([this] { work(); });
    }
    cv_.notify_one();
  }

  // Runs the connections still queued, then joins (httplib enqueues nothing after it).
  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void work() {
    std::unique_lock lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [&] { return !jobs_.empty() || stop_; });
      --idle_;
      if (jobs_.empty()) return;
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

bool has_body_method(const std::string& m) { return m == "POST" || m == "PUT" || m == "PATCH"; }

// A Content-Length value: digits only, else nullopt.
std::optional<uint64_t> content_length(const std::string& v) {
  if (v.empty() || v.size() > 19 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoull(v);
}

}  // namespace

// Open connections, in all and per peer address.
struct BoundedServer::State {
  std::mutex mu;
  int64_t open = 0;
  std::unordered_map<std::string, int64_t> per_peer;
};

BoundedServer::BoundedServer(ConnectionLimits limits, ErrorFormat format)
    : limits_(limits), format_(std::move(format)), state_(std::make_shared<State>()) {
  set_payload_max_length(static_cast<size_t>(limits_.max_body_bytes));
  set_keep_alive_timeout(static_cast<time_t>(std::max(1.0, limits_.keep_alive_timeout_s)));
  new_task_queue = [n = static_cast<size_t>(limits_.max_connections) + 16] { return new ConnectionThreads(n); };

  // Headers are read: decide on the body before a byte of it is read.
  set_pre_routing_handler([this](const httplib::Request& q, httplib::Response& r) {
    Connection* c = tl_connection;
    if (!c) return HandlerResponse::Unhandled;
    c->in_body = true;
    // The body's own limit is exact (post() counts its bytes); this one bounds what httplib
    // reads by itself (unknown paths) and the chunked framing around the bytes.
    c->cap = c->consumed + 2 * limits_.max_body_bytes + kMaxHeaderBytes;
    auto reject = [&](int status, const std::string& message) {
      r.status = status;
      r.set_header("Connection", "close");
      r.set_content(format_(q, status, message), "application/json");
      c->must_close = true;
      return HandlerResponse::Handled;
    };
    const bool chunked = ::strcasecmp(q.get_header_value("Transfer-Encoding").c_str(), "chunked") == 0;
    if (q.has_header("Content-Length")) {
      auto n = content_length(q.get_header_value("Content-Length"));
      if (!n) return reject(400, fmt::format("Content-Length {:?} is not a number of bytes", q.get_header_value("Content-Length")));
      if (*n > static_cast<uint64_t>(limits_.max_body_bytes))
        return reject(413, fmt::format("the request body is over {} bytes (Content-Length {})", limits_.max_body_bytes, *n));
    } else if (has_body_method(q.method) && !chunked) {
      return reject(411, fmt::format("{} needs a Content-Length or a chunked body", q.method));
    }
    return HandlerResponse::Unhandled;
  });

  // A connection that closes after this answer says so, and only so (httplib adds Keep-Alive
  // unless it closes for a reason of its own).
  set_post_routing_handler([](const httplib::Request&, httplib::Response& r) {
    Connection* c = tl_connection;
    if (!c || !c->must_close) return;
    r.headers.erase("Keep-Alive");
    r.headers.erase("Connection");
    r.set_header("Connection", "close");
  });

  // Errors httplib answers itself, and those of reads cut short by a limit.
  set_error_handler([this](const httplib::Request& q, httplib::Response& r) {
    Connection* c = tl_connection;
    std::string message;
    if (c && c->timed_out) {
      r.status = 408;
      message = fmt::format("the request did not arrive within {} s", limits_.request_read_timeout_s);
    } else if (c && c->over_limit) {
      r.status = c->in_body ? 413 : 431;
      message = c->in_body ? fmt::format("the request body is over {} bytes", limits_.max_body_bytes)
                           : fmt::format("the request line and headers are over {} bytes", kMaxHeaderBytes);
    } else if (!r.body.empty()) {
      return;
    } else {
      message = r.status == 413   ? fmt::format("the request body is over {} bytes", limits_.max_body_bytes)
                : r.status == 404 ? fmt::format("no route {} {}", q.method, q.path)
                                  : fmt::format("HTTP {}", r.status);
    }
    if (c && (c->timed_out || c->over_limit || r.status == 400)) {
      c->must_close = true;  // the rest of the request is unread, or unreadable
      r.set_header("Connection", "close");
    }
    r.set_content(format_(q, r.status, message), "application/json");
  });
}

BoundedServer::~BoundedServer() = default;

void BoundedServer::post(const std::string& pattern, BodyHandler handler) {
  Post(pattern, [this, handler = std::move(handler)](const httplib::Request& q, httplib::Response& r, const httplib::ContentReader& read) {
    std::string body;
    bool over = false;
    bool ok = read([&](const char* data, size_t n) {
      if (body.size() + n > static_cast<size_t>(limits_.max_body_bytes)) {
        over = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    Connection* c = tl_connection;
    if (!ok || over) {
      if (c) c->must_close = true;
      r.set_header("Connection", "close");
      if (over || (c && c->over_limit)) {
        r.status = 413;
        r.set_content(format_(q, 413, fmt::format("the request body is over {} bytes", limits_.max_body_bytes)), "application/json");
      } else if (c && c->timed_out) {
        r.status = 408;
        r.set_content(format_(q, 408, fmt::format("the request did not arrive within {} s", limits_.request_read_timeout_s)), "application/json");
      } else {
        r.status = 400;
        r.set_content(format_(q, 400, "the request body could not be read (the connection ended, or bad chunked framing)"), "application/json");
      }
      return;
    }
    if (c) c->cap = c->consumed;  // the request is read: nothing more belongs to it
    handler(q, body, r);
  });
}

bool BoundedServer::client_connected() {
  Connection* c = tl_connection;
  return !c || peer_open(c->fd);
}

void BoundedServer::close_after_response() {
  if (Connection* c = tl_connection) c->must_close = true;
}

bool BoundedServer::process_and_close_socket(socket_t sock) {
  Connection c(sock, limits_, svr_sock_);
  std::string refusal;
  int refusal_status = 0;
  {
    std::lock_guard lock(state_->mu);
    int64_t& mine = state_->per_peer[c.peer];
    if (state_->open >= limits_.max_connections) {
      refusal_status = 503;
      refusal = fmt::format("the server has {} connections open, its limit; retry later", state_->open);
    } else if (mine >= limits_.max_connections_per_peer) {
      refusal_status = 429;
      refusal = fmt::format("{} has {} connections open, the limit per address; retry later", c.peer, mine);
    } else {
      ++state_->open;
      ++mine;
    }
    if (refusal_status && mine == 0) state_->per_peer.erase(c.peer);
  }
  if (refusal_status) {
    std::string body = format_(httplib::Request{}, refusal_status, refusal);
    c.send_all(fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n"
                           "Retry-After: 1\r\n\r\n{}",
                           refusal_status, refusal_status == 503 ? "Service Unavailable" : "Too Many Requests", body.size(), body));
    c.close(kRejectLinger);
    return false;
  }

  tl_connection = &c;
  bool ret = false;
  for (size_t left = keep_alive_max_count_; left > 0 && !c.stopping(); --left) {
    if (!c.wait_request()) break;
    c.begin_request();
    RequestStream stream(c);
    bool closed = false;
    ret = process_request(stream, left == 1, closed, nullptr);
    if (!ret || closed || c.must_close) break;
  }
  tl_connection = nullptr;
  {
    std::lock_guard lock(state_->mu);
    --state_->open;
    if (--state_->per_peer[c.peer] == 0) state_->per_peer.erase(c.peer);
  }
  c.close(c.must_close ? Clock::duration(kLinger) : Clock::duration::zero());
  return ret;
}

}  // namespace rlx::serve::detail
