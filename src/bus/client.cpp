#include "rlx/bus/client.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "transport.hpp"

namespace rlx::bus {

using detail::seconds_now;

struct Client::Impl {
  // An answer from the hub: the message as received (not copied) and its frame, already
  // verified by decode_frame (kept as an offset: a small message's bytes move with it).
  struct Reply {
    zmq::message_t msg;
    std::vector<zmq::message_t> parts;  // a multipart answer's other parts (a batch's groups)
    MsgType type{};
    uint64_t seq = 0;
    Frame frame() const {
      const std::string_view bytes(static_cast<const char*>(msg.data()), msg.size());
      return {type, seq, bytes.substr(kHeaderBytes)};
    }
  };
  // One frame to send, and its answer once it comes.
  struct Item {
    MsgType type;
    std::shared_ptr<std::string> frame;  // packed; the seq in its header is stamped at each send
    std::optional<Reply> reply;
    bool failed = false;
  };
  using ItemPtr = std::shared_ptr<Item>;

  ClientOptions o;
  Limits limits;
  zmq::context_t& context;
  // The socket is used only with m held, by whichever thread needs it: a caller sends its
  // frame itself, and a caller that waits (for an answer, for credit) receives and sends
  // while it waits. The I/O thread serves the socket only while no caller waits (drivers
  // == 0): frames that arrive between calls, heartbeats, reconnects. Waiting is a poll of
  // the socket's ZMQ_FD without m; every use of the socket ends in service_locked(), which
  // leaves no readable frame behind (the fd signals only new arrivals).
  zmq::socket_t dealer;
  int dealer_fd = -1;
  zmq::message_t in;                // the frame being received
  std::vector<zmq::message_t> more;  // and the message's other parts, if any

  mutable std::mutex m;
  std::condition_variable io_cv;  // the I/O thread waits here while a caller drives
  int drivers = 0;                // callers now waiting on the socket
  std::deque<ItemPtr> outbox;       // not yet handed to ZeroMQ
  std::map<uint64_t, ItemPtr> sent;  // by seq: sent, not yet answered
  uint64_t next_seq = 0, hello_seq = 0;
  uint64_t hub_credits = 0, credit_base = 0;
  uint64_t last_batch_id = 0;  // the newest batch handed to the caller
  int64_t published = -1;      // the newest weight version this learner published
  // Learners with prefetch_batches: the request for the next batch, sent when the last one
  // came (and what it asked for).
  ItemPtr ahead;
  BatchRequest ahead_request;
  double last_heard = 0, last_beat = 0, last_connect = 0;
  bool closed = false;  // said goodbye: no heartbeat, reconnect or hello any more
  Counters counters;
  std::atomic<bool> stop{false};
  std::thread io;

  explicit Impl(ClientOptions options)
      : o(std::move(options)),
        limits{.max_frame_bytes = o.max_frame_mb << 20},
        context(detail::shared_context()) {
    config::check_bounds(o, "client");
    RLX_CHECK(!o.who.empty(), "client: `who` (a unique peer name) is required");
    RLX_CHECK(o.role == "worker" || o.role == "learner" || o.role == "monitor",
              "client {}: role '{}' is not worker, learner or monitor", o.who, o.role);
    if (o.incarnation == 0)
      o.incarnation = (static_cast<uint64_t>(::getpid()) << 32) ^ static_cast<uint64_t>(seconds_now() * 1e6);
    std::lock_guard lock(m);
    connect_locked();
    io = std::thread([this] {
      ::pthread_setname_np(::pthread_self(), "rlx-bus-client");
      loop();
    });
  }

  ~Impl() {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    io_cv.notify_all();
    io.join();  // within one poll slice (50 ms)
  }

  // --- called with m held ---
  void connect_locked() {
    dealer = zmq::socket_t(context, zmq::socket_type::dealer);
    detail::configure_socket(dealer, limits, o.queue_depth);
    if (o.curve.enabled()) detail::make_curve_client(dealer, o.curve);
    try {
      dealer.connect(o.address);
    } catch (const zmq::error_t& e) {
      throw Error(fmt::format("client {}: cannot connect to {}: {}", o.who, o.address, e.what()));
    }
    dealer_fd = static_cast<int>(dealer.get(zmq::sockopt::fd));
    last_heard = last_connect = seconds_now();
    hello_locked();
  }

  // Says Hello, and puts everything unanswered back in front of the queue (in order).
  void hello_locked() {
    std::vector<ItemPtr> again;
    for (auto& [seq, item] : sent)
      if (item->type != MsgType::hello) again.push_back(item);
    sent.clear();
    for (auto it = again.rbegin(); it != again.rend(); ++it) outbox.push_front(*it);
    counters.resent += again.size();
    hub_credits = 0;
    auto hello = std::make_shared<Item>(
        Item{MsgType::hello, std::make_shared<std::string>(pack(Hello{o.who, o.role, o.incarnation}))});
    outbox.push_front(hello);
    send_locked();
    hello_seq = next_seq;  // the hello went first
  }

  uint64_t available_credits_locked() const {
    uint64_t in_flight = 0;
    for (const auto& [seq, item] : sent)
      if (item->type == MsgType::trajectory_group && seq > credit_base) ++in_flight;
    return hub_credits > in_flight ? hub_credits - in_flight : 0;
  }

  void send_locked() {
    if (outbox.empty()) return;
    uint64_t credits = available_credits_locked();
    for (auto it = outbox.begin(); it != outbox.end();) {
      const auto& item = *it;
      const bool group = item->type == MsgType::trajectory_group;
      if (group && credits == 0) {
        ++it;  // waits for credit; other frames may pass it
        continue;
      }
      const uint64_t seq = next_seq + 1;
      if (item->frame.use_count() > 1) item->frame = std::make_shared<std::string>(*item->frame);  // ZeroMQ still holds it
      std::memcpy(item->frame->data() + 12, &seq, sizeof(seq));
      if (!detail::try_send(dealer, std::shared_ptr<const std::string>(item->frame))) break;  // queue full: next turn
      next_seq = seq;
      sent[seq] = item;
      if (group) --credits, ++counters.groups_sent;
      it = outbox.erase(it);
    }
  }

  // Takes `msg` (and `parts`) when it answers a request (they are then left empty).
  void on_frame_locked(zmq::message_t& msg, std::vector<zmq::message_t>& parts) {
    const std::string_view bytes(static_cast<const char*>(msg.data()), msg.size());
    Frame f;
    try {
      f = decode_frame(bytes, limits);
    } catch (const FrameError& e) {
      log::warn("client {}: rejected a frame from the hub ({}): {}", o.who, to_string(e.reason()), e.what());
      return;
    }
    last_heard = seconds_now();
    try {
      switch (f.type) {
        case MsgType::heartbeat: return;
        case MsgType::welcome: {
          auto w = unpack<Welcome>(f, limits);
          if (w.rehello) {
            if (f.seq > hello_seq && !closed) {  // the hub forgot us after our last hello
              ++counters.rehellos;
              hello_locked();
            }
            return;
          }
          answer_locked(f, msg, parts);
          hub_credits = w.credits;
          credit_base = f.seq;
          return;
        }
        case MsgType::ack: {
          auto a = unpack<Ack>(f, limits);
          if (auto it = sent.find(a.seq); it != sent.end()) {
            ItemPtr item = it->second;
            if (item->type == MsgType::trajectory_group) {
              if (a.verdict == "full") {  // the hub had no room: send it again with credit
                sent.erase(it);
                outbox.push_front(item);
              } else {
                ++counters.groups_acked;
                ++counters.verdicts[a.verdict];
                answer_locked(f, msg, parts, a.seq);
              }
            } else {
              answer_locked(f, msg, parts, a.seq);
            }
          }
          if (o.role == "worker") hub_credits = a.credits, credit_base = a.seq;
          return;
        }
        default:
          answer_locked(f, msg, parts);
      }
    } catch (const FrameError& e) {
      log::warn("client {}: bad {} from the hub: {}", o.who, to_string(f.type), e.what());
    }
  }

  // `seq`: the request answered (an ack names it; otherwise the frame's own seq).
  void answer_locked(const Frame& f, zmq::message_t& msg, std::vector<zmq::message_t>& parts,
                     std::optional<uint64_t> seq = std::nullopt) {
    auto it = sent.find(seq.value_or(f.seq));
    if (it == sent.end()) return;  // an answer nobody waits for any more
    it->second->reply = Reply{std::move(msg), std::move(parts), f.type, f.seq};
    sent.erase(it);
  }

  // Frames out, frames in, timers, until no frame is left to read. A receive is tried only
  // once ZMQ_EVENTS says a frame is there: an empty one costs ZeroMQ a check of its command
  // mailbox (on this VM a few syscalls, its fork guard's getpid among them).
  void service_locked() {
    for (int round = 0; round < 64; ++round) {
      send_locked();
      const bool ready = dealer.get(zmq::sockopt::events) & ZMQ_POLLIN;
      if (ready)
        for (int i = 0; i < 256 && dealer.recv(in, zmq::recv_flags::dontwait); ++i)
          if (receive_rest_locked()) on_frame_locked(in, more);
      const double now = seconds_now();  // after the frames: they count as heard
      if (closed) return;
      if (now - last_heard > o.hub_timeout_s && now - last_connect > o.hub_timeout_s) {
        log::warn("client {}: nothing from the hub for {:.1f} s; reconnecting to {}", o.who, now - last_heard, o.address);
        ++counters.reconnects;
        connect_locked();
        continue;
      }
      if (now - last_beat >= o.heartbeat_s) {
        last_beat = now;
        detail::try_send(dealer, pack(Heartbeat{o.who}, 0));
        continue;  // a send may have taken the fd's signal: look at ZMQ_EVENTS again
      }
      if (!ready) return;
    }
  }

  // The other parts of the message whose first part is `in` (all of them are there once the
  // first is); false when there are more than a batch can have (dropped).
  bool receive_rest_locked() {
    more.clear();
    bool ok = true;
    for (bool next = in.more(); next;) {
      zmq::message_t part;
      (void)dealer.recv(part, zmq::recv_flags::none);
      next = part.more();
      if (more.size() >= kMaxBatchGroups) ok = false;  // a head and at most kMaxBatchGroups groups
      else more.push_back(std::move(part));
    }
    if (!ok) log::warn("client {}: dropped a message of more than {} parts from the hub", o.who, kMaxBatchGroups + 1);
    return ok;
  }

  // One wait for the socket to have something (or `timeout`), without m.
  void wait_on_socket(std::unique_lock<std::mutex>& lock, double timeout_s) {
    zmq::pollitem_t item{nullptr, dealer_fd, ZMQ_POLLIN, 0};
    lock.unlock();
    detail::poll(&item, 1, std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(timeout_s * 1e3))));
    lock.lock();
  }

  // A caller's wait: serves the socket until done() or `timeout_s` passed; returns done().
  template <class Done>
  bool drive(std::unique_lock<std::mutex>& lock, double timeout_s, Done&& done) {
    const double end = seconds_now() + timeout_s;
    ++drivers;
    struct Leave {
      Impl& I;
      ~Leave() {
        if (--I.drivers == 0) I.io_cv.notify_one();
      }
    } leave{*this};
    for (;;) {
      service_locked();
      if (done()) return true;
      const double left = end - seconds_now();
      if (left <= 0) return false;
      wait_on_socket(lock, std::min(left, 0.05));
    }
  }

  void loop() {
    std::unique_lock lock(m);
    while (!stop) {
      if (drivers > 0) {  // a caller serves the socket
        io_cv.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      service_locked();
      wait_on_socket(lock, 0.05);
    }
  }

  // --- API side ---
  // Queues the frame and sends what can go now, from the calling thread.
  ItemPtr enqueue(MsgType type, std::string frame) {
    auto item = std::make_shared<Item>(Item{type, std::make_shared<std::string>(std::move(frame))});
    std::lock_guard lock(m);
    RLX_CHECK(!closed, "client {}: closed; a {} cannot be sent", o.who, to_string(type));
    outbox.push_back(item);
    service_locked();
    return item;
  }

  void forget_locked(const ItemPtr& item) {
    std::erase(outbox, item);
    std::erase_if(sent, [&](const auto& kv) { return kv.second == item; });
  }

  // drive(), asking `give_up` (when set) twice a second.
  enum class Waited { done, timed_out, gave_up };
  template <class Done>
  Waited drive_or_give_up(std::unique_lock<std::mutex>& lock, double timeout_s, Done&& done) {
    const double end = seconds_now() + timeout_s;
    for (;;) {
      const double slice = give_up ? std::min(0.5, end - seconds_now()) : end - seconds_now();
      if (drive(lock, std::max(0.0, slice), done)) return Waited::done;
      if (seconds_now() >= end) return Waited::timed_out;
      if (give_up && give_up()) return Waited::gave_up;
    }
  }

  Reply wait(const ItemPtr& item, double timeout_s, const char* what) {
    std::unique_lock lock(m);
    const Waited w = drive_or_give_up(lock, timeout_s, [&] { return item->reply.has_value(); });
    if (w == Waited::done) return std::move(*item->reply);
    forget_locked(item);
    if (w == Waited::gave_up)
      throw Error(fmt::format("client {}: gave up waiting for the hub's answer to {}", o.who, what));
    throw TimeoutError(
        fmt::format("client {}: the hub at {} did not answer {} within {:.1f} s", o.who, o.address, what, timeout_s));
  }
  std::function<bool()> give_up;  // set before any request (read by API callers only)

  // Sends the request and waits for its answer; the hub's refusal is an rlx::Error.
  template <class Request>
  Reply request(const Request& req, double timeout_s) {
    return answer(enqueue(Request::kType, pack(req)), Request::kType, timeout_s);
  }
  Reply answer(const ItemPtr& item, MsgType type, double timeout_s) {
    Reply reply = wait(item, timeout_s, std::string(to_string(type)).c_str());
    if (reply.type == MsgType::ack) {
      auto a = unpack<Ack>(reply.frame(), limits);
      if (a.verdict.starts_with("error: "))
        throw Error(fmt::format("client {}: the hub refused {}: {}", o.who, to_string(type), a.verdict.substr(7)));
    }
    return reply;
  }
  template <class Answer, class Request>
  Answer call(const Request& req, double timeout_s) {
    return unpack<Answer>(request(req, timeout_s).frame(), limits);
  }

  // A batch: its head (unpacked from reply's first part), then each group's frame as the
  // worker sent it (checksum included). The batch is laid over those frames, which it keeps
  // (moved out of `reply`).
  BatchView assemble_batch(const BatchHead& head, Reply& reply) const {
    auto parts = std::make_shared<std::vector<zmq::message_t>>(std::move(reply.parts));
    std::vector<std::string_view> frames;
    frames.reserve(parts->size());
    for (const auto& part : *parts) frames.emplace_back(static_cast<const char*>(part.data()), part.size());
    try {
      return read_batch(head, std::move(frames), std::move(parts), limits);
    } catch (const Error& e) {
      throw Error(fmt::format("client {}: from the hub: {}", o.who, e.what()));
    }
  }
};

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Client::~Client() {
  try {
    close(impl_->o.request_timeout_s);
  } catch (...) {
  }
}

LeaseGrant Client::request_leases(uint32_t max_leases) {
  RLX_CHECK(impl_->o.role == "worker", "client {}: only workers take leases", impl_->o.who);
  return impl_->call<LeaseGrant>(LeaseRequest{max_leases}, impl_->o.request_timeout_s);
}

void Client::submit(TrajectoryGroup group) {
  auto& I = *impl_;
  RLX_CHECK(I.o.role == "worker", "client {}: only workers submit trajectory groups", I.o.who);
  if (group.worker.empty()) group.worker = I.o.who;
  const double start = seconds_now();
  std::unique_lock lock(I.m);
  // At most one group waits for credit here: memory stays bounded by the credits.
  auto waiting = [&] {
    return std::count_if(I.outbox.begin(), I.outbox.end(),
                         [](const auto& it) { return it->type == MsgType::trajectory_group; });
  };
  if (waiting() > 0) {
    ++I.counters.credit_waits;
    const auto w = I.drive_or_give_up(lock, I.o.credit_wait_s, [&] { return waiting() == 0; });
    I.counters.credit_wait_s += seconds_now() - start;
    if (w == Impl::Waited::gave_up)
      throw Error(fmt::format("client {}: gave up waiting for credit from the hub; lease {} was not sent", I.o.who,
                              group.lease_id));
    if (w == Impl::Waited::timed_out)
      throw Error(fmt::format("client {}: no credit from the hub for {:.0f} s (its replay buffer is full: are the learners "
                              "running? or its trajectory file cannot be written: see the hub's log); lease {} was not sent",
                              I.o.who, I.o.credit_wait_s, group.lease_id));
  }
  lock.unlock();
  I.enqueue(MsgType::trajectory_group, pack(group));
}

void Client::report_error(uint64_t lease_id, const std::string& kind, const std::string& reason) {
  impl_->enqueue(MsgType::error_record, pack(ErrorRecord{lease_id, kind, reason}));
}

bool Client::flush(double timeout_s) {
  auto& I = *impl_;
  std::unique_lock lock(I.m);
  return I.drive(lock, timeout_s, [&] {
    auto pending = [](const auto& item) {
      return item->type == MsgType::trajectory_group || item->type == MsgType::error_record;
    };
    return std::none_of(I.outbox.begin(), I.outbox.end(), pending) &&
           std::none_of(I.sent.begin(), I.sent.end(), [&](const auto& kv) { return pending(kv.second); });
  });
}

void Client::give_up_when(std::function<bool()> give_up) { impl_->give_up = std::move(give_up); }

bool Client::close(double timeout_s) {
  auto& I = *impl_;
  if (std::lock_guard lock(I.m); I.closed) return true;
  const bool all = flush(timeout_s);
  {
    std::lock_guard lock(I.m);
    I.outbox.clear();
    I.sent.clear();
  }
  // Goodbye: the hub counts this peer gone now, not after peer_timeout_s. Its answer is
  // awaited briefly, and not at all from a hub silent for hub_timeout_s (gone, most
  // likely); unanswered, the peer timeout does the same.
  auto bye = I.enqueue(MsgType::bye, pack(Bye{I.o.who}));
  std::unique_lock lock(I.m);
  const double wait_s = seconds_now() - I.last_heard < I.o.hub_timeout_s ? std::clamp(timeout_s, 0.1, 1.0) : 0.0;
  I.drive(lock, wait_s, [&] { return bye->reply.has_value(); });
  I.closed = true;
  I.outbox.clear();
  I.sent.clear();
  return all;
}

Batch Client::next_batch(BatchRequest request, double timeout_s) { return next_batch_view(request, timeout_s).copy(); }

BatchView Client::next_batch_view(BatchRequest request, double timeout_s) {
  auto& I = *impl_;
  RLX_CHECK(I.o.role == "learner", "client {}: only learners take batches", I.o.who);
  Impl::ItemPtr item;
  {
    std::lock_guard lock(I.m);
    if (I.ahead) {
      const auto& a = I.ahead_request;
      RLX_CHECK(a.max_groups == request.max_groups && a.max_tokens == request.max_tokens,
                "client {}: next_batch asks for max_groups {}, max_tokens {}, but the batch requested ahead "
                "(prefetch_batches) is for {}, {}: keep the request the same, or set prefetch_batches to 0",
                I.o.who, request.max_groups, request.max_tokens, a.max_groups, a.max_tokens);
      item = std::exchange(I.ahead, nullptr);
    }
    request.ack_batch_id = request.have_batch_id = I.last_batch_id;
  }
  // No lock while waiting: wait() takes it. A timeout forgets the request; the next one
  // says which batches arrived, and the hub sends again any that did not.
  if (!item) item = I.enqueue(MsgType::batch_request, pack(request));
  Impl::Reply reply = I.answer(item, MsgType::batch_request, timeout_s);
  const auto head = unpack<BatchHead>(reply.frame(), I.limits);
  // Ask for the next batch now, so that it travels while the caller trains this one. It
  // confirms the batch before this one (trained: the caller asked again).
  if (I.o.prefetch_batches > 0 && head.groups > 0 && !head.end) {
    BatchRequest next = request;
    next.have_batch_id = head.batch_id;
    {
      // A learner that publishes a version per batch trains the next one after its next
      // publish: only groups still within max_staleness then are picked.
      std::lock_guard lock(I.m);
      if (I.published >= 0) next.train_version = I.published + 1;
    }
    auto ahead = I.enqueue(MsgType::batch_request, pack(next));
    std::lock_guard lock(I.m);
    I.ahead = std::move(ahead);
    I.ahead_request = next;
  }
  BatchView b;
  try {
    b = I.assemble_batch(head, reply);
  } catch (...) {
    std::lock_guard lock(I.m);
    if (I.ahead) I.forget_locked(std::exchange(I.ahead, nullptr));  // the next request asks for this batch again
    throw;
  }
  std::lock_guard lock(I.m);
  if (!b.groups.empty()) I.last_batch_id = b.batch_id;
  return b;
}

void Client::publish_version(int64_t version) {
  (void)impl_->call<Ack>(VersionUpdate{version}, impl_->o.request_timeout_s);
  std::lock_guard lock(impl_->m);
  impl_->published = std::max(impl_->published, version);
}

std::vector<std::pair<std::string, double>> Client::hub_stats() {
  return impl_->call<Stats>(Stats{}, impl_->o.request_timeout_s).values;
}

void Client::checkpoint_saved(const std::string& name, uint64_t batch_id) {
  (void)impl_->call<Ack>(CheckpointSaved{.name = name, .batch_id = batch_id}, impl_->o.request_timeout_s);
}

void Client::control(ControlCommand command) { (void)impl_->call<Ack>(Control{command}, impl_->o.request_timeout_s); }

Client::Counters Client::counters() const {
  std::lock_guard lock(impl_->m);
  return impl_->counters;
}

}  // namespace rlx::bus
