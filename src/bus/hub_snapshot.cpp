// The hub's saved state (hub.hpp: write_snapshot, read_snapshot): its replay buffer, leases
// and prompt cursor in one checked file, written atomically.
#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "rlx/bus/hub.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "hub_impl.hpp"

namespace rlx::bus {

namespace {
// A snapshot travels as a framed message: the frame's length and checksum catch a torn file.
struct SnapshotMessage {
  static constexpr MsgType kType = MsgType::hub_state;
  HubSnapshot s;
  template <class Ar> void serialize(Ar& ar) { ar(s); }
};
}  // namespace

void write_snapshot(const HubSnapshot& snapshot, const std::string& path) {
  const std::string bytes = pack(SnapshotMessage{snapshot});
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  write_file_atomic(p, bytes);
}

HubSnapshot read_snapshot(const std::string& path, const Limits& limits) {
  std::ifstream in(path, std::ios::binary);
  RLX_CHECK(in.good(), "cannot read hub state {}", path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Limits l = limits;
  l.max_frame_bytes = std::max<uint64_t>(l.max_frame_bytes, bytes.size());
  try {
    const Frame f = decode_frame(bytes, l);
    return unpack<SnapshotMessage>(f, l).s;
  } catch (const FrameError& e) {
    throw Error(fmt::format("hub state {} is damaged ({}): {}", path, to_string(e.reason()), e.what()));
  }
}

// --- the hub's state, saved and restored ---------------------------------------------

HubSnapshot Hub::Impl::snapshot() const {
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

void Hub::Impl::save(const std::string& path) {
  if (store) store->flush();
  write_snapshot(snapshot(), path);
  last_save = seconds_now();
  count("saves");
}

void Hub::Impl::restore(HubSnapshot s) {
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

std::vector<std::pair<std::string, double>> Hub::Impl::stats() const {
  std::vector<std::pair<std::string, double>> out;
  auto add = [&](std::string k, double v) { out.emplace_back(std::move(k), v); };
  add("version", static_cast<double>(version));
  add("buffer_groups", static_cast<double>(buffer.size()));
  add("buffer_capacity", static_cast<double>(o.replay.capacity_groups));
  add("leases_outstanding", static_cast<double>(leases.outstanding()));
  add("leases_pending_reissue", static_cast<double>(leases.pending_reissue()));
  add("leases_completed", static_cast<double>(leases.completed()));
  add("lease_errors", static_cast<double>(leases.errors().size()));
  std::map<std::string, double> by_kind{{"infra", 0}, {"data", 0}, {"filtered", 0}};  // groups given up, by kind
  for (const auto& e : leases.errors()) by_kind[e.kind] += 1;
  for (const auto& [kind, n] : by_kind) add("lease_errors_" + kind, n);
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

}  // namespace rlx::bus
