// The hub's state and event loop (internal to src/bus): the loop, credits and sending in
// hub.cpp, the protocol's messages in hub_messages.cpp, the saved state in hub_snapshot.cpp.
#pragma once

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
  std::unique_ptr<detail::IpcFile> ipc_file;  // hub.sock, removed at the end
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

  Impl(HubOptions options, std::vector<std::string> records);

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
  bool send_batch(Peer& p, const SentBatch& b, uint64_t seq);
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
  uint64_t free_slots() const;
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
  void lose(Peer& p, std::optional<std::string> why);
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

  void on_hello(const std::string& route, uint64_t seq, Hello h);

  void on_lease_request(Peer& p, uint64_t seq, const LeaseRequest& req);

  // `g` is read in place from `body`, which the buffer keeps when the group is accepted.
  void on_group(Peer& p, uint64_t seq, const GroupView& g, const std::shared_ptr<zmq::message_t>& body);

  void on_error_record(Peer& p, uint64_t seq, const ErrorRecord& rec);

  void on_batch_request(Peer& p, uint64_t seq, const BatchRequest& req);

  void serve_learners();

  void on_version(Peer& p, uint64_t seq, const VersionUpdate& u);

  void on_control(Peer& p, uint64_t seq, const Control& c);

  void on_checkpoint_saved(Peer& p, uint64_t seq, const CheckpointSaved& c);

  // A peer that has not said Hello (a restarted hub, or a peer declared lost) is asked to.
  bool introduced(Peer* peer, const std::string& route, uint64_t seq);

  void on_frame(const std::string& route, const std::shared_ptr<zmq::message_t>& body);

  void reject(const std::string& route, const std::string& reason, const std::string& what);

  void tick();

  // Groups staged for the trajectory file go to it within StoreOptions::max_stage_age_s.
  // After a failed write, a retry every second; credits again once it succeeds (a full
  // store gave none).
  void retry_store(double now) {
    if (store) (void)store->write_if_due();  // readers of the file see a slow run too
    if (!store || store->last_error().empty() || now - last_store_retry < 1.0) return;
    last_store_retry = now;
    if (store->write_pending()) distribute_credits();
  }

  void poll(double timeout_s);

  // After a turn that took groups: learn each worker's pace, then wait a little so that
  // the next turn takes several (one wake-up each costs the hub a context switch, and
  // ZeroMQ's I/O thread a signal). The fastest worker sending lately bounds the wait.
  void coalesce(double turn_start);

  HubSnapshot snapshot() const;

  void save(const std::string& path);

  void restore(HubSnapshot s);

  std::vector<std::pair<std::string, double>> stats() const;
};

}  // namespace rlx::bus
