#include "rlx/bus/hub.hpp"

#include <sstream>
#include <signal.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "rlx/bus/h5store.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "transport.hpp"

namespace rlx::bus {

using detail::seconds_now;

void HubOptions::validate() const {
  if (!dataset.empty() && !std::filesystem::exists(dataset))
    throw ConfigError(fmt::format("dataset: {} does not exist", dataset));
  if (curve.enabled() && curve.allowed_clients_file.empty())
    throw ConfigError("curve.allowed_clients_file: required with curve.key_file (CURVE without an allow-list admits any client)");
  if (peer_timeout_s <= heartbeat_s)
    throw ConfigError(fmt::format("peer_timeout_s ({}) must exceed heartbeat_s ({})", peer_timeout_s, heartbeat_s));
}

Limits HubOptions::limits() const { return {.max_frame_bytes = max_frame_mb << 20}; }

// --- the hub ---------------------------------------------------------------------------------

struct Hub::Impl {
  // A batch sent to a learner, kept until the learner confirms it.
  struct SentBatch {
    uint64_t batch_id = 0;
    std::vector<StoredGroup> groups;
    bool end = false;
  };
  struct Waiting {
    uint64_t seq;
    BatchRequest request;
  };
  struct Peer {
    std::string who, role, route;
    uint64_t incarnation = 0;
    bool connected = false;
    double last_heard = 0;
    uint64_t credits = 0;
    uint64_t last_seq = 0;
    // Learners: sent, not yet confirmed, oldest first; at most kMaxBatchesInFlight (the
    // batch a learner trains and the one it asked for ahead, ClientOptions::prefetch_batches).
    std::deque<SentBatch> in_flight;
    std::optional<Waiting> waiting;  // learners: a request not yet answered
    // Workers, for coalescing: groups taken this turn, when its last turn with groups
    // began, and its pace (seconds between its groups; 0: not known yet).
    uint64_t turn_groups = 0;
    double last_group_turn = 0, group_interval_s = 0;
  };

  HubOptions o;
  Limits limits;
  PromptSource source;
  LeaseTable leases;
  ReplayBuffer buffer;
  std::unique_ptr<TrajectoryStore> store;
  std::unique_ptr<zmq::context_t> own_context;  // CURVE hubs: their own ZAP handler
  zmq::context_t* context;
  std::unique_ptr<detail::ZapHandler> zap;
  zmq::socket_t router;
  std::string endpoint;

  std::map<std::string, Peer> peers;           // by name
  std::map<std::string, std::string> by_route;  // routing id -> name
  std::deque<std::string> waiting_order;        // learners with a request, oldest first
  // Workers holding leases in a restored state: their incarnation is unknown, so on their
  // hello (or after peer_timeout_s without one) their leases go back to be issued again.
  std::map<std::string, double> restored_holders;  // name -> deadline
  int64_t version = 0;
  uint64_t accepted_total = 0;
  uint64_t next_batch_id = 1;
  std::map<std::string, uint64_t> counts;
  // Acks of accepted input, sent together: after ack_delay_ms, or once credits_per_peer/2
  // wait, so that ZeroMQ and the worker wake once for several. Any other frame flushes them
  // first (a credit update must not overtake an older ack: the worker keeps the latest
  // credits).
  std::vector<std::pair<std::string, std::string>> acks_out;  // route, frame
  double acks_since = 0;                                      // when the oldest of acks_out was made
  double last_tick = 0, last_heartbeat = 0, last_save = 0, last_store_retry = 0;
  uint64_t turn_groups = 0;  // trajectory groups taken this turn (coalescing)
  bool stop_requested = false;
  static constexpr size_t kMaxPeers = 4096;
  static constexpr size_t kMaxBatchesInFlight = 2;

  Impl(HubOptions options, std::vector<std::string> records)
      : o(std::move(options)),
        limits(o.limits()),
        source(std::move(records), {.seed = o.seed, .epochs = o.epochs, .shuffle = o.shuffle}),
        leases(source, {.group_size = o.group_size, .timeout_s = o.lease_timeout_s, .max_attempts = o.max_attempts}),
        buffer(o.replay) {
    config::check_bounds(o, "hub");
    o.validate();
    if (!o.trajectory_file.empty()) {
      // A file size limit (ulimit -f; Slurm passes the submitting shell's on) must end in the
      // store's error and the hub's back-pressure, not in SIGXFSZ ending the hub. A handler
      // the application set is left alone.
      struct sigaction current {};
      if (::sigaction(SIGXFSZ, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGXFSZ, SIG_IGN);
      store = std::make_unique<TrajectoryStore>(o.trajectory_file, StoreOptions{.max_pending_bytes = o.store_max_pending_mb << 20});
    }
    if (!o.state_file.empty() && std::filesystem::exists(o.state_file)) restore(read_snapshot(o.state_file, limits));
    if (o.curve.enabled()) {
      own_context = std::make_unique<zmq::context_t>(1);
      context = own_context.get();
      const auto keys = read_public_keys(o.curve.allowed_clients_file);
      zap = std::make_unique<detail::ZapHandler>(*context, std::set<std::string>(keys.begin(), keys.end()));
    } else {
      context = &detail::shared_context();
    }
    router = zmq::socket_t(*context, zmq::socket_type::router);
    detail::configure_socket(router, limits, o.queue_depth);
    router.set(zmq::sockopt::router_mandatory, 1);
    if (o.curve.enabled()) detail::make_curve_server(router, o.curve);
    try {
      router.bind(o.address);
    } catch (const zmq::error_t& e) {
      throw Error(fmt::format("hub: cannot bind {}: {}", o.address, e.what()));
    }
    endpoint = router.get(zmq::sockopt::last_endpoint);
    last_tick = last_heartbeat = last_save = seconds_now();
    log::info("hub: serving {} ({} prompts, group size {}, {} epochs)", endpoint, source.size(), o.group_size, o.epochs);
  }

  void count(const std::string& what, uint64_t n = 1) { counts[what] += n; }

  // --- sending ---
  template <class T>
  bool send(Peer& p, const T& msg, uint64_t seq) {
    flush_acks();  // first: a worker takes its credits from the latest ack, so order matters
    if (!p.connected) return false;
    if (detail::try_send_to(router, p.route, pack(msg, seq))) return true;
    count("send_failed");
    return false;
  }
  template <class T>
  void send_route(const std::string& route, const T& msg, uint64_t seq) {
    flush_acks();
    if (!detail::try_send_to(router, route, pack(msg, seq))) count("send_failed");
  }
  // A batch is [BatchHead, group frames...]: the frames go as the workers sent them, no copy.
  bool send_batch(Peer& p, const SentBatch& b, uint64_t seq) {
    flush_acks();
    if (!p.connected) return false;
    std::vector<detail::SharedBytes> frames;
    frames.reserve(b.groups.size());
    for (const auto& g : b.groups) frames.push_back({g.frame, g.frame_bytes});
    const BatchHead head{.batch_id = b.batch_id, .end = b.end, .groups = b.groups.size()};
    if (detail::try_send_to(router, p.route, pack(head, seq), frames)) return true;
    count("send_failed");
    return false;
  }
  void flush_acks_due() {
    if (acks_out.size() >= std::max<size_t>(1, o.credits_per_peer / 2) || seconds_now() - acks_since >= o.ack_delay_ms / 1e3)
      flush_acks();
  }
  void flush_acks() {
    for (auto& [route, frame] : acks_out)
      if (!detail::try_send_to(router, route, std::move(frame))) count("send_failed");
    acks_out.clear();
  }

  // --- credits ---
  uint64_t free_slots() const {
    if (store && store->full()) return 0;  // no credit until the trajectory file takes writes again
    uint64_t held = 0;
    for (const auto& [_, p] : peers) held += p.credits;
    const uint64_t used = buffer.size() + held;
    return used >= o.replay.capacity_groups ? 0 : o.replay.capacity_groups - used;
  }
  bool top_up(Peer& p) {
    if (!p.connected || p.role != "worker" || p.credits >= o.credits_per_peer) return false;
    const uint64_t grant = std::min<uint64_t>(o.credits_per_peer - p.credits, free_slots());
    p.credits += grant;
    return grant > 0;
  }
  void distribute_credits() {
    for (auto& [_, p] : peers)
      if (top_up(p)) send(p, Ack{.seq = p.last_seq, .credits = p.credits}, p.last_seq);
  }

  // --- the staleness gate (AReaL-style): leases run at most max_staleness versions ahead ---
  bool gate_open() const {
    if (o.groups_per_version == 0 || leases.pending_reissue() > 0) return true;
    const uint64_t started = accepted_total + leases.outstanding();
    const auto limit = static_cast<uint64_t>(std::max<int64_t>(0, version + o.replay.max_staleness + 1)) * o.groups_per_version;
    return started < limit;
  }

  // --- peers ---
  // A peer gone: lost (`why`), or left, having said goodbye (no `why`). A learner's batches in
  // flight stay its own until it says hello again; a worker's open leases are re-issued now.
  void lose(Peer& p, std::optional<std::string> why) {
    const auto level = why ? log::Level::warn : log::Level::info;
    if (why) log::warn("hub: {} {} lost: {}", p.role, p.who, *why);
    count(why ? "peers_lost" : "peers_left");
    by_route.erase(p.route);
    p.connected = false;
    p.credits = 0;
    p.waiting.reset();
    std::erase(waiting_order, p.who);
    const size_t waiting_before = leases.pending_reissue();
    if (p.role == "worker")
      for (const auto& rec : leases.worker_lost(p.who))
        log::write(level, fmt::format("hub: lease {} ended: {}", rec.lease_id, rec.reason));
    const size_t reissued = leases.pending_reissue() - waiting_before;
    if (!why) log::info("hub: {} {} left{}", p.role, p.who, reissued ? fmt::format("; {} open leases go to others", reissued) : "");
  }
  void requeue_in_flight(Peer& p) {  // newest first, so that the oldest ends up in front
    for (auto it = p.in_flight.rbegin(); it != p.in_flight.rend(); ++it) {
      count("batches_requeued");
      buffer.requeue_front(std::move(it->groups));
    }
    p.in_flight.clear();
  }
  // Batches up to `batch_id` are confirmed: trained, never to be sent again.
  static void confirm(Peer& p, uint64_t batch_id) {
    while (!p.in_flight.empty() && p.in_flight.front().batch_id <= batch_id) p.in_flight.pop_front();
  }

  void on_hello(const std::string& route, uint64_t seq, Hello h) {
    if (h.role != "worker" && h.role != "learner" && h.role != "monitor")
      throw Error(fmt::format("hello from '{}': role '{}' is not worker, learner or monitor", h.who, h.role));
    RLX_CHECK(!h.who.empty() && h.who.size() <= 256, "hello: a peer name must have 1 to 256 characters");
    if (auto r = by_route.find(route); r != by_route.end() && r->second != h.who)
      if (auto old = peers.find(r->second); old != peers.end()) lose(old->second, "said hello under a new name");
    if (h.role == "worker" && restored_holders.erase(h.who) > 0) leases.worker_lost(h.who);
    auto it = peers.find(h.who);
    if (it == peers.end()) {
      RLX_CHECK(peers.size() < kMaxPeers, "hello from '{}': the hub already has {} peers", h.who, kMaxPeers);
      it = peers.emplace(h.who, Peer{.who = h.who, .role = h.role, .incarnation = h.incarnation}).first;
    }
    Peer& p = it->second;
    if (p.connected) by_route.erase(p.route);
    if (p.incarnation != h.incarnation || p.role != h.role) {
      if (p.connected) lose(p, "restarted");
      else if (p.role == "worker") leases.worker_lost(p.who);
      requeue_in_flight(p);  // a restarted learner never received that batch
      p.incarnation = h.incarnation;
      p.role = h.role;
    }
    p.route = route;
    p.connected = true;
    p.credits = 0;
    p.last_seq = seq;
    p.last_heard = seconds_now();
    by_route[route] = p.who;
    top_up(p);
    count("hellos");
    send(p, Welcome{.credits = p.credits, .heartbeat_s = o.heartbeat_s, .lease_timeout_s = o.lease_timeout_s}, seq);
  }

  void on_lease_request(Peer& p, uint64_t seq, const LeaseRequest& req) {
    RLX_CHECK(p.role == "worker", "{} asked for leases but is a {}", p.who, p.role);
    LeaseGrant grant;
    const uint32_t n = std::min(req.max_leases, o.max_leases_per_request);
    const double now = seconds_now();
    const int64_t min_version = std::max<int64_t>(0, version - o.replay.max_staleness);
    for (uint32_t i = 0; i < n && gate_open(); ++i) {
      auto lease = leases.issue(p.who, now, min_version);
      if (!lease) break;
      grant.leases.push_back(std::move(*lease));
    }
    grant.exhausted = grant.leases.empty() && leases.done();
    count("leases_issued", grant.leases.size());
    if (grant.leases.empty() && !grant.exhausted) count("lease_requests_unmet");
    send(p, grant, seq);
  }

  // `g` is read in place from `body`, which the buffer keeps when the group is accepted.
  void on_group(Peer& p, uint64_t seq, const GroupView& g, const std::shared_ptr<zmq::message_t>& body) {
    RLX_CHECK(p.role == "worker", "{} sent a trajectory group but is a {}", p.who, p.role);
    if (p.credits > 0) --p.credits;
    else count("groups_over_credit");
    p.last_seq = seq;
    ++p.turn_groups;
    std::string verdict;
    const Lease* lease = leases.find(g.lease_id);
    if (!lease) {
      verdict = "duplicate";
    } else if (auto why = group_mismatch(g, *lease)) {
      log::warn("hub: lease {} from {}: invalid group: {}", g.lease_id, p.who, *why);
      leases.fail(g.lease_id, "data", "invalid trajectory group: " + *why);
      verdict = "invalid";
    } else {
      StoredGroup stored = StoredGroup::of(std::shared_ptr<const char>(body, static_cast<const char*>(body->data())),
                                           body->size(), g);
      switch (buffer.admit(stored, version)) {
        case ReplayBuffer::Verdict::accepted:
          if (store && !store->append(g, version)) {  // the file cannot take it now: the worker keeps it
            verdict = "full";
            count("groups_store_full");
            leases.hold(g.lease_id, p.who, seconds_now());
            break;
          }
          verdict = "accepted";
          leases.complete(g.lease_id);
          ++accepted_total;
          buffer.push_accepted(std::move(stored));
          break;
        case ReplayBuffer::Verdict::stale:
          verdict = "stale";  // re-issued: the prompt is not skipped
          leases.fail(g.lease_id, "infra", fmt::format("stale group (hub version {})", version));
          break;
        case ReplayBuffer::Verdict::filtered:
          verdict = "filtered";
          leases.fail(g.lease_id, "filtered", "all rewards equal");
          break;
        case ReplayBuffer::Verdict::full:
          verdict = "full";  // only a worker ignoring its credits gets here; the lease stays open
          leases.hold(g.lease_id, p.who, seconds_now());
          break;
      }
    }
    count("groups_" + verdict);
    top_up(p);
    if (p.connected) {
      if (acks_out.empty()) acks_since = seconds_now();
      acks_out.emplace_back(p.route, pack(Ack{.seq = seq, .credits = p.credits, .duplicate = verdict == "duplicate", .verdict = verdict}, seq));
    }
    serve_learners();
  }

  void on_error_record(Peer& p, uint64_t seq, const ErrorRecord& rec) {
    RLX_CHECK(p.role == "worker", "{} sent an error record but is a {}", p.who, p.role);
    RLX_CHECK(rec.kind == "infra" || rec.kind == "data", "error record for lease {}: kind '{}' is not infra or data",
              rec.lease_id, rec.kind);
    const bool open = leases.is_open(rec.lease_id);
    if (open) leases.fail(rec.lease_id, rec.kind, fmt::format("{} (reported by {})", rec.reason, p.who));
    count(open ? "worker_errors" : "worker_errors_duplicate");
    send(p, Ack{.seq = seq, .credits = p.credits, .duplicate = !open, .verdict = open ? "recorded" : "duplicate"}, seq);
  }

  void on_batch_request(Peer& p, uint64_t seq, const BatchRequest& req) {
    RLX_CHECK(p.role == "learner", "{} asked for a batch but is a {}", p.who, p.role);
    RLX_CHECK(req.have_batch_id >= req.ack_batch_id, "batch request: it confirms batch {} but has only received up to {}",
              req.ack_batch_id, req.have_batch_id);
    confirm(p, req.ack_batch_id);
    // A batch sent that the learner does not have (a reply lost to a reconnect, or to a
    // request it gave up on): send it again, the oldest first.
    for (const auto& b : p.in_flight)
      if (b.batch_id > req.have_batch_id) {
        count("batches_resent");
        send_batch(p, b, seq);
        return;
      }
    RLX_CHECK(p.in_flight.size() < kMaxBatchesInFlight,
              "learner {} asked for a batch while holding {} it has not confirmed (batches {} and {}): confirm one first",
              p.who, p.in_flight.size(), p.in_flight.front().batch_id, p.in_flight.back().batch_id);
    if (!p.waiting) waiting_order.push_back(p.who);
    p.waiting = Waiting{seq, req};
    serve_learners();
  }

  void serve_learners() {
    for (auto it = waiting_order.begin(); it != waiting_order.end();) {
      Peer& p = peers.at(*it);
      const BatchRequest& r = p.waiting->request;
      // A batch asked for ahead takes only groups still fresh at the version it will be
      // trained with; the rest wait to be evicted when that version comes.
      const int64_t train_version = std::max(version, r.train_version);
      if (!buffer.has_batch(r.max_groups, r.max_tokens, train_version) && !leases.done()) {
        ++it;
        continue;
      }
      SentBatch b{.batch_id = next_batch_id++, .groups = buffer.pop(r.max_groups, r.max_tokens, train_version)};
      // The end: no lease left, and nothing this learner could still train.
      b.end = leases.done() && !buffer.has_batch(0, 0, train_version);
      const uint64_t seq = p.waiting->seq;
      p.waiting.reset();
      it = waiting_order.erase(it);
      if (!send_batch(p, b, seq)) {
        buffer.requeue_front(std::move(b.groups));
        continue;
      }
      count("batches_sent");
      count("groups_delivered", b.groups.size());
      if (!b.groups.empty()) p.in_flight.push_back(std::move(b));
    }
    distribute_credits();
  }

  void on_version(Peer& p, uint64_t seq, const VersionUpdate& u) {
    RLX_CHECK(p.role == "learner", "{} published a weight version but is a {}", p.who, p.role);
    if (u.version > version) {
      version = u.version;
      const size_t evicted = buffer.evict_stale(version);
      if (evicted) log::warn("hub: version {}: evicted {} stale groups", version, evicted);
    }
    send(p, Ack{.seq = seq, .verdict = "version"}, seq);
  }

  void on_control(Peer& p, uint64_t seq, const Control& c) {
    std::string verdict = c.command;
    if (c.command == "save") {
      RLX_CHECK(!o.state_file.empty(), "save requested, but the hub has no state_file");
      save(o.state_file);
    } else if (c.command.starts_with("checkpoint ")) {
      // "checkpoint NAME BATCH": a learner checkpointed after training batch BATCH (0:
      // none yet), which is therefore confirmed; the hub's state is saved beside the
      // state file as NAME, and a resume from that checkpoint restores the hub from it.
      RLX_CHECK(p.role == "learner", "control checkpoint from {}, a {}: only learners checkpoint", p.who, p.role);
      RLX_CHECK(!o.state_file.empty(), "checkpoint requested, but the hub has no state_file");
      std::istringstream words(c.command.substr(11));
      std::string name;
      uint64_t batch_id = 0;
      RLX_CHECK(words >> name >> batch_id && words.eof(), "control checkpoint: expected 'checkpoint NAME BATCH_ID', got '{}'",
                c.command);
      RLX_CHECK(name.size() <= 128 && name[0] != '.' &&
                    name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") ==
                        std::string::npos,
                "control checkpoint: '{}' is not a plain file name (letters, digits, _ . -; at most 128)", name);
      confirm(p, batch_id);
      save((std::filesystem::path(o.state_file).parent_path() / name).string());
    } else if (c.command == "stop") {
      stop_requested = true;
    } else {
      throw Error(fmt::format("control: unknown command '{}' (save, checkpoint NAME BATCH_ID, stop)", c.command));
    }
    send(p, Ack{.seq = seq, .verdict = verdict}, seq);
  }

  // A peer that has not said Hello (a restarted hub, or a peer declared lost) is asked to.
  bool introduced(Peer* peer, const std::string& route, uint64_t seq) {
    if (!peer) {
      count("frames_from_unknown_peers");
      send_route(route, Welcome{.heartbeat_s = o.heartbeat_s, .lease_timeout_s = o.lease_timeout_s, .rehello = true}, seq);
      return false;
    }
    peer->last_heard = seconds_now();
    return true;
  }

  void on_frame(const std::string& route, const std::shared_ptr<zmq::message_t>& body) {
    Frame frame;
    try {
      frame = decode_frame(std::string_view(static_cast<const char*>(body->data()), body->size()), limits);
    } catch (const FrameError& e) {
      reject(route, std::string(to_string(e.reason())), e.what());
      return;
    }
    const auto r = by_route.find(route);
    Peer* peer = r == by_route.end() ? nullptr : &peers.at(r->second);
    try {
      if (frame.type == MsgType::trajectory_group) {  // read in place: the frame is kept, never copied
        ++turn_groups;
        const GroupView g = parse_group(frame, limits);
        if (introduced(peer, route, frame.seq)) on_group(*peer, frame.seq, g, body);
        return;
      }
      dispatch(frame, limits, [&](auto msg) {
        using T = decltype(msg);
        if constexpr (std::is_same_v<T, Hello>) {
          on_hello(route, frame.seq, std::move(msg));
          return;
        }
        if constexpr (std::is_same_v<T, Bye>) {  // never asked to say hello first
          if (peer) lose(*peer, std::nullopt);
          send_route(route, Ack{.seq = frame.seq, .verdict = peer ? "left" : "unknown"}, frame.seq);
          return;
        }
        if (!introduced(peer, route, frame.seq)) return;
        if constexpr (std::is_same_v<T, LeaseRequest>) on_lease_request(*peer, frame.seq, msg);
        else if constexpr (std::is_same_v<T, ErrorRecord>) on_error_record(*peer, frame.seq, msg);
        else if constexpr (std::is_same_v<T, BatchRequest>) on_batch_request(*peer, frame.seq, msg);
        else if constexpr (std::is_same_v<T, VersionUpdate>) on_version(*peer, frame.seq, msg);
        else if constexpr (std::is_same_v<T, Control>) on_control(*peer, frame.seq, msg);
        else if constexpr (std::is_same_v<T, Stats>) send(*peer, Stats{stats()}, frame.seq);
        else if constexpr (std::is_same_v<T, Heartbeat>) count("heartbeats");
        else throw Error(fmt::format("a {} message is sent by the hub, not to it", to_string(T::kType)));
      });
    } catch (const FrameError& e) {
      reject(route, std::string(to_string(e.reason())), e.what());
    } catch (const Error& e) {
      reject(route, "invalid", e.what());
      if (peer || frame.type == MsgType::hello)  // tell an introduced peer why, so its call fails fast
        send_route(route, Ack{.seq = frame.seq, .verdict = std::string("error: ") + e.what()}, frame.seq);
    }
  }

  void reject(const std::string& route, const std::string& reason, const std::string& what) {
    count("rejected_" + reason);
    const uint64_t n = ++counts["rejected"];
    if (n <= 20 || (n & (n - 1)) == 0) {  // the first 20, then at powers of two: bounded log volume
      const auto r = by_route.find(route);
      log::warn("hub: rejected a frame from {} ({}): {}", r == by_route.end() ? "an unknown peer" : r->second, reason, what);
    }
  }

  void tick() {
    const double now = seconds_now();
    for (auto it = restored_holders.begin(); it != restored_holders.end();) {
      if (now < it->second) {
        ++it;
        continue;
      }
      for (const auto& rec : leases.worker_lost(it->first)) log::warn("hub: lease {} ended: {}", rec.lease_id, rec.reason);
      it = restored_holders.erase(it);
    }
    for (auto& [_, p] : peers)
      if (p.connected && now - p.last_heard > o.peer_timeout_s)
        lose(p, fmt::format("silent for {:.1f} s", now - p.last_heard));
    std::erase_if(peers, [](const auto& kv) { return !kv.second.connected && kv.second.in_flight.empty(); });
    if (now - last_heartbeat >= o.heartbeat_s) {
      last_heartbeat = now;
      for (auto& [_, p] : peers) send(p, Heartbeat{"hub"}, 0);
    }
    for (const auto& rec : leases.expire(now)) log::warn("hub: lease {} ended: {}", rec.lease_id, rec.reason);
    serve_learners();
    retry_store(now);
    if (o.save_every_s > 0 && !o.state_file.empty() && now - last_save >= o.save_every_s) {
      try {
        save(o.state_file);
      } catch (const Error& e) {  // the last good save stays; the next period tries again
        last_save = now;
        count("save_failures");
        log::warn("hub: saving {} failed: {}", o.state_file, e.what());
      }
    }
    last_tick = now;
  }

  // Groups staged for the trajectory file go to it within StoreOptions::max_stage_age_s.
  // After a failed write, a retry every second; credits again once it succeeds (a full
  // store gave none).
  void retry_store(double now) {
    if (store) (void)store->write_if_due();  // readers of the file see a slow run too
    if (!store || store->last_error().empty() || now - last_store_retry < 1.0) return;
    last_store_retry = now;
    if (store->write_pending()) distribute_credits();
  }

  void poll(double timeout_s) {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    double wait_s = std::min(timeout_s, std::max(0.0, last_tick + std::min(0.25, o.heartbeat_s / 2) - seconds_now()));
    if (!acks_out.empty()) wait_s = std::min(wait_s, std::max(0.0, acks_since + o.ack_delay_ms / 1e3 - seconds_now()));
    // Whole milliseconds (zmq_poll's unit), rounded up while acks wait: no busy loop. A
    // signal (SIGTERM asks to stop) interrupts the wait: the caller checks its flag.
    const auto wait_ms = static_cast<int64_t>(acks_out.empty() ? 1000 * wait_s : std::ceil(1000 * wait_s));
    if (!detail::poll(&item, 1, std::chrono::milliseconds(wait_ms))) {
      flush_acks_due();
      return;
    }
    const double turn_start = seconds_now();
    turn_groups = 0;
    for (int i = 0; i < 256; ++i) {  // drain a bounded number per turn
      zmq::message_t route;
      if (!router.recv(route, zmq::recv_flags::dontwait)) break;
      if (!route.more()) {
        count("rejected_parts");
        continue;
      }
      auto body = std::make_shared<zmq::message_t>();  // shared: an accepted group's frame stays in the buffer
      (void)router.recv(*body, zmq::recv_flags::none);
      if (body->more()) {  // more than [route, frame]: drop the rest
        count("rejected_parts");
        while (body->more()) (void)router.recv(*body, zmq::recv_flags::none);
        continue;
      }
      on_frame(route.to_string(), body);
    }
    flush_acks_due();
    if (seconds_now() - last_tick >= std::min(0.25, o.heartbeat_s / 2)) tick();
    if (turn_groups > 0) coalesce(turn_start);
  }

  // After a turn that took groups: learn each worker's pace, then wait a little so that
  // the next turn takes several (one wake-up each costs the hub a context switch, and
  // ZeroMQ's I/O thread a signal). The fastest worker sending lately bounds the wait.
  void coalesce(double turn_start) {
    double fastest = std::numeric_limits<double>::infinity();
    for (auto& [_, p] : peers) {
      if (p.role != "worker") continue;
      if (p.turn_groups > 0) {
        if (p.last_group_turn > 0 && turn_start - p.last_group_turn < 1.0) {  // a pause of a second or more says nothing
          const double per = (turn_start - p.last_group_turn) / static_cast<double>(p.turn_groups);
          p.group_interval_s = p.group_interval_s > 0 ? 0.8 * p.group_interval_s + 0.2 * per : per;
        }
        p.last_group_turn = turn_start;
        p.turn_groups = 0;
      }
      if (p.connected && p.last_group_turn > 0 && turn_start - p.last_group_turn < 1.0)
        fastest = std::min(fastest, p.group_interval_s);  // 0 (pace unknown): no wait
    }
    if (!std::isfinite(fastest)) return;
    const double now = seconds_now();
    const double wait = coalesce_wait_s(o.coalesce_us / 1e6, fastest, o.credits_per_peer,
                                        acks_out.empty() ? -1.0 : acks_since + o.ack_delay_ms / 1e3 - now);
    if (wait <= 0) return;
    count("coalesce_waits");
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }

  HubSnapshot snapshot() const {
    HubSnapshot s;
    s.cursor = source.cursor();
    s.leases = leases.state(seconds_now());
    for (const auto& g : buffer.contents()) s.buffer.push_back(g.unpack(limits));
    s.replay_counts = buffer.counts();
    s.version = version;
    s.accepted_total = accepted_total;
    s.next_batch_id = next_batch_id;
    s.stored_groups = store ? store->groups() : 0;
    for (const auto& [who, p] : peers)
      for (const auto& b : p.in_flight) {
        Batch batch{.batch_id = b.batch_id, .end = b.end};
        for (const auto& g : b.groups) batch.groups.push_back(g.unpack(limits));
        s.in_flight.push_back({who, std::move(batch)});
      }
    return s;
  }

  void save(const std::string& path) {
    if (store) store->flush();
    write_snapshot(snapshot(), path);
    last_save = seconds_now();
    count("saves");
  }

  void restore(HubSnapshot s) {
    source.restore(s.cursor);
    leases.restore(s.leases, seconds_now());
    for (const auto& a : s.leases.active) restored_holders[a.worker] = seconds_now() + o.peer_timeout_s;
    std::deque<StoredGroup> buffered;
    for (const auto& g : s.buffer) buffered.push_back(StoredGroup::of(g));
    buffer.restore(std::move(buffered), s.replay_counts);
    version = s.version;
    accepted_total = s.accepted_total;
    next_batch_id = s.next_batch_id;
    if (store) {
      RLX_CHECK(store->groups() >= s.stored_groups, "{} has {} groups, the saved hub state expects at least {}",
                o.trajectory_file, store->groups(), s.stored_groups);
      store->truncate(s.stored_groups);
    }
    // Unconfirmed batches wait for their learner: sent again if it reconnects, returned
    // to the buffer if it restarts.
    for (auto& f : s.in_flight) {
      SentBatch b{.batch_id = f.batch.batch_id, .end = f.batch.end};
      for (const auto& g : f.batch.groups) b.groups.push_back(StoredGroup::of(g));
      auto& p = peers.try_emplace(f.learner, Peer{.who = f.learner, .role = "learner"}).first->second;
      RLX_CHECK(p.in_flight.size() < kMaxBatchesInFlight && (p.in_flight.empty() || p.in_flight.back().batch_id < b.batch_id),
                "{}: learner {} has more than {} unconfirmed batches, or they are out of order", o.state_file, f.learner,
                kMaxBatchesInFlight);
      p.in_flight.push_back(std::move(b));
    }
    log::info("hub: restored {} (epoch {} position {}, {} leases out, {} groups buffered)", o.state_file,
              s.cursor.epoch, s.cursor.position, leases.outstanding(), buffer.size());
  }

  std::vector<std::pair<std::string, double>> stats() const {
    std::vector<std::pair<std::string, double>> out;
    auto add = [&](std::string k, double v) { out.emplace_back(std::move(k), v); };
    add("version", static_cast<double>(version));
    add("buffer_groups", static_cast<double>(buffer.size()));
    add("buffer_capacity", static_cast<double>(o.replay.capacity_groups));
    add("leases_outstanding", static_cast<double>(leases.outstanding()));
    add("leases_pending_reissue", static_cast<double>(leases.pending_reissue()));
    add("leases_completed", static_cast<double>(leases.completed()));
    add("lease_errors", static_cast<double>(leases.errors().size()));
    add("accepted_total", static_cast<double>(accepted_total));
    const auto& c = buffer.counts();
    add("replay_stale", static_cast<double>(c.stale));
    add("replay_filtered", static_cast<double>(c.filtered));
    add("replay_evicted_stale", static_cast<double>(c.evicted_stale));
    uint64_t connected = 0, credits = 0;
    for (const auto& [_, p] : peers) connected += p.connected, credits += p.credits;
    add("peers_connected", static_cast<double>(connected));
    add("credits_outstanding", static_cast<double>(credits));
    add("finished", leases.done() && buffer.size() == 0 ? 1 : 0);
    if (store) {
      add("store_groups", static_cast<double>(store->groups()));
      add("store_pending_mb", static_cast<double>(store->pending_bytes()) / (1 << 20));
      add("store_write_failures", static_cast<double>(store->write_failures()));
    }
    if (zap) add("curve_refused", static_cast<double>(zap->refused())), add("curve_accepted", static_cast<double>(zap->accepted()));
    for (const auto& [k, v] : counts) add(k, static_cast<double>(v));
    return out;
  }
};

Hub::Hub(HubOptions options) : Hub(options, load_jsonl(options.dataset)) {}
Hub::Hub(HubOptions options, std::vector<std::string> records)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(records))) {}
Hub::~Hub() = default;

void Hub::run(const std::atomic<bool>& stop) {
  while (!stop && !impl_->stop_requested) impl_->poll(0.1);
  if (!impl_->o.state_file.empty()) impl_->save(impl_->o.state_file);
  impl_->flush_acks();  // the groups they answer are in the saved state
}
void Hub::poll(double timeout_s) { impl_->poll(timeout_s); }
std::string Hub::endpoint() const { return impl_->endpoint; }
HubSnapshot Hub::snapshot() const { return impl_->snapshot(); }
void Hub::save_state(const std::string& path) const { const_cast<Impl&>(*impl_).save(path); }
std::vector<std::pair<std::string, double>> Hub::stats() const { return impl_->stats(); }
int64_t Hub::version() const { return impl_->version; }
bool Hub::finished() const { return impl_->leases.done() && impl_->buffer.size() == 0; }

}  // namespace rlx::bus
