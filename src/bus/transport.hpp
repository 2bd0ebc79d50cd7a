// ZeroMQ plumbing of the bus (private to src/bus): one process-wide context, socket
// settings every bus socket gets, CURVE set-up, and the ZAP handler that admits listed
// client keys.
#pragma once

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <memory>
#include <chrono>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <thread>

#include "rlx/bus/channel.hpp"
#include "rlx/bus/message.hpp"

namespace rlx::bus::detail {

// The context of the process's bus sockets (inproc:// endpoints need one shared context).
zmq::context_t& shared_context();

// The file of a bound ipc:// endpoint (ZeroMQ leaves it behind when the socket closes),
// removed when this goes, unless a later bind of the same path has made a new file there.
// Bind first, then make this: it records the file's identity.
class IpcFile {
 public:
  explicit IpcFile(const std::string& endpoint);
  ~IpcFile();
  IpcFile(const IpcFile&) = delete;
  IpcFile& operator=(const IpcFile&) = delete;

 private:
  std::string path_;
  uint64_t dev_ = 0, ino_ = 0;
};

// zmq::poll that returns false when a signal interrupted it (EINTR; a SIGTERM handler
// sets a flag the caller checks) instead of throwing.
bool poll(zmq::pollitem_t* items, size_t n, std::chrono::milliseconds timeout);

// LINGER 0, bounded queues (HWM) and ZMQ_MAXMSGSIZE = header + the frame limit.
void configure_socket(zmq::socket_t& socket, const Limits& limits, int hwm);
// CURVE server with the hub's key; ZAP domain "rlx" so the handler is consulted.
void make_curve_server(zmq::socket_t& socket, const CurveOptions& curve);
void make_curve_client(zmq::socket_t& socket, const CurveOptions& curve);

// Answers ZAP requests on inproc://zeromq.zap.01 of `context`: CURVE clients whose
// public key is listed pass, everything else is refused. One per context.
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& context, std::set<std::string> allowed_z85);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;
  uint64_t accepted() const { return accepted_; }
  uint64_t refused() const { return refused_; }

 private:
  void serve();
  zmq::socket_t socket_;
  std::set<std::string> allowed_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0}, refused_{0};
  std::thread thread_;
};

inline double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sends without blocking; false when the peer is gone or its queue is full.
bool try_send(zmq::socket_t& socket, const std::string& frame);
// Without copying a large frame (ZeroMQ holds a reference until it is written).
bool try_send(zmq::socket_t& socket, std::shared_ptr<const std::string> frame);
// Bytes kept alive by their owner (a received message, a packed string).
struct SharedBytes {
  std::shared_ptr<const char> data;
  size_t size = 0;
};
// [routing id, frame, more...] as one message; `more` goes without a copy.
bool try_send_to(zmq::socket_t& router, const std::string& routing_id, std::string frame, std::span<const SharedBytes> more = {});

}  // namespace rlx::bus::detail
