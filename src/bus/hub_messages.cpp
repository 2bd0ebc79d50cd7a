// The hub's side of the protocol: hello, lease requests, trajectory groups, error records,
// batch requests, versions, control (Hub::Impl, hub_impl.hpp).
#include "hub_impl.hpp"

namespace rlx::bus {

void Hub::Impl::on_hello(const std::string& route, uint64_t seq, Hello h) {
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

void Hub::Impl::on_lease_request(Peer& p, uint64_t seq, const LeaseRequest& req) {
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

void Hub::Impl::on_group(Peer& p, uint64_t seq, const GroupView& g, const std::shared_ptr<zmq::message_t>& body) {
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

void Hub::Impl::on_error_record(Peer& p, uint64_t seq, const ErrorRecord& rec) {
  RLX_CHECK(p.role == "worker", "{} sent an error record but is a {}", p.who, p.role);
  RLX_CHECK(rec.kind == "infra" || rec.kind == "data", "error record for lease {}: kind '{}' is not infra or data",
            rec.lease_id, rec.kind);
  const bool open = leases.is_open(rec.lease_id);
  if (open) leases.fail(rec.lease_id, rec.kind, fmt::format("{} (reported by {})", rec.reason, p.who));
  count(open ? "worker_errors" : "worker_errors_duplicate");
  send(p, Ack{.seq = seq, .credits = p.credits, .duplicate = !open, .verdict = open ? "recorded" : "duplicate"}, seq);
}

void Hub::Impl::on_batch_request(Peer& p, uint64_t seq, const BatchRequest& req) {
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

void Hub::Impl::serve_learners() {
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

void Hub::Impl::on_version(Peer& p, uint64_t seq, const VersionUpdate& u) {
  RLX_CHECK(p.role == "learner", "{} published a weight version but is a {}", p.who, p.role);
  if (u.version > version) {
    version = u.version;
    const size_t evicted = buffer.evict_stale(version);
    if (evicted) log::warn("hub: version {}: evicted {} stale groups", version, evicted);
  }
  send(p, Ack{.seq = seq, .verdict = "version"}, seq);
}

void Hub::Impl::on_control(Peer& p, uint64_t seq, const Control& c) {
  switch (c.command) {
    case ControlCommand::save:
      RLX_CHECK(!o.state_file.empty(), "save requested, but the hub has no state_file");
      save(o.state_file);
      break;
    case ControlCommand::stop: stop_requested = true; break;
  }
  send(p, Ack{.seq = seq, .verdict = std::string(to_string(c.command))}, seq);
}

void Hub::Impl::on_checkpoint_saved(Peer& p, uint64_t seq, const CheckpointSaved& c) {
  RLX_CHECK(p.role == "learner", "checkpoint_saved from {}, a {}: only learners checkpoint", p.who, p.role);
  RLX_CHECK(!o.state_file.empty(), "checkpoint_saved, but the hub has no state_file");
  RLX_CHECK(!c.name.empty() && c.name.size() <= 128 && c.name[0] != '.' &&
                c.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") ==
                    std::string::npos,
            "checkpoint_saved: '{}' is not a plain file name (letters, digits, _ . -; at most 128)", c.name);
  confirm(p, c.batch_id);
  save((std::filesystem::path(o.state_file).parent_path() / c.name).string());
  send(p, Ack{.seq = seq, .verdict = "checkpoint"}, seq);
}

bool Hub::Impl::introduced(Peer* peer, const std::string& route, uint64_t seq) {
  if (!peer) {
    count("frames_from_unknown_peers");
    send_route(route, Welcome{.heartbeat_s = o.heartbeat_s, .lease_timeout_s = o.lease_timeout_s, .rehello = true}, seq);
    return false;
  }
  peer->last_heard = seconds_now();
  return true;
}

void Hub::Impl::on_frame(const std::string& route, const std::shared_ptr<zmq::message_t>& body) {
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
      else if constexpr (std::is_same_v<T, CheckpointSaved>) on_checkpoint_saved(*peer, frame.seq, msg);
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

void Hub::Impl::reject(const std::string& route, const std::string& reason, const std::string& what) {
  count("rejected_" + reason);
  const uint64_t n = ++counts["rejected"];
  if (n <= 20 || (n & (n - 1)) == 0) {  // the first 20, then at powers of two: bounded log volume
    const auto r = by_route.find(route);
    log::warn("hub: rejected a frame from {} ({}): {}", r == by_route.end() ? "an unknown peer" : r->second, reason, what);
  }
}

}  // namespace rlx::bus
