// The hub (hub.hpp): construction, the event loop, credits and sending. Its state is
// Hub::Impl (hub_impl.hpp); the protocol's messages are in hub_messages.cpp, the saved
// state in hub_snapshot.cpp.
#include "hub_impl.hpp"

namespace rlx::bus {


void HubOptions::validate() const {
  if (!dataset.empty() && !std::filesystem::exists(dataset))
    throw ConfigError(fmt::format("dataset: {} does not exist", dataset));
  if (curve.enabled() && curve.allowed_clients_file.empty())
    throw ConfigError("curve.allowed_clients_file: required with curve.key_file (CURVE without an allow-list admits any client)");
  if (peer_timeout_s <= heartbeat_s)
    throw ConfigError(fmt::format("peer_timeout_s ({}) must exceed heartbeat_s ({})", peer_timeout_s, heartbeat_s));
}

Limits HubOptions::limits() const { return {.max_frame_bytes = max_frame_mb << 20}; }

Hub::Impl::Impl(HubOptions options, std::vector<std::string> records)
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
  ipc_file = std::make_unique<detail::IpcFile>(endpoint);
  last_tick = last_heartbeat = last_save = seconds_now();
  log::info("hub: serving {} ({} prompts, group size {}, {} epochs)", endpoint, source.size(), o.group_size, o.epochs);
}

bool Hub::Impl::send_batch(Peer& p, const SentBatch& b, uint64_t seq) {
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

uint64_t Hub::Impl::free_slots() const {
  if (store && store->full()) return 0;  // no credit until the trajectory file takes writes again
  uint64_t held = 0;
  for (const auto& [_, p] : peers) held += p.credits;
  const uint64_t used = buffer.size() + held;
  return used >= o.replay.capacity_groups ? 0 : o.replay.capacity_groups - used;
}

void Hub::Impl::lose(Peer& p, std::optional<std::string> why) {
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

void Hub::Impl::tick() {
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

void Hub::Impl::poll(double timeout_s) {
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

void Hub::Impl::coalesce(double turn_start) {
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
