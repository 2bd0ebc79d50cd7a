// Weight sync by collective broadcast: the subscriber (weight_broadcast.hpp); the control protocol is in broadcast_control.hpp.
#include "rlx/dist/weight_broadcast.hpp"

#include "bus/transport.hpp"

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dist/broadcast_control.hpp"
#include "dist/layout_json.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/rendezvous.hpp"

namespace rlx::dist {

using nlohmann::json;
using namespace broadcast;

// --- subscriber --------------------------------------------------------------------

struct BroadcastWeightSubscriber::Impl {
  BroadcastSyncOptions o;
  std::string endpoint, id;
  zmq::context_t ctx{1};
  zmq::socket_t control{ctx, zmq::socket_type::dealer};
  std::thread receiver, beater;
  std::atomic<bool> stop{false}, rejoin{false};

  std::mutex mu;  // everything below
  std::condition_variable cv;
  bool welcomed = false;
  std::string failure;  // what ended the receiver early
  std::string moved_to;  // the endpoint file names a new publisher (it restarted): where
  bool replaced = false;  // it moved, and poll() has not handed over a version since: any is taken
  WeightLayout layout;
  uint64_t hash = 0;
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::array<at::Tensor, 2> buffers;
  int current = 0;
  bool spare_ready = false;
  int64_t spare_version = 0, version = 0;
  std::atomic<int64_t> generation{0};
  std::unique_ptr<Communicator> comm;  // the receiver's

  void hello() { send_text(control, {{"type", "hello"}, {"id", id}}, zmq::send_flags::none); }

  // The endpoint the file names now, when it differs from `current` (a publisher that
  // restarted listens elsewhere); empty otherwise, or when there is no file.
  std::string moved(const std::string& current) const {
    if (o.endpoint_file.empty()) return {};
    try {
      std::error_code ec;
      if (!std::filesystem::exists(o.endpoint_file, ec)) return {};
      auto text = read_file(o.endpoint_file, 4096);
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
      return text.starts_with("tcp://") && text != current ? text : std::string();
    } catch (const std::exception&) {
      return {};  // being replaced: read again at the next beat
    }
  }

  void beat() {
    std::string at = endpoint;
    auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
    s->set(zmq::sockopt::linger, 0);
    s->connect(at);
    while (!stop) {
      if (auto next = moved(at); !next.empty()) {
        log::info("weight broadcast: the publisher moved from {} to {}: following it", at, next);
        at = next;
        s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
        s->set(zmq::sockopt::linger, 0);
        s->connect(at);
        std::lock_guard lock(mu);
        moved_to = at;
      }
      send_text(*s, {{"type", "beat"}, {"id", id}});
      zmq::pollitem_t item{s->handle(), 0, ZMQ_POLLIN, 0};
      if (!bus::detail::poll(&item, 1, std::chrono::milliseconds(static_cast<int64_t>(o.heartbeat_s * 1000)))) item.revents = 0;  // EINTR: a signal for the process
      zmq::message_t m;
      while (s->recv(m, zmq::recv_flags::dontwait)) {
        const auto j = parse(m);
        if (!j.is_discarded() && j.value("type", std::string()) == "rejoin") rejoin = true;
      }
    }
  }

  // A new publisher: a new control socket, no group, and its next version taken whatever
  // its number (a learner resumed from an earlier checkpoint publishes an older one).
  void follow(const std::string& to) {
    control = zmq::socket_t(ctx, zmq::socket_type::dealer);
    control.set(zmq::sockopt::linger, 0);
    control.set(zmq::sockopt::maxmsgsize, kMaxControlBytes);
    control.connect(to);
    comm.reset();
    {
      std::lock_guard lock(mu);
      endpoint = to;
      replaced = true;
    }
    hello();
  }

  void join(const json& j) {
    comm.reset();
    RendezvousOptions ro;
    const auto store = j.value("store", std::string());
    const auto colon = store.rfind(':');
    if (colon == std::string::npos) return;
    ro.rank = j.value("rank", -1);
    ro.world_size = j.value("world", 0);
    ro.store_host = store.substr(0, colon);
    ro.store_port = std::atoi(store.substr(colon + 1).c_str());
    ro.prefix = j.value("prefix", std::string());
    ro.nccl = j.value("nccl", false);
    ro.interface_host = interface_of(o);
    ro.timeout_s = ro.connect_timeout_s = o.timeout_s;
    try {
      comm = connect(ro);
      generation = j.value("generation", int64_t{0});
    } catch (const Error& e) {
      log::warn("weight broadcast: joining generation {} failed: {}", j.value("generation", int64_t{0}), e.what());
      comm.reset();
    }
  }

  void receive(const json& j) {
    if (!comm || j.value("generation", int64_t{-1}) != generation || j.value("layout_hash", uint64_t{0}) != hash) return;
    const auto v = j.value("version", int64_t{0});
    const auto& list = j.contains("buckets") ? j["buckets"] : json();
    if (!list.is_array()) return;
    // Every member takes part in every broadcast of its generation (a collective), even of
    // a version it has: the publisher sends a version again after re-forming the group.
    int target;
    {
      std::lock_guard lock(mu);
      target = 1 - current;  // the spare: poll() hands it over only once it is whole
      spare_ready = false;
    }
    auto& buf = buffers[static_cast<size_t>(target)];
    try {
      size_t k = 0;
      for (const auto& b : list) {
        ++k;
        const auto offset = b.at(0).get<int64_t>(), bytes = b.at(1).get<int64_t>();
        RLX_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= buf.numel(), "bucket [{}, +{}) outside {} bytes",
                  offset, bytes, buf.numel());
        comm->broadcast(buf.narrow(0, offset, bytes), 0, fmt::format("weights v{} bucket {} of {}", v, k, list.size()))
            ->wait();
      }
    } catch (const std::exception& e) {
      log::warn("weight broadcast: receiving version {} failed ({}); waiting for the next generation", v, e.what());
      comm.reset();
      return;
    }
    std::lock_guard lock(mu);
    spare_version = v;
    spare_ready = v > version || replaced;
  }

  void run() {
    try {
      use_buffers_device(o);
      hello();
      while (!stop) {
        std::string to;
        {
          std::lock_guard lock(mu);
          to.swap(moved_to);
        }
        if (!to.empty()) follow(to);
        if (rejoin.exchange(false)) hello();
        zmq::pollitem_t item{control.handle(), 0, ZMQ_POLLIN, 0};
        if (!bus::detail::poll(&item, 1, std::chrono::milliseconds(kPollMs))) item.revents = 0;  // EINTR: a signal for the process
        zmq::message_t m;
        if (!control.recv(m, zmq::recv_flags::dontwait)) continue;
        const auto j = parse(m);
        if (j.is_discarded()) continue;
        const auto type = j["type"].get<std::string>();
        if (type == "welcome") {
          const auto l = layout_from_json(j.at("layout"));
          std::lock_guard lock(mu);
          if (welcomed) {
            RLX_CHECK(layout_hash(l) == hash, "the publisher at {} changed its layout", endpoint);
            continue;
          }
          layout = l;
          hash = layout_hash(l);
          spans = layout.spans();
          const auto device = at::Device(o.device);
          for (auto& b : buffers) b = at::empty({layout.bytes()}, at::TensorOptions().dtype(at::kByte).device(device));
          welcomed = true;
          cv.notify_all();
        } else if (type == "join") {
          join(j);
        } else if (type == "version") {
          receive(j);
        }
      }
    } catch (const std::exception& e) {
      std::lock_guard lock(mu);
      failure = e.what();
      cv.notify_all();
    }
  }
};

BroadcastWeightSubscriber::BroadcastWeightSubscriber(BroadcastSyncOptions options) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.o = std::move(options);
  RLX_CHECK(I.o.attach_timeout_s > 0 && I.o.heartbeat_s > 0 && I.o.timeout_s > 0,
            "weight broadcast: attach_timeout_s, heartbeat_s and timeout_s must be > 0");
  if (!I.o.endpoint.empty()) {
    I.endpoint = I.o.endpoint;
  } else {
    RLX_CHECK(!I.o.endpoint_file.empty(), "weight broadcast: a subscriber needs an endpoint or an endpoint file");
    I.endpoint = wait_endpoint_file(I.o.endpoint_file, I.o.attach_timeout_s);
  }
  I.id = fmt::format("{}-{}-{:x}", host_name(), ::getpid(), reinterpret_cast<uintptr_t>(this));
  I.control.set(zmq::sockopt::linger, 0);
  I.control.set(zmq::sockopt::maxmsgsize, kMaxControlBytes);
  I.control.connect(I.endpoint);
  I.receiver = std::thread([&I] { I.run(); });
  I.beater = std::thread([&I] { I.beat(); });
  std::unique_lock lock(I.mu);
  const double deadline = now_s() + I.o.attach_timeout_s;
  bool gave_up = false;
  while (!I.welcomed && I.failure.empty() && now_s() < deadline && !gave_up) {
    I.cv.wait_for(lock, std::chrono::milliseconds(50));
    gave_up = I.o.give_up && I.o.give_up();
  }
  if (!I.welcomed) {
    const auto why = !I.failure.empty() ? I.failure
                     : gave_up          ? std::string("gave up waiting for the layout")
                                        : fmt::format("no layout within {} s", I.o.attach_timeout_s);
    lock.unlock();
    I.stop = true;
    I.receiver.join();
    I.beater.join();
    throw Error(fmt::format("weight broadcast: subscribing to {}: {}", I.endpoint, why));
  }
  layout_ = I.layout;
}

BroadcastWeightSubscriber::~BroadcastWeightSubscriber() {
  auto& I = *impl_;
  I.stop = true;
  I.receiver.join();
  I.beater.join();
  try {
    send_text(I.control, {{"type", "bye"}, {"id", I.id}});
  } catch (...) {
  }
}

int64_t BroadcastWeightSubscriber::generation() const { return impl_->generation; }

std::optional<WeightUpdate> BroadcastWeightSubscriber::poll() {
  auto& I = *impl_;
  std::lock_guard lock(I.mu);
  RLX_CHECK(I.failure.empty(), "weight broadcast: the receiver stopped: {}", I.failure);
  if (!I.spare_ready) return std::nullopt;
  I.current = 1 - I.current;
  I.spare_ready = I.replaced = false;
  I.version = I.spare_version;
  version_ = I.version;
  WeightUpdate u;
  u.version = I.version;
  u.bytes_copied = layout_.bytes();
  auto& buf = I.buffers[static_cast<size_t>(I.current)];
  for (size_t i = 0; i < I.spans.size(); ++i)
    u.tensors.emplace_back(layout_.tensors[i].first, buf.narrow(0, I.spans[i].first, I.spans[i].second)
                                                         .view(layout_.dtype)
                                                         .view(layout_.tensors[i].second));
  return u;
}

}  // namespace rlx::dist
