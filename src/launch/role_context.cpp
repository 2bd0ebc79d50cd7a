// A role's view of its run (RoleContext): the hub's address and the weight-sync ends of
// the run's transport (shared memory, tcp, broadcast).
#include "rlx/launch/roles.hpp"

#include <algorithm>

#include "rlx/dist/comm.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_broadcast.hpp"
#include "rlx/dist/weight_sync.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

std::string RoleContext::hub_address() const {
  if (!tcp) return "ipc://" + run_dir.hub_socket().string();
  return dist::wait_endpoint_file(run_dir.hub_endpoint(), cfg.train.batch_timeout_s);
}

WeightSync RoleContext::weight_sync() const {
  if (cfg.train.weight_sync != WeightSync::auto_) return cfg.train.weight_sync;
  return tcp ? WeightSync::tcp : WeightSync::shm;
}

// The broadcast path's options for this run, both ends: loopback on one host; the group
// waits for a member as long as the launcher waits for its heartbeat (a member silent
// longer is killed and restarted anyway).
static dist::BroadcastSyncOptions broadcast_options(const RoleContext& ctx) {
  dist::BroadcastSyncOptions o;
  o.bind = ctx.tcp ? "tcp://0.0.0.0:0" : "tcp://127.0.0.1:0";
  o.advertise_host = ctx.tcp ? "" : "127.0.0.1";
  o.endpoint_file = ctx.run_dir.broadcast_endpoint();
  o.bucket_mb = ctx.cfg.train.weight_bucket_mb;
  o.timeout_s = std::max(10.0, ctx.cfg.train.heartbeat_timeout_s);
  const bool cuda = ctx.cfg.model.device.starts_with("cuda");
  o.nccl = cuda && dist::nccl_available();
  o.device = o.nccl ? ctx.cfg.model.device : "cpu";
  return o;
}

std::unique_ptr<dist::WeightPublisher> RoleContext::weight_publisher(const dist::WeightLayout& layout) const {
  switch (weight_sync()) {
    case WeightSync::broadcast:
      return std::make_unique<dist::BroadcastWeightPublisher>(broadcast_options(*this), layout);
    case WeightSync::tcp:
      return std::make_unique<dist::TcpWeightPublisher>(
          dist::TcpSyncOptions{.bind = "tcp://0.0.0.0:0", .endpoint_file = run_dir.weights_endpoint()}, layout);
    default:
      // On a CUDA device the two slots are device buffers the workers map (CUDA IPC): a split
      // run on one GPU moves its weights device to device.
      return std::make_unique<dist::ShmWeightPublisher>(
          dist::ShmSyncOptions{.name = weights, .device = cfg.model.device.starts_with("cuda") ? cfg.model.device : "cpu"},
          layout);
  }
}

std::unique_ptr<dist::WeightSubscriber> RoleContext::weight_subscriber(std::function<bool()> give_up) const {
  // The learner may still be loading its checkpoint: wait as long as for a batch.
  const double attach_s = std::max(120.0, cfg.train.batch_timeout_s);
  switch (weight_sync()) {
    case WeightSync::broadcast: {
      auto o = broadcast_options(*this);
      o.attach_timeout_s = attach_s;
      o.give_up = std::move(give_up);
      return std::make_unique<dist::BroadcastWeightSubscriber>(std::move(o));
    }
    case WeightSync::tcp:
      return std::make_unique<dist::TcpWeightSubscriber>(dist::TcpSyncOptions{
          .endpoint_file = run_dir.weights_endpoint(), .attach_timeout_s = attach_s, .give_up = std::move(give_up)});
    default:
      return std::make_unique<dist::ShmWeightSubscriber>(
          dist::ShmSyncOptions{.name = weights, .attach_timeout_s = 120, .give_up = std::move(give_up)});
  }
}

}  // namespace rlx::launch
