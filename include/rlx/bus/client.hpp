// A rollout worker's or learner's connection to the hub (a DEALER socket driven by a
// background I/O thread, so heartbeats flow while the caller generates or trains).
//
// Every frame carries a sequence number. The hub acknowledges trajectory groups and
// error records and answers requests; anything not acknowledged is sent again after a
// reconnect (the hub stopped answering for hub_timeout_s) or when the hub asks for a
// new Hello (it restarted, or had declared this peer lost). Trajectory groups are sent
// only while the hub has granted credit; submit() blocks, at most credit_wait_s, when
// none is left.
//
//   rlx::bus::Client c({.address = "ipc:///tmp/rlx-hub.sock", .who = "worker-0"});
//   for (;;) {
//     auto grant = c.request_leases(4);
//     if (grant.exhausted) break;
//     for (auto& lease : grant.leases) c.submit(generate(lease));
//   }
//   c.flush(60);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rlx/bus/channel.hpp"
#include "rlx/bus/message.hpp"
#include "rlx/core/error.hpp"

namespace rlx::bus {

struct ClientOptions {
  std::string address = "ipc:///tmp/rlx-hub.sock";
  std::string who;                 // unique name of this worker or learner
  std::string role = "worker";     // worker, learner or monitor
  uint64_t incarnation = 0;        // changes when the process restarts (0: derived from pid and time)
  double heartbeat_s = 1.0;
  double hub_timeout_s = 10.0;     // no frame from the hub this long: reconnect
  double request_timeout_s = 60.0; // a request unanswered this long fails
  double credit_wait_s = 60.0;     // submit() waits at most this long for credit
  uint64_t max_frame_mb = 256;
  int queue_depth = 1000;
  // Learners: batches asked for ahead. With 1, next_batch() sends the request for the next
  // batch as soon as a batch arrives, so it travels while the caller trains. A learner that
  // publishes a weight version per batch trains that one after its next publish, so the
  // hub picks only groups that will still be within replay.max_staleness then (the others
  // are evicted when that version comes). Every request must ask for the same batch shape.
  int prefetch_batches = 0;
  CurveOptions curve;

  template <class V>
  void visit(V& v) {
    v("address", address, "the hub's endpoint");
    v("who", who, "unique name of this peer");
    v("role", role, "worker, learner or monitor");
    v("incarnation", incarnation, "changes on every restart (0: derived from pid and time)");
    v("heartbeat_s", heartbeat_s, "heartbeat interval", config::seconds());
    v("hub_timeout_s", hub_timeout_s, "reconnect after hearing nothing from the hub this long", config::seconds());
    v("request_timeout_s", request_timeout_s, "a request unanswered this long fails", config::seconds());
    v("credit_wait_s", credit_wait_s, "submit() waits at most this long for credit", config::seconds());
    v("max_frame_mb", max_frame_mb, "largest frame accepted, in MiB", config::in_range(1, 4096));
    v("queue_depth", queue_depth, "ZeroMQ high-water mark, in messages", config::in_range(1, 1000000));
    v("prefetch_batches", prefetch_batches, "learners: batches asked for ahead (0 or 1)", config::in_range(0, 1));
    v("curve", curve, "CURVE keys (tcp://)");
  }
};

// A request the hub did not answer in time (safe to repeat: a batch sent late is sent
// again, since the next request does not confirm it).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();  // close(request_timeout_s)
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Workers.
  LeaseGrant request_leases(uint32_t max_leases);
  // Queues the group; returns once it is sent or queued behind credit. Throws rlx::Error
  // if no credit came within credit_wait_s, or `give_up` said so (the group is then not sent).
  void submit(TrajectoryGroup group);
  void report_error(uint64_t lease_id, const std::string& kind, const std::string& reason);
  // Waits until every group and error record is acknowledged; false on timeout.
  bool flush(double timeout_s);
  // A request waiting for its answer, and submit() waiting for credit, check `give_up` twice
  // a second and, once it returns true, fail at once (rlx::Error) instead of waiting out
  // request_timeout_s or credit_wait_s (flush() does not ask it). For example
  // a role whose launcher died: the hub goes with it. Call before any request.
  void give_up_when(std::function<bool()> give_up);
  // flush(), then drops whatever is still unacknowledged (the hub re-issues those leases)
  // and says goodbye: the hub counts the peer gone at once and re-issues the leases it still
  // holds (otherwise that waits for peer_timeout_s). Returns flush()'s answer. Nothing can
  // be sent afterwards; a second close() returns at once.
  bool close(double timeout_s);

  // Learners: the next batch (confirming the previous one). Throws on timeout.
  // next_batch_view reads the groups in place from the frames as they arrived (each
  // checked), and the BatchView keeps those frames alive; next_batch copies the groups out
  // into vectors.
  BatchView next_batch_view(BatchRequest request, double timeout_s);
  Batch next_batch(BatchRequest request, double timeout_s);
  void publish_version(int64_t version);
  // A checkpoint was saved after training batch `batch_id`: the hub confirms that batch and
  // saves its own state beside its state file as `name` (CheckpointSaved).
  void checkpoint_saved(const std::string& name, uint64_t batch_id);

  // Anyone: the hub's counters; a control command.
  std::vector<std::pair<std::string, double>> hub_stats();
  void control(ControlCommand command);

  struct Counters {
    uint64_t groups_sent = 0, groups_acked = 0, resent = 0, reconnects = 0, rehellos = 0, credit_waits = 0;
    double credit_wait_s = 0;             // total time submit() waited for credit
    std::map<std::string, uint64_t> verdicts;  // the hub's verdict per acknowledged group
  };
  Counters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlx::bus
