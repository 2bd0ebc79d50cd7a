// Weight sync by collective broadcast: learner rank 0 and the rollout workers form a
// group (Gloo, or NCCL for weights on GPUs), and each version travels as a broadcast from
// rank 0, in buckets over the layout's flat bytes. What NCCL-based frameworks do between
// hosts, with the seams handled:
//
//   control plane  ZeroMQ (ROUTER at the publisher, a DEALER per subscriber, tcp://; the
//                  endpoint in a file as for the tcp path). A subscriber says hello and
//                  heart-beats; the publisher answers with the layout and, before each
//                  version, names the group generation, the version, the layout hash and
//                  the buckets.
//   data plane     a Communicator per generation (connect() with the store prefix
//                  "rlx/weights/<generation>", the publisher hosting the store).
//   membership     when members join or leave, the next publish re-forms the group under a
//                  new generation. A collective that fails (a member killed or stopped)
//                  ends that generation: the publisher drops the members whose heartbeats
//                  stopped, re-forms without them and sends the version again. A member
//                  that comes back says hello again and joins the next generation.
//   overlap        bucket k+1 is cast to the layout dtype while bucket k is on the wire.
//   swap           a subscriber receives on its own thread into a spare buffer; poll()
//                  hands a whole version over at the caller's step boundary, never a mix.
//   newcomers      the publisher keeps the last version (one flat copy in the layout dtype,
//                  which the buckets are cast into and sent from); a member that says hello
//                  between versions is sent it at once, by a thread of the publisher.
//   restarts       a subscriber with an endpoint file reads it at every heartbeat; when it
//                  names a new publisher (a learner that restarted), the subscriber follows
//                  it and takes its next version even if older than the one it has (a
//                  learner resumed from an earlier checkpoint).
//
// The publisher waits for the group in publish() (every member receives the version);
// members are bounded by max_members, and every wait by timeout_s.
//
//   rlx::dist::BroadcastWeightPublisher pub({.endpoint_file = run_dir / "weights.bcast"}, layout);
//   pub.publish(step, learner.model().gather_parameters());
//   rlx::dist::BroadcastWeightSubscriber sub({.endpoint_file = run_dir / "weights.bcast"});
//   if (auto u = sub.poll()) engine.update_weights(u->version, u->tensors);
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rlx/dist/weight_sync.hpp"

namespace rlx::dist {

struct BroadcastSyncOptions {
  // Publisher: where the control socket listens (port 0: any free port) and the host
  // subscribers reach it and the store by (empty: this host's name).
  std::string bind = "tcp://0.0.0.0:0";
  std::string advertise_host;
  // Subscriber: the control endpoint, or the file the publisher writes it to.
  std::string endpoint;
  std::filesystem::path endpoint_file;
  int64_t bucket_mb = 256;       // bytes per broadcast (a larger tensor goes alone)
  double timeout_s = 60;         // forming a group, and each bucket's broadcast
  double heartbeat_s = 0.5;      // subscriber: how often it says it is alive
  double silent_after_s = 2;     // publisher: a member whose heartbeat is older is dropped after a failure
  double attach_timeout_s = 30;  // subscriber: for the endpoint and the layout
  int max_members = 256;         // publisher: subscribers in a group
  bool nccl = false;             // data plane: NCCL (both ends' buffers on CUDA) instead of Gloo
  std::string device = "cpu";    // where the buffers live ("cuda:N" with NCCL; the publisher's only then)
  std::function<bool()> give_up; // subscriber: asked while it waits for the layout; true ends the wait (an Error)
};

class BroadcastWeightPublisher final : public WeightPublisher {
 public:
  BroadcastWeightPublisher(BroadcastSyncOptions options, WeightLayout layout);
  ~BroadcastWeightPublisher() override;
  BroadcastWeightPublisher(const BroadcastWeightPublisher&) = delete;
  BroadcastWeightPublisher& operator=(const BroadcastWeightPublisher&) = delete;

  // Sends `version` to every member (re-forming the group first when members came or
  // went). Returns the bytes broadcast (0 with no member).
  int64_t publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  int64_t version() const override { return version_; }
  const std::string& endpoint() const;
  int64_t generation() const;
  int members() const;  // in the current group

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t version_ = 0;
};

class BroadcastWeightSubscriber final : public WeightSubscriber {
 public:
  // Says hello and waits up to attach_timeout_s for the publisher's layout.
  explicit BroadcastWeightSubscriber(BroadcastSyncOptions options);
  ~BroadcastWeightSubscriber() override;
  BroadcastWeightSubscriber(const BroadcastWeightSubscriber&) = delete;
  BroadcastWeightSubscriber& operator=(const BroadcastWeightSubscriber&) = delete;

  // Never blocks: the newest whole version received since the last poll, if any.
  std::optional<WeightUpdate> poll() override;
  int64_t version() const override { return version_; }
  const WeightLayout& layout() const override { return layout_; }
  int64_t generation() const;  // of the group it last joined

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  WeightLayout layout_;
  int64_t version_ = 0;
};

}  // namespace rlx::dist
