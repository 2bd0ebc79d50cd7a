// Weight sync by collective broadcast: the publisher (weight_broadcast.hpp); the control protocol is in broadcast_control.hpp.
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

// --- publisher ---------------------------------------------------------------------

struct BroadcastWeightPublisher::Impl {
  BroadcastSyncOptions o;
  WeightLayout layout;
  std::vector<std::pair<int64_t, int64_t>> spans, buckets;
  json welcome;
  uint64_t hash = 0;
  std::string endpoint, host;
  std::unique_ptr<StoreServer> store;

  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  std::thread server;
  std::atomic<bool> stop{false};

  struct Member {
    std::string route;  // the routing id of its control socket
    double last_seen = 0;
  };
  std::mutex mu;  // members, order, outbox
  std::map<std::string, Member> members;  // by the id a subscriber names itself
  std::vector<std::string> order;         // ids in the order they said hello
  std::deque<std::pair<std::string, std::string>> outbox;  // routing id, text

  // The group and what it last sent, held by publish() and the catch-up thread in turn.
  std::mutex send_mu;
  std::atomic<int64_t> generation{0};
  std::vector<std::string> group;  // ids of ranks 1.. of the current generation
  std::atomic<int> group_size{0};
  std::unique_ptr<Communicator> comm;
  // The last version, flat in the layout's dtype: buckets are cast into it and broadcast
  // from it, and a member that joins between versions is sent it from here.
  at::Tensor last;
  int64_t last_version = 0;
  std::thread catcher;

  void post(const std::string& route, const json& j) {
    std::lock_guard lock(mu);
    outbox.emplace_back(route, j.dump());
  }

  // The control thread: hellos, beats and byes in; queued messages out.
  void serve() {
    while (!stop) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      if (!bus::detail::poll(&item, 1, std::chrono::milliseconds(kPollMs))) item.revents = 0;  // EINTR: a signal for the process
      for (int n = 0; n < 256 && (item.revents & ZMQ_POLLIN); ++n) {
        std::vector<zmq::message_t> frames;
        if (!zmq::recv_multipart(router, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
        if (frames.size() != 2) continue;
        const auto route = frames[0].to_string();
        const auto j = parse(frames[1]);
        if (j.is_discarded() || !j.contains("id") || !j["id"].is_string()) continue;
        const auto id = j["id"].get<std::string>();
        const auto type = j["type"].get<std::string>();
        std::lock_guard lock(mu);
        if (type == "hello") {
          if (!members.contains(id)) {
            if (static_cast<int>(members.size()) >= o.max_members) {
              log::warn("weight broadcast: {} said hello, but {} members is the limit (max_members)", id, o.max_members);
              continue;
            }
            order.push_back(id);
          }
          members[id] = {route, now_s()};
          outbox.emplace_back(route, welcome.dump());
        } else if (type == "beat") {
          auto it = members.find(id);
          if (it != members.end()) it->second.last_seen = now_s();
          else outbox.emplace_back(route, json{{"type", "rejoin"}}.dump());
        } else if (type == "bye") {
          members.erase(id);
          std::erase(order, id);
        }
      }
      std::deque<std::pair<std::string, std::string>> out;
      {
        std::lock_guard lock(mu);
        out.swap(outbox);
      }
      for (auto& [route, text] : out) {
        try {
          (void)router.send(zmq::buffer(route), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          (void)router.send(zmq::buffer(text), zmq::send_flags::dontwait);
        } catch (const zmq::error_t&) {
          // A peer gone (router_mandatory): its heartbeat stops and it is dropped.
        }
      }
    }
  }

  std::vector<std::string> live_members() {
    std::lock_guard lock(mu);
    std::vector<std::string> out;
    for (const auto& id : order)
      if (members.contains(id)) out.push_back(id);
    return out;
  }

  // A new generation of `ids` (ranks 1..n, the publisher rank 0); blocks until all joined.
  void form(const std::vector<std::string>& ids) {
    reset_group();
    ++generation;
    const auto prefix = fmt::format("rlx/weights/{}", generation.load());
    const int world = static_cast<int>(ids.size()) + 1;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::string route;
      {
        std::lock_guard lock(mu);
        auto it = members.find(ids[i]);
        // It said goodbye since the list was taken: this generation cannot form; the next
        // attempt is without it.
        if (it == members.end())
          throw CommError(fmt::format("weight broadcast: member {} left while generation {} formed", ids[i], generation.load()));
        route = it->second.route;
      }
      post(route, {{"type", "join"},
                   {"generation", generation.load()},
                   {"rank", static_cast<int>(i) + 1},
                   {"world", world},
                   {"store", fmt::format("{}:{}", host, store->port())},
                   {"prefix", prefix},
                   {"nccl", o.nccl}});
    }
    RendezvousOptions ro;
    ro.rank = 0;
    ro.world_size = world;
    ro.store_host = host;
    ro.store_port = store->port();
    ro.interface_host = interface_of(o);
    ro.timeout_s = ro.connect_timeout_s = o.timeout_s;
    ro.nccl = o.nccl;
    ro.prefix = prefix;
    comm = connect(ro);
    group = ids;
    group_size = static_cast<int>(ids.size());
  }

  void reset_group() {
    comm.reset();
    group.clear();
    group_size = 0;
  }

  // Casts `tensors` (nullptr: what `last` holds already) into `last` bucket by bucket and
  // broadcasts each bucket while the next is cast.
  int64_t send(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>* tensors) {
    json list = json::array();
    for (const auto& [offset, bytes] : buckets) list.push_back({offset, bytes});
    const json head{{"type", "version"}, {"generation", generation.load()}, {"version", version}, {"layout_hash", hash},
                    {"buckets", std::move(list)}};
    for (const auto& id : group) {
      std::lock_guard lock(mu);
      auto it = members.find(id);
      if (it != members.end()) outbox.emplace_back(it->second.route, head.dump());
    }
    std::unique_ptr<Work> inflight;
    int64_t sent = 0;
    size_t t = 0;  // the next tensor to cast
    for (size_t k = 0; k < buckets.size(); ++k) {
      const auto [begin, bytes] = buckets[k];
      auto b = last.narrow(0, begin, bytes);
      for (; tensors && t < spans.size() && spans[t].first < begin + bytes; ++t) {
        const auto& shape = layout.tensors[t].second;
        b.narrow(0, spans[t].first - begin, spans[t].second).view(layout.dtype).view(shape).copy_((*tensors)[t].second);
      }
      if (inflight) inflight->wait();
      inflight = comm->broadcast(b, 0, fmt::format("weights v{} bucket {} of {}", version, k + 1, buckets.size()));
      sent += bytes;
    }
    if (inflight) inflight->wait();
    return sent;
  }

  // Sends a version to the live members, re-forming the group when they changed; a failed
  // generation drops the silent members and tries again (3 generations at most).
  int64_t deliver(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>* tensors) {
    std::string failures;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const auto ids = live_members();
      if (ids.empty()) {
        reset_group();
        if (tensors) cast_all(*tensors);
        return 0;
      }
      try {
        if (!comm || ids != group) form(ids);
        const int64_t sent = send(version, tensors);
        tensors = nullptr;  // cast: `last` holds the version now
        return sent;
      } catch (const CommError& e) {
        log::warn("weight broadcast: generation {} failed ({}); re-forming without silent members", generation.load(),
                  e.what());
        failures += fmt::format("\n  generation {}: {}", generation.load(), e.what());
        if (tensors) cast_all(*tensors);  // what was cast before the failure is partial
        tensors = nullptr;
        reset_group();
        drop_silent();
      }
    }
    throw CommError(fmt::format("weight broadcast: version {} reached no group in 3 generations:{}", version, failures));
  }

  void cast_all(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    for (size_t t = 0; t < spans.size(); ++t)
      last.narrow(0, spans[t].first, spans[t].second).view(layout.dtype).view(layout.tensors[t].second).copy_(tensors[t].second);
  }

  // Members that said hello after the last version are sent it without waiting for the
  // next one (a restarted worker must not wait a whole step, or forever in synchronous mode).
  void catch_up() {
    use_buffers_device(o);
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs * 5));
      // `group` is publish()'s: read it only while publish() is not running. A publish in
      // progress re-forms the group with every live member itself.
      std::unique_lock send_lock(send_mu, std::try_to_lock);
      if (!send_lock.owns_lock() || last_version == 0 || stop) continue;
      bool newcomer = false;
      {
        std::lock_guard lock(mu);
        for (const auto& id : order)
          if (members.contains(id) && std::find(group.begin(), group.end(), id) == group.end()) newcomer = true;
      }
      if (!newcomer) continue;
      try {
        deliver(last_version, nullptr);
      } catch (const std::exception& e) {
        log::warn("weight broadcast: sending v{} to members that joined failed: {}", last_version, e.what());
      }
    }
  }

  // After a failed generation: members whose heartbeat stopped are dropped.
  void drop_silent() {
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(o.silent_after_s * 1000)));
    std::lock_guard lock(mu);
    const double now = now_s();
    for (auto it = members.begin(); it != members.end();) {
      if (now - it->second.last_seen > o.silent_after_s) {
        log::warn("weight broadcast: member {} is silent (no heartbeat for {:.1f} s): dropped", it->first,
                  now - it->second.last_seen);
        std::erase(order, it->first);
        it = members.erase(it);
      } else {
        ++it;
      }
    }
  }
};

BroadcastWeightPublisher::BroadcastWeightPublisher(BroadcastSyncOptions options, WeightLayout layout)
    : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.o = std::move(options);
  I.layout = std::move(layout);
  const auto n = static_cast<int64_t>(I.layout.tensors.size());
  RLX_CHECK(n > 0 && n <= kMaxSyncTensors, "weight broadcast: {} tensors (1 to {})", n, kMaxSyncTensors);
  RLX_CHECK(at::isFloatingType(I.layout.dtype), "weight broadcast: dtype {} is not floating-point",
            c10::toString(I.layout.dtype));
  RLX_CHECK(I.layout.bytes() <= kMaxSyncBytes, "weight broadcast: {} bytes per version exceeds {}", I.layout.bytes(),
            kMaxSyncBytes);
  RLX_CHECK(I.o.bucket_mb >= 1 && I.o.bucket_mb <= 16384 && I.o.timeout_s > 0 && I.o.silent_after_s > 0 &&
                I.o.max_members >= 1,
            "weight broadcast: bucket_mb (1 to 16384), timeout_s, silent_after_s and max_members must be positive");
  I.spans = I.layout.spans();
  I.buckets = buckets_of(I.layout, I.o.bucket_mb << 20);
  I.hash = layout_hash(I.layout);
  I.welcome = {{"type", "welcome"}, {"layout", layout_to_json(I.layout)}, {"layout_hash", I.hash}};
  I.host = interface_of(I.o);
  I.store = std::make_unique<StoreServer>(I.host, 0);
  const auto device = I.o.nccl ? at::Device(I.o.device) : at::Device(at::kCPU);
  I.last = at::empty({I.layout.bytes()}, at::TensorOptions().dtype(at::kByte).device(device));
  I.router.set(zmq::sockopt::linger, 0);
  I.router.set(zmq::sockopt::router_mandatory, 1);
  I.router.set(zmq::sockopt::maxmsgsize, int64_t{4096});
  try {
    I.router.bind(I.o.bind);
  } catch (const zmq::error_t& e) {
    throw Error(fmt::format("weight broadcast: cannot listen on {}: {}", I.o.bind, e.what()));
  }
  const auto bound = I.router.get(zmq::sockopt::last_endpoint);
  I.endpoint = fmt::format("tcp://{}:{}", I.host, bound.substr(bound.rfind(':') + 1));
  I.server = std::thread([&I] { I.serve(); });
  I.catcher = std::thread([&I] { I.catch_up(); });
  if (!I.o.endpoint_file.empty()) write_file_atomic(I.o.endpoint_file, I.endpoint + "\n");
}

BroadcastWeightPublisher::~BroadcastWeightPublisher() {
  impl_->stop = true;
  impl_->catcher.join();
  impl_->server.join();
}

const std::string& BroadcastWeightPublisher::endpoint() const { return impl_->endpoint; }
int64_t BroadcastWeightPublisher::generation() const { return impl_->generation; }
int BroadcastWeightPublisher::members() const { return impl_->group_size; }

int64_t BroadcastWeightPublisher::publish(int64_t version,
                                          const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  auto& I = *impl_;
  RLX_CHECK(version > version_, "weight broadcast: version {} after {}", version, version_);
  I.layout.check(tensors);
  std::lock_guard send_lock(I.send_mu);
  const int64_t sent = I.deliver(version, &tensors);
  I.last_version = version_ = version;
  return sent;
}

}  // namespace rlx::dist
