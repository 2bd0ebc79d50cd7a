// The replay hub: one process (or thread) that owns the prompt source, the lease table
// and the replay buffer, and talks to rollout workers and learners over one ZeroMQ
// ROUTER socket.
//
// Workers say Hello, ask for leases, and send back one trajectory group per lease; the
// hub acknowledges each frame and grants credits (trajectory groups a worker may send
// unacknowledged), so the buffer can never overflow: when it is full, workers run out
// of credit and block, bounded, in Client::submit. Learners ask for batches and confirm
// each one with their next request. Either side that stops hearing from the other
// (heartbeats both ways) recovers: the hub re-issues a lost worker's leases; a client
// reconnects, says Hello again and resends what was not acknowledged (the lease id
// makes a resent group harmless).
//
//   rlx::bus::HubOptions o;
//   o.address = "ipc:///tmp/rlx-hub.sock";
//   o.dataset = "train.jsonl";
//   rlx::bus::Hub hub(o);
//   hub.run(stop_flag);          // until stop_flag, a "stop" control message, or the end of the data
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rlx/bus/channel.hpp"
#include "rlx/bus/hub_state.hpp"
#include "rlx/bus/message.hpp"

namespace rlx::bus {

struct HubOptions {
  std::string address = "ipc:///tmp/rlx-hub.sock";  // ipc://, inproc:// or tcp://HOST:PORT (port 0: any)
  std::string dataset;                 // JSONL, one task (a JSON object) per line
  uint64_t seed = 0;                   // shuffling seed
  uint64_t epochs = 1;                 // 0: endless
  bool shuffle = true;
  uint32_t group_size = 8;             // samples per prompt (GRPO group)
  double lease_timeout_s = 600;
  uint32_t max_attempts = 3;           // infra failures before a lease ends as an error record
  uint32_t max_leases_per_request = 64;
  uint32_t groups_per_version = 0;     // groups a learner step consumes (staleness gate; 0: off)
  ReplayOptions replay;
  uint32_t credits_per_peer = 4;       // trajectory groups a worker may have unacknowledged
  // Acks wait up to this long to go out together, or until half a worker's credits wait
  // on them (0: sent after each burst of input). Fewer, larger sends: fewer wake-ups.
  double ack_delay_ms = 1.0;
  // While trajectory groups arrive, the hub waits up to this long between turns, so that it
  // takes several per wake-up (fewer wake-ups of the hub and of the I/O threads signalling
  // it). Shorter when a worker's credits or held acks would not last (coalesce_wait_s).
  double coalesce_us = 800;
  double heartbeat_s = 1.0;
  double peer_timeout_s = 10.0;        // a peer silent this long is lost
  uint64_t max_frame_mb = 256;
  int queue_depth = 1000;              // ZeroMQ high-water mark (messages) per socket
  std::string trajectory_file;         // HDF5 of accepted groups; empty: none
  // While the trajectory file cannot be written (a full disk), accepted groups wait in
  // memory up to this much; then the hub takes no more (workers keep theirs) until it can.
  uint64_t store_max_pending_mb = 256;
  std::string state_file;              // saved state (on "save", on stop, every save_every_s)
  double save_every_s = 0;             // 0: only on request and on stop
  CurveOptions curve;

  template <class V>
  void visit(V& v) {
    v("address", address, "endpoint the hub binds: ipc://PATH, inproc://NAME or tcp://HOST:PORT");
    v("dataset", dataset,
      "JSONL dataset, one task per line: a JSON object whose fields the environment reads ({\"prompt\": ...}; math "
      "also GSM8K's question/answer, MATH's problem/solution); empty: the environment's own generator");
    v("seed", seed, "seed of the per-epoch prompt order");
    v("epochs", epochs, "passes over the dataset (0: endless)");
    v("shuffle", shuffle, "shuffle the prompts each epoch");
    v("group_size", group_size, "samples generated per prompt", config::in_range(1, 4096));
    v("lease_timeout_s", lease_timeout_s, "a lease not returned in this time is re-issued", config::seconds());
    v("max_attempts", max_attempts, "infra failures of a lease before it ends as an error record", config::at_least(1));
    v("max_leases_per_request", max_leases_per_request, "leases handed out per request at most", config::in_range(1, 4096));
    v("groups_per_version", groups_per_version,
      "groups the learners consume per weight version; with replay.max_staleness it bounds how far ahead "
      "leases are issued, so long rollouts are not dropped for staleness (0: no gate)");
    v("replay", replay, "replay buffer");
    v("credits_per_peer", credits_per_peer, "trajectory groups a worker may have unacknowledged", config::in_range(1, 4096));
    v("ack_delay_ms", ack_delay_ms,
      "acks wait up to this long to go together, or until credits_per_peer/2 of them wait (0: after each burst)",
      config::in_range(0, 100));
    v("coalesce_us", coalesce_us,
      "while groups arrive, wait up to this long between turns to take several per wake-up; never so long that a "
      "worker runs out of credit or held acks are late (0: off)",
      config::in_range(0, 10000));
    v("heartbeat_s", heartbeat_s, "heartbeat interval, both ways", config::seconds());
    v("peer_timeout_s", peer_timeout_s, "a peer silent this long is declared lost", config::seconds());
    v("max_frame_mb", max_frame_mb, "largest frame accepted, in MiB", config::in_range(1, 4096));
    v("queue_depth", queue_depth, "ZeroMQ high-water mark per socket, in messages", config::in_range(1, 1000000));
    v("trajectory_file", trajectory_file, "HDF5 file every accepted group is appended to (empty: none)");
    v("store_max_pending_mb", store_max_pending_mb,
      "while the trajectory file cannot be written (a full disk), accepted groups wait in memory up to this many MiB; "
      "then the hub takes no more groups (workers keep theirs) until a write succeeds",
      config::in_range(16, 65536));
    v("state_file", state_file, "where the hub saves its state (cursor, leases, buffer); restored at start if present");
    v("save_every_s", save_every_s, "save the state this often (0: on request and at stop only)", config::seconds_or_zero());
    v("curve", curve, "CURVE encryption and client allow-list (tcp://)");
  }
  void validate() const;
  Limits limits() const;
};

// The hub's whole state at a point in time (what save_state writes).
struct HubSnapshot {
  PromptSource::Cursor cursor;
  LeaseTableState leases;
  std::vector<TrajectoryGroup> buffer;
  ReplayBuffer::Counts replay_counts;
  int64_t version = 0;
  uint64_t accepted_total = 0;
  uint64_t next_batch_id = 1;
  uint64_t stored_groups = 0;  // groups in the trajectory file at the time of the save
  struct InFlight {            // a batch a learner has not confirmed
    std::string learner;
    Batch batch;
    template <class Ar> void serialize(Ar& ar) { ar(learner, batch); }
    bool operator==(const InFlight&) const = default;
  };
  std::vector<InFlight> in_flight;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(cursor.epoch, cursor.position, leases, buffer, replay_counts, version, accepted_total, next_batch_id,
       stored_groups, in_flight);
  }
  bool operator==(const HubSnapshot&) const = default;
};

// Writes the snapshot atomically: temporary file, fsync, rename, fsync of the directory.
// The file is one framed message (checksummed), so a torn or corrupt file is detected.
void write_snapshot(const HubSnapshot& snapshot, const std::string& path);
HubSnapshot read_snapshot(const std::string& path, const Limits& limits = {});

// Process-wide malloc settings for moving large frames: allocations up to 64 MiB come from
// the heap (not a fresh mmap each, which page-faults every byte again) and freed memory stays
// in the process up to 1 GiB. Without it a 300 KB frame costs ~70 page faults per hop.
// Every thread allocates from the one main arena: a thread's own arena lives in 64 MiB heaps
// that glibc unmaps whenever one empties, whatever the trim threshold, so a ZeroMQ I/O thread
// receiving a 256 MB weight version page-faulted all of it again on every version when it
// happened to get one (the slow mode of `rlx bench sync --path tcp`: 0.9 s instead of 0.12 s).
// The heap's top is then grown by 512 MiB of address space (no memory until touched) advised
// for transparent huge pages, where large frames land: on this project's VM (shadow paging)
// every 4 KiB page a process switch made it map again cost CPU in whatever touched it, which
// doubled the CPU per group of a worker and hub in separate processes (`rlx bench bus
// --processes`). RLX_NO_HUGE_HEAP=1 in the environment leaves this out. Once per process.
// `rlx hub serve`, `rlx bus worker|learner`, the roles of `rlx run` and the benches call it.
void keep_frame_memory();

class Hub {
 public:
  // Loads options.dataset. Restores options.state_file if it exists.
  explicit Hub(HubOptions options);
  // With the records given (tests, built-in generators).
  Hub(HubOptions options, std::vector<std::string> records);
  ~Hub();
  Hub(const Hub&) = delete;
  Hub& operator=(const Hub&) = delete;

  // Serves until `stop` is set or a "stop" control message arrives; saves the state
  // (if state_file is set) before returning.
  void run(const std::atomic<bool>& stop);
  // One turn of the event loop: waits at most timeout_s for traffic, then does the
  // periodic work (heartbeats, lease expiry, lost peers, credits, saves).
  void poll(double timeout_s);

  // The endpoint peers connect to (tcp port 0 resolved to the bound port).
  std::string endpoint() const;
  HubSnapshot snapshot() const;
  void save_state(const std::string& path) const;
  // Counters: frames rejected by reason, groups by verdict, leases, peers, credits...
  std::vector<std::pair<std::string, double>> stats() const;
  int64_t version() const;
  bool finished() const;  // every lease ended and the buffer is drained

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlx::bus
