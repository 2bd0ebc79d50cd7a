// cpp-httplib's server with the bounds its version 0.11 (Debian 12's) lacks, for `rlx serve`
// and the gateway. httplib alone reads a chunked body, a body without a length, a header line
// or an endless list of headers whole, however large; restarts its read timeout with every
// byte (so a client trickling one byte every few seconds holds a thread for ever); and serves
// connections from a fixed pool, so such clients starve every other request, /health
// included. Here:
//
//   - every request (request line, headers, body) must arrive within
//     `request_read_timeout_s` of its first byte, or it is answered 408 and the connection
//     closed;
//   - a body over `max_body_bytes` is answered 413 whatever its framing (a Content-Length
//     over it before a byte of the body is read; a chunked one as soon as it passes it), and
//     headers over 64 KiB 431; the connection is then closed;
//   - at most `max_connections` connections are open, `max_connections_per_peer` of them
//     from one address; one more is answered 503 (or 429 for the peer) and closed. Each open
//     connection has its own thread, so slow clients under those limits cost threads, not
//     the answers of the others;
//   - a handler can ask whether its client is still connected (client_connected()), so
//     work for a client that left can stop.
//
// The Post handlers get the body read under these bounds (`body`), not Request::body.
//
//   rlx::serve::detail::BoundedServer http({.max_body_bytes = 1 << 20}, format_error);
//   http.post("/v1/x", [](const httplib::Request& q, const std::string& body, httplib::Response& r) { ... });
//   http.Get("/health", ...);
//   int port = http.bind_to_any_port("127.0.0.1");
//   http.listen_after_bind();
#pragma once

#include <httplib.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace rlx::serve::detail {

struct ConnectionLimits {
  int64_t max_connections = 192;           // open connections; one more: 503
  int64_t max_connections_per_peer = 96;   // open connections from one address; one more: 429
  int64_t max_body_bytes = 4 << 20;        // a larger body: 413
  double request_read_timeout_s = 30;      // a whole request, from its first byte; later: 408
  double keep_alive_timeout_s = 2;         // an idle connection waits this long for its next request
  double write_timeout_s = 30;             // a response write that cannot proceed this long fails
};

// The JSON body of an error this layer answers itself (limits, 404s); `request` is empty
// when it was never read.
using ErrorFormat = std::function<std::string(const httplib::Request& request, int status, const std::string& message)>;

class BoundedServer : public httplib::Server {
 public:
  using BodyHandler = std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;

  BoundedServer(ConnectionLimits limits, ErrorFormat format);
  ~BoundedServer() override;

  // POST `pattern`: `handler` gets the body, read whole under the limits (the bad ones are
  // answered before it runs).
  void post(const std::string& pattern, BodyHandler handler);

  // On a handler's thread: false once its client has closed the connection (or its sending
  // side) or the connection failed. Always true on other threads.
  static bool client_connected();
  // On a handler's thread: the connection closes after this response.
  static void close_after_response();

  const ConnectionLimits& limits() const { return limits_; }

 private:
  struct State;
  // httplib's per-connection entry point (SSLServer overrides it too): our keep-alive loop
  // over our bounded stream.
  bool process_and_close_socket(socket_t sock) override;

  ConnectionLimits limits_;
  ErrorFormat format_;
  std::shared_ptr<State> state_;
};

}  // namespace rlx::serve::detail
