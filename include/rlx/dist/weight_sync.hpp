// Weight sync: versioned, atomic hand-over of the learner's weights to rollout
// engines.
//
// Paths (choose_sync_path picks one from the placement; the config may override):
//   colocated  learner and engine in one process: the engine takes the gathered
//              tensors directly (Engine::update_weights copies them once).
//   shm        same host, CPU: a POSIX shared-memory segment with two slots of flat
//              buffers (double buffering) and a per-slot sequence lock. The learner
//              writes version v into the slot not holding v - 1 and then publishes it;
//              a subscriber copies the published slot and re-checks the slot's
//              sequence number, so a copy that raced a later write is detected and
//              redone: a subscriber only ever hands out a whole version.
//   (CUDA IPC and NCCL broadcast are the GPU paths; not built in this tree yet.)
//
// The publisher never waits for subscribers: one that dies mid-copy costs nothing,
// and a new one attaching reads the newest version at once. In delta mode only the
// tensors whose bytes changed (xxh3 of each tensor) are written and copied, with a
// full write every `full_every` versions.
//
//   rlx::dist::ShmWeightPublisher pub({.name = "rlx-job-weights"}, engine_layout);
//   pub.publish(step, learner.model().gather_parameters());          // learner rank 0
//   rlx::dist::ShmWeightSubscriber sub({.name = "rlx-job-weights"});
//   if (auto u = sub.poll()) engine.update_weights(u->version, u->tensors);  // rollout worker
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlx::dist {

enum class SyncPath { colocated, shm };
// colocated when learner and engine share a process; shm on the same host otherwise.
SyncPath choose_sync_path(bool same_process, bool same_host);

// What travels: every tensor's name and shape, in order, in one dtype.
struct WeightLayout {
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  at::ScalarType dtype = at::kFloat;
  // The layout of a list of named tensors (shapes and order as given).
  static WeightLayout of(const std::vector<std::pair<std::string, at::Tensor>>& tensors, at::ScalarType dtype);
  int64_t bytes() const;  // one version, all tensors
};

struct ShmSyncOptions {
  std::string name = "rlx-weights";  // the segment's name (/dev/shm/NAME)
  bool delta = false;                 // write only changed tensors
  int64_t full_every = 10;            // delta mode: a full write at least every K versions
  double attach_timeout_s = 30;       // subscriber: how long to wait for the segment
  int max_retries = 64;               // subscriber: copies redone after racing a write
};

// Bounds on what a segment may describe (checked on both sides).
inline constexpr int64_t kMaxSyncTensors = 1 << 16;
inline constexpr int64_t kMaxSyncBytes = int64_t{1} << 40;

class ShmWeightPublisher {
 public:
  ShmWeightPublisher(ShmSyncOptions options, WeightLayout layout);
  ~ShmWeightPublisher();  // marks the segment closed and unlinks it
  ShmWeightPublisher(const ShmWeightPublisher&) = delete;
  ShmWeightPublisher& operator=(const ShmWeightPublisher&) = delete;

  // Writes `tensors` (the layout's names, shapes and order; any floating dtype) as
  // `version` (> the previous one) and publishes it. Returns the bytes written.
  int64_t publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  int64_t version() const { return version_; }
  const WeightLayout& layout() const { return layout_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ShmSyncOptions opt_;
  WeightLayout layout_;
  int64_t version_ = 0;
  std::vector<uint64_t> hashes_;  // delta mode: each tensor's last published bytes
};

struct WeightUpdate {
  int64_t version = 0;
  // Every tensor of the layout, at `version`: views into the subscriber's buffers,
  // valid until the next poll().
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t bytes_copied = 0;  // what this poll copied (delta mode: only changed tensors)
  int retries = 0;           // copies redone because the publisher overwrote the slot
};

class ShmWeightSubscriber {
 public:
  // Waits up to options.attach_timeout_s for the segment to exist.
  explicit ShmWeightSubscriber(ShmSyncOptions options);
  ~ShmWeightSubscriber();
  ShmWeightSubscriber(const ShmWeightSubscriber&) = delete;
  ShmWeightSubscriber& operator=(const ShmWeightSubscriber&) = delete;

  // The newest published version when it is newer than the last one returned;
  // nullopt otherwise. Never returns a mix of versions. If the publisher went away
  // and a new one created the segment again, reattaches.
  std::optional<WeightUpdate> poll();
  int64_t version() const { return version_; }
  const WeightLayout& layout() const { return layout_; }

 private:
  void attach(double timeout_s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ShmSyncOptions opt_;
  WeightLayout layout_;
  int64_t version_ = 0;
  at::Tensor buffers_[2];      // local double buffer, flat bytes
  int64_t buffer_version_[2] = {0, 0};
  int current_ = 0;            // which local buffer holds version_
};

}  // namespace rlx::dist
