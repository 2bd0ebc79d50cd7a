// Weight sync over tcp:// (ZeroMQ): learner rank 0 serves versions to rollout workers on
// any host. See weight_sync.hpp for the rules; the wire:
//
//   request  (DEALER -> ROUTER, one 32-byte frame)
//            "RLWQ" | format u32 | incarnation u64 (of the publisher it holds, 0: none) |
//            current i64 (the version it holds) | spare i64 (the version its spare buffer holds)
//   answer   (ROUTER -> DEALER) a JSON header, then one frame per chunk sent:
//            {"format", "incarnation", "version",
//             "layout": {"dtype", "chunk_bytes", "tensors": [[name, shape], ...]}   (when the
//                        incarnations differ)
//             "parts": [[chunk index, xxh3 of its bytes], ...]}
//            Chunks: each tensor's bytes cut into pieces of at most chunk_bytes (1 MiB), in
//            layout order; a tensor travels whole (all its chunks) or not at all. Frames stay
//            small enough for malloc's heap, which keeps large transfers at memcpy speed.
//
// A request is answered when the publisher has a version newer than `current` (or is
// another incarnation), else after keepalive_s with no parts, so the subscriber can tell
// a quiet publisher from a lost one.
#include <unistd.h>
#include "bus/transport.hpp"
#include "rlx/core/hash.hpp"

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "dist/layout_json.hpp"

namespace rlx::dist {

// Outside the anonymous namespace because the Impls hold them (GCC's -Wsubobject-linkage, as
// unity builds include this file).
namespace detail {
struct Chunk {
  size_t tensor;
  int64_t offset;  // in the flat version
  int64_t bytes;
};

struct Request {
  char magic[4];
  uint32_t format;
  uint64_t incarnation;
  int64_t current;
  int64_t spare;
};
static_assert(sizeof(Request) == 32);

// One published version, immutable once handed to the server thread; in-flight
// zero-copy frames hold a reference.
struct Snapshot {
  int64_t version = 0;
  at::Tensor bytes;                   // the layout's flat bytes
  std::vector<uint64_t> hashes;       // per chunk: xxh3 of its bytes
  std::vector<int64_t> last_changed;  // per tensor: the newest version whose bytes changed
};
}  // namespace detail
using detail::Chunk;
using detail::Request;
using detail::Snapshot;

namespace {

using nlohmann::json;

constexpr char kRequestMagic[4] = {'R', 'L', 'W', 'Q'};
constexpr uint32_t kTcpFormat = 1;
constexpr size_t kMaxHeaderBytes = size_t{64} << 20;  // a layout of kMaxSyncTensors long names fits
constexpr int64_t kChunkBytes = int64_t{1} << 20;
constexpr int64_t kMaxChunks = int64_t{1} << 24;

// Every tensor cut into chunks of at most chunk_bytes (an empty tensor: one empty chunk).
std::vector<Chunk> chunks_of(const std::vector<std::pair<int64_t, int64_t>>& spans, int64_t chunk_bytes) {
  std::vector<Chunk> out;
  for (size_t i = 0; i < spans.size(); ++i) {
    int64_t at = 0;
    do {
      const int64_t n = std::min(chunk_bytes, spans[i].second - at);
      out.push_back({i, spans[i].first + at, n});
      at += n;
    } while (at < spans[i].second);
  }
  return out;
}

uint64_t new_incarnation() {
  return (static_cast<uint64_t>(::getpid()) << 40) ^ static_cast<uint64_t>(now_s() * 1e9) ^
         reinterpret_cast<uintptr_t>(&kTcpFormat);
}

using SnapshotPtr = std::shared_ptr<const Snapshot>;

void release_snapshot(void*, void* hint) { delete static_cast<SnapshotPtr*>(hint); }

}  // namespace

std::string host_name() {
  char name[256] = {};
  RLX_CHECK(::gethostname(name, sizeof name - 1) == 0, "gethostname: {}", std::strerror(errno));
  return name;
}

std::string wait_endpoint_file(const std::filesystem::path& file, double timeout_s) {
  const double deadline = now_s() + timeout_s;
  for (;;) {
    std::error_code ec;
    if (std::filesystem::exists(file, ec)) {
      auto text = read_file(file, 4096);
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
      RLX_CHECK(text.starts_with("tcp://"), "{} holds {:?}, not a tcp:// endpoint", file.string(), text);
      return text;
    }
    RLX_CHECK(now_s() < deadline, "no process wrote {} within {} s: is the role that writes it running?", file.string(),
              timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// --- publisher ---------------------------------------------------------------------

struct TcpWeightPublisher::Impl {
  TcpSyncOptions o;
  WeightLayout layout;
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<Chunk> chunks;
  json layout_json;
  uint64_t incarnation = new_incarnation();
  std::string endpoint;

  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
  zmq::socket_t bell_in{context, zmq::socket_type::pair}, bell_out{context, zmq::socket_type::pair};
  std::mutex m;
  SnapshotPtr current;  // under m
  std::vector<std::shared_ptr<Snapshot>> pool;  // publisher thread only: buffers to reuse
  std::vector<uint64_t> hashes;                 // the last version's, per chunk
  std::vector<int64_t> last_changed;
  int64_t last_full = 0;

  struct Waiting {
    Request request;
    double since;
  };
  std::map<std::string, Waiting> waiting;  // server thread: by routing id
  std::atomic<bool> stop{false};
  mutable std::mutex counters_m;
  Counters counters;
  std::thread server;

  void serve() {
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}, {bell_in.handle(), 0, ZMQ_POLLIN, 0}};
    const auto tick = std::chrono::milliseconds(std::max(10, static_cast<int>(o.keepalive_s * 250)));
    while (!stop) {
      try {
        zmq::poll(items, 2, tick);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (items[1].revents & ZMQ_POLLIN) {
        zmq::message_t ding;
        while (bell_in.recv(ding, zmq::recv_flags::dontwait)) {
        }
      }
      for (int n = 0; n < 1024 && (items[0].revents & ZMQ_POLLIN); ++n) {
        std::vector<zmq::message_t> frames;
        if (!zmq::recv_multipart(router, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
        take_request(frames);
      }
      answer();
    }
  }

  void take_request(std::vector<zmq::message_t>& frames) {
    Request r{};
    if (frames.size() != 2 || frames[1].size() != sizeof(Request) ||
        (std::memcpy(&r, frames[1].data(), sizeof r), std::memcmp(r.magic, kRequestMagic, 4) != 0) ||
        r.format != kTcpFormat || r.current < 0 || r.spare < 0) {
      std::lock_guard lock(counters_m);
      ++counters.refused;  // not a subscriber of this format: dropped
      return;
    }
    auto id = frames[0].to_string();
    if (!waiting.count(id) && waiting.size() >= static_cast<size_t>(o.max_subscribers)) {
      std::lock_guard lock(counters_m);
      ++counters.dropped;
      return;
    }
    waiting[std::move(id)] = {r, now_s()};
  }

  // Answers every waiting request that has news, and those that waited keepalive_s.
  void answer() {
    SnapshotPtr snap;
    {
      std::lock_guard lock(m);
      snap = current;
    }
    const double now = now_s();
    for (auto it = waiting.begin(); it != waiting.end();) {
      const Request& r = it->second.request;
      const bool stranger = r.incarnation != incarnation;
      const bool news = snap && (stranger || snap->version > r.current);
      if (!news && !stranger && now - it->second.since < o.keepalive_s) {
        ++it;
        continue;
      }
      send_answer(it->first, r, news ? snap : nullptr, stranger);
      it = waiting.erase(it);
    }
  }

  void send_answer(const std::string& id, const Request& r, const SnapshotPtr& snap, bool stranger) {
    json head{{"format", kTcpFormat}, {"incarnation", incarnation}, {"version", snap ? snap->version : 0}};
    if (stranger) head["layout"] = layout_json;
    std::vector<size_t> parts;  // chunk indices
    json list = json::array();
    if (snap) {
      const bool all = stranger || r.spare == 0 || !o.delta;
      for (size_t k = 0; k < chunks.size(); ++k) {
        if (!all && snap->last_changed[chunks[k].tensor] <= r.spare) continue;
        parts.push_back(k);
        list.push_back({k, snap->hashes[k]});
      }
    }
    head["parts"] = std::move(list);
    const auto text = head.dump();
    bool ok = true;
    uint64_t sent = 0;
    try {
      ok = router.send(zmq::buffer(id), zmq::send_flags::sndmore | zmq::send_flags::dontwait).has_value() &&
           router.send(zmq::buffer(text), parts.empty() ? zmq::send_flags::dontwait
                                                        : zmq::send_flags::sndmore | zmq::send_flags::dontwait)
               .has_value();
      for (size_t k = 0; ok && k < parts.size(); ++k) {
        const auto& c = chunks[parts[k]];
        auto* p = static_cast<char*>(snap->bytes.data_ptr()) + c.offset;
        zmq::message_t frame(p, static_cast<size_t>(c.bytes), release_snapshot, new SnapshotPtr(snap));
        const auto flags = k + 1 < parts.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                                 : zmq::send_flags::dontwait;
        ok = router.send(frame, flags).has_value();
        sent += static_cast<uint64_t>(c.bytes);
      }
    } catch (const zmq::error_t&) {
      ok = false;  // EHOSTUNREACH (ROUTER_MANDATORY): the subscriber is gone
    }
    std::lock_guard lock(counters_m);
    if (!ok) ++counters.dropped;  // a partial multipart message is discarded by ZeroMQ
    else if (parts.empty()) ++counters.keepalives;
    else ++counters.answers, counters.bytes_sent += sent;
  }
};

TcpWeightPublisher::TcpWeightPublisher(TcpSyncOptions options, WeightLayout layout) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.o = std::move(options);
  I.layout = std::move(layout);
  const auto n = static_cast<int64_t>(I.layout.tensors.size());
  RLX_CHECK(n > 0 && n <= kMaxSyncTensors, "weight sync: {} tensors (1 to {})", n, kMaxSyncTensors);
  RLX_CHECK(at::isFloatingType(I.layout.dtype), "weight sync: dtype {} is not floating-point", c10::toString(I.layout.dtype));
  RLX_CHECK(I.layout.bytes() <= kMaxSyncBytes, "weight sync: {} bytes per version exceeds {}", I.layout.bytes(), kMaxSyncBytes);
  RLX_CHECK(I.o.full_every >= 1 && I.o.keepalive_s > 0 && I.o.max_subscribers >= 1,
            "weight sync: full_every, keepalive_s and max_subscribers must be positive");
  I.spans = I.layout.spans();
  I.chunks = chunks_of(I.spans, kChunkBytes);
  I.layout_json = layout_to_json(I.layout);
  I.layout_json["chunk_bytes"] = kChunkBytes;
  I.hashes.assign(I.chunks.size(), 0);
  I.last_changed.assign(static_cast<size_t>(n), 0);

  I.router.set(zmq::sockopt::linger, 0);
  I.router.set(zmq::sockopt::router_mandatory, 1);
  I.router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(64));  // requests are 32 bytes
  // A subscriber has at most one answer queued (one frame per chunk): never cut one short.
  I.router.set(zmq::sockopt::sndhwm, static_cast<int>(std::min<size_t>(I.chunks.size() + 16, INT32_MAX)));
  I.router.set(zmq::sockopt::rcvhwm, I.o.max_subscribers);
  try {
    I.router.bind(I.o.bind);
  } catch (const zmq::error_t& e) {
    throw Error(fmt::format("weight sync: cannot listen on {}: {}", I.o.bind, e.what()));
  }
  const auto bound = I.router.get(zmq::sockopt::last_endpoint);  // tcp://0.0.0.0:PORT
  const auto colon = bound.rfind(':');
  RLX_CHECK(bound.rfind("tcp://", 0) == 0 && colon != std::string::npos, "weight sync: {} is not a tcp:// endpoint", bound);
  I.endpoint = fmt::format("tcp://{}:{}", I.o.advertise_host.empty() ? host_name() : I.o.advertise_host,
                           bound.substr(colon + 1));
  static std::atomic<uint64_t> bells{0};
  const auto bell = fmt::format("inproc://rlx-weights-bell-{}", ++bells);
  I.bell_in.bind(bell);
  I.bell_out.connect(bell);
  I.server = std::thread([&I] { I.serve(); });
  if (!I.o.endpoint_file.empty()) write_file_atomic(I.o.endpoint_file, I.endpoint + "\n");
}

TcpWeightPublisher::~TcpWeightPublisher() {
  impl_->stop = true;
  impl_->server.join();
}

const std::string& TcpWeightPublisher::endpoint() const { return impl_->endpoint; }

TcpWeightPublisher::Counters TcpWeightPublisher::counters() const {
  std::lock_guard lock(impl_->counters_m);
  return impl_->counters;
}

int64_t TcpWeightPublisher::publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  auto& I = *impl_;
  RLX_CHECK(version > version_, "weight sync: version {} after {}: versions must increase", version, version_);
  I.layout.check(tensors);
  // A buffer no in-flight answer still reads, else a new one.
  std::shared_ptr<Snapshot> snap;
  for (auto& s : I.pool)
    if (s.use_count() == 1) snap = s;
  if (!snap) {
    snap = std::make_shared<Snapshot>();
    snap->bytes = at::empty({I.layout.bytes()}, at::kByte);
    I.pool.push_back(snap);
    if (I.pool.size() > 4) I.pool.erase(I.pool.begin());  // the pool stays small; old ones die with their readers
  }
  const bool full = !I.o.delta || version_ == 0 || version - I.last_full >= I.o.full_every;
  if (full) I.last_full = version;
  char* base = static_cast<char*>(snap->bytes.data_ptr());
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto dst = at::from_blob(base + I.spans[i].first, tensors[i].second.sizes(), at::TensorOptions().dtype(I.layout.dtype));
    dst.copy_(tensors[i].second.detach());
  }
  // Each chunk's checksum, once per version (every answer reuses it); in delta mode a
  // tensor changed when one of its chunks did.
  snap->hashes.resize(I.chunks.size());
  for (size_t k = 0; k < I.chunks.size(); ++k) {
    const auto& c = I.chunks[k];
    snap->hashes[k] = hash64(base + c.offset, static_cast<size_t>(c.bytes));
    if (!I.o.delta || full || snap->hashes[k] != I.hashes[k]) I.last_changed[c.tensor] = version;
  }
  I.hashes = snap->hashes;
  snap->version = version;
  snap->last_changed = I.last_changed;
  {
    std::lock_guard lock(I.m);
    I.current = snap;
  }
  static const char one = 1;
  (void)I.bell_out.send(zmq::buffer(&one, 1), zmq::send_flags::dontwait);
  version_ = version;
  return I.layout.bytes();
}

// --- subscriber ----------------------------------------------------------------------

struct TcpWeightSubscriber::Impl {
  TcpSyncOptions o;
  zmq::context_t context{1};
  std::unique_ptr<zmq::socket_t> dealer;
  std::string endpoint;
  uint64_t incarnation = 0;
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<Chunk> chunks;
  at::Tensor buffers[2];
  int64_t buffer_version[2] = {0, 0};
  int current = 0;
  bool outstanding = false;
  double sent_at = 0;
  std::optional<WeightUpdate> first;  // the constructor's answer, handed out by the first poll()

  std::string read_endpoint(double deadline) const {
    if (!o.endpoint.empty()) return o.endpoint;
    RLX_CHECK(!o.endpoint_file.empty(), "weight sync: a tcp subscriber needs an endpoint or an endpoint file");
    return wait_endpoint_file(o.endpoint_file, std::max(0.0, deadline - now_s()));
  }

  void connect(double deadline) {
    endpoint = read_endpoint(deadline);
    dealer = std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
    dealer->set(zmq::sockopt::linger, 0);
    dealer->set(zmq::sockopt::rcvhwm, 0);  // one answer at a time (bounded by the layout's chunks)
    dealer->set(zmq::sockopt::maxmsgsize, int64_t{1} << 30);  // the largest chunk_bytes accepted
    try {
      dealer->connect(endpoint);
    } catch (const zmq::error_t& e) {
      throw Error(fmt::format("weight sync: cannot connect to {}: {}", endpoint, e.what()));
    }
    outstanding = false;
  }

  void request() {
    Request r{};
    std::memcpy(r.magic, kRequestMagic, 4);
    r.format = kTcpFormat;
    r.incarnation = incarnation;
    r.current = buffer_version[current];
    r.spare = buffer_version[1 - current];
    (void)dealer->send(zmq::buffer(&r, sizeof r), zmq::send_flags::dontwait);
    outstanding = true;
    sent_at = now_s();
  }

  // Throws rlx::Error naming the publisher and what was wrong with its answer.
  [[noreturn]] void bad(const std::string& what) const {
    throw Error(fmt::format("weight sync: answer from {}: {}", endpoint, what));
  }

  // Applies one answer; the update when it carried a newer version.
  std::optional<WeightUpdate> take(std::vector<zmq::message_t>& frames, WeightLayout& layout, int64_t& version) {
    if (frames.empty() || frames[0].size() > kMaxHeaderBytes) bad("no header, or one over 64 MiB");
    const auto head = json::parse(frames[0].to_string_view(), nullptr, false);
    if (!head.is_object() || head.value("format", 0) != static_cast<int>(kTcpFormat))
      bad("not a header of format " + std::to_string(kTcpFormat));
    const auto inc = head.value("incarnation", uint64_t{0});
    const auto v = head.value("version", int64_t{-1});
    const auto& parts = head.contains("parts") ? head["parts"] : json();
    if (inc == 0 || v < 0 || !parts.is_array()) bad("incarnation, version or parts missing");
    if (inc != incarnation) {  // another publisher (or the first): its layout, and start over
      if (!head.contains("layout")) bad("a new incarnation without its layout");
      int64_t chunk_bytes = 0;
      layout = parse_layout(head["layout"], chunk_bytes);
      spans = layout.spans();
      chunks = chunks_of(spans, chunk_bytes);
      for (auto& b : buffers) b = at::empty({layout.bytes()}, at::kByte);
      buffer_version[0] = buffer_version[1] = 0;
      version = 0;
      incarnation = inc;
    }
    if (parts.empty()) return std::nullopt;  // nothing newer (a keepalive)
    if (v <= version) bad(fmt::format("version {} after {}", v, version));
    if (frames.size() != parts.size() + 1) bad(fmt::format("{} parts listed, {} sent", parts.size(), frames.size() - 1));
    const int target = 1 - current;
    const int64_t base = buffer_version[target];
    buffer_version[target] = 0;  // partly written until the end
    std::vector<bool> seen(chunks.size(), false);
    std::vector<size_t> arrived(spans.size(), 0), total(spans.size(), 0);
    for (const auto& c : chunks) ++total[c.tensor];
    char* dst = static_cast<char*>(buffers[target].data_ptr());
    int64_t copied = 0;
    for (size_t k = 0; k < parts.size(); ++k) {
      const auto& p = parts[k];
      if (!p.is_array() || p.size() != 2 || !p[0].is_number_unsigned() || !p[1].is_number_unsigned())
        bad(fmt::format("part {} is not [chunk index, hash]", k));
      const auto i = p[0].get<uint64_t>();
      if (i >= chunks.size() || seen[i]) bad(fmt::format("part {} names chunk {} (of {}), or twice", k, i, chunks.size()));
      seen[i] = true;
      const auto& c = chunks[i];
      const auto& name = layout.tensors[c.tensor].first;
      const auto& f = frames[k + 1];
      if (f.size() != static_cast<size_t>(c.bytes))
        bad(fmt::format("chunk {} of tensor {:?} has {} bytes, the layout says {}", i, name, f.size(), c.bytes));
      if (hash64(f.data(), f.size()) != p[1].get<uint64_t>())
        bad(fmt::format("chunk {} of tensor {:?} fails its checksum", i, name));
      std::memcpy(dst + c.offset, f.data(), f.size());
      copied += static_cast<int64_t>(f.size());
      ++arrived[c.tensor];
    }
    // A tensor travels whole or not at all; those not sent are unchanged since `base`,
    // which the spare buffer holds.
    for (size_t t = 0; t < spans.size(); ++t) {
      if (arrived[t] != 0 && arrived[t] != total[t])
        bad(fmt::format("tensor {:?}: {} of its {} chunks", layout.tensors[t].first, arrived[t], total[t]));
      if (arrived[t] == 0 && base == 0) bad("a partial version for an empty spare buffer");
    }
    buffer_version[target] = v;
    current = target;
    version = v;
    WeightUpdate u;
    u.version = v;
    u.bytes_copied = copied;
    for (size_t i = 0; i < spans.size(); ++i)
      u.tensors.emplace_back(layout.tensors[i].first,
                             at::from_blob(dst + spans[i].first, layout.tensors[i].second,
                                           at::TensorOptions().dtype(layout.dtype)));
    return u;
  }

  WeightLayout parse_layout(const json& j, int64_t& chunk_bytes) const {
    if (!j.is_object() || !j.contains("chunk_bytes") || !j["chunk_bytes"].is_number_integer())
      bad("layout without chunk_bytes");
    chunk_bytes = j["chunk_bytes"].get<int64_t>();
    if (chunk_bytes < 4096 || chunk_bytes > (int64_t{1} << 30)) bad(fmt::format("chunk_bytes {} (4 KiB to 1 GiB)", chunk_bytes));
    WeightLayout l;
    try {
      l = layout_from_json(j);
    } catch (const Error& e) {
      bad(e.what());
    }
    if (l.bytes() / chunk_bytes + static_cast<int64_t>(l.tensors.size()) > kMaxChunks)
      bad(fmt::format("more than {} chunks of {} bytes", kMaxChunks, chunk_bytes));
    return l;
  }
};

TcpWeightSubscriber::TcpWeightSubscriber(TcpSyncOptions options) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.o = std::move(options);
  RLX_CHECK(I.o.attach_timeout_s > 0 && I.o.lost_after_s > 0, "weight sync: attach_timeout_s and lost_after_s must be > 0");
  const double deadline = now_s() + I.o.attach_timeout_s;
  I.connect(deadline);
  I.request();
  for (;;) {
    std::vector<zmq::message_t> frames;
    zmq::pollitem_t item{I.dealer->handle(), 0, ZMQ_POLLIN, 0};
    if (!bus::detail::poll(&item, 1, std::chrono::milliseconds(50))) item.revents = 0;  // a signal: give_up decides
    if ((item.revents & ZMQ_POLLIN) && zmq::recv_multipart(*I.dealer, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
      I.outstanding = false;
      I.first = I.take(frames, layout_, version_);
      return;
    }
    RLX_CHECK(now_s() < deadline, "weight sync: no answer from {} within {} s", I.endpoint, I.o.attach_timeout_s);
    RLX_CHECK(!I.o.give_up || !I.o.give_up(), "weight sync: gave up waiting for an answer from {}", I.endpoint);
  }
}

TcpWeightSubscriber::~TcpWeightSubscriber() = default;

std::optional<WeightUpdate> TcpWeightSubscriber::poll() {
  auto& I = *impl_;
  if (I.first) {
    auto u = std::move(I.first);
    I.first.reset();
    return u;
  }
  if (!I.outstanding) I.request();
  std::vector<zmq::message_t> frames;
  if (zmq::recv_multipart(*I.dealer, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
    I.outstanding = false;
    auto u = I.take(frames, layout_, version_);
    I.request();  // the next one waits at the publisher
    return u;
  }
  if (now_s() - I.sent_at > I.o.lost_after_s) {  // the publisher is gone (or moved): find it again
    log::warn("weight sync: no answer from {} for {:.0f} s; reconnecting", I.endpoint, I.o.lost_after_s);
    ++reconnects_;
    I.connect(now_s() + I.o.attach_timeout_s);
  }
  return std::nullopt;
}

}  // namespace rlx::dist
