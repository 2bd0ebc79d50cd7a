// Weight sync: versioned, atomic hand-over of the learner's weights to rollout
// engines.
//
// Paths (a run picks one by train.weight_sync):
//   shm        same host, CPU: a POSIX shared-memory segment with two slots of flat
//              buffers (double buffering) and a per-slot sequence lock. The learner
//              writes version v into the slot not holding v - 1 and then publishes it;
//              a subscriber copies the published slot and re-checks the slot's
//              sequence number, so a copy that raced a later write is detected and
//              redone: a subscriber only ever hands out a whole version.
//   tcp        any hosts, CPU: learner rank 0 serves versions over ZeroMQ (ROUTER,
//              tcp://); a subscriber keeps one request outstanding (long poll) saying
//              which version its spare buffer holds, and gets back the newer version's
//              tensors (in delta mode only those changed since), each xxh3-checked,
//              sent zero-copy from an immutable snapshot. It switches buffers only when
//              every tensor has arrived. Publishing never waits for subscribers; a dead
//              one's request is dropped; a new one gets the newest version at once.
//   shm with a CUDA device (CUDA IPC; same host, CUDA builds): the same segment, seqlocks
//              and table, but the two slots are device buffers the publisher allocates
//              and exports (cudaIpcGetMemHandle; the handles are in the segment). A
//              subscriber in another process maps them for each version it copies (device
//              to device into its own double buffer), listed meanwhile in the segment's
//              importer table; a closing publisher waits for those copies before it frees
//              the buffers, and a copy during which the publisher died is not handed out.
//              Ran on one H200 (`rlx bench sync --path cuda-ipc`, values checked).
//   broadcast  any hosts, a collective (Gloo, or NCCL between GPUs): weight_broadcast.hpp.
//              The publisher waits for its group; a member joins at the next version.
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
//
//   rlx::dist::TcpWeightPublisher pub({.endpoint_file = run_dir / "weights.endpoint"}, layout);
//   rlx::dist::TcpWeightSubscriber sub({.endpoint_file = run_dir / "weights.endpoint"});
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlx::dist {

// What travels: every tensor's name and shape, in order, in one dtype.
struct WeightLayout {
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  at::ScalarType dtype = at::kFloat;
  // The layout of a list of named tensors (shapes and order as given).
  static WeightLayout of(const std::vector<std::pair<std::string, at::Tensor>>& tensors, at::ScalarType dtype);
  int64_t bytes() const;  // one version, all tensors
  // Where each tensor starts in one version's flat bytes (64-byte aligned), and its size.
  std::vector<std::pair<int64_t, int64_t>> spans() const;
  // Throws unless `tensors` has exactly the layout's names and shapes, in order.
  void check(const std::vector<std::pair<std::string, at::Tensor>>& tensors) const;
};

struct WeightUpdate {
  int64_t version = 0;
  // Every tensor of the layout, at `version`: views into the subscriber's buffers,
  // valid until the next poll().
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t bytes_copied = 0;  // what this poll copied (delta mode: only changed tensors)
  int retries = 0;           // copies redone because the publisher overwrote the slot
};

// What every path's two ends offer (the launcher's roles hold these).
class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  // Writes `tensors` (the layout's names, shapes and order; any floating dtype) as
  // `version` (> the previous one) and publishes it. Returns the bytes written.
  virtual int64_t publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) = 0;
  virtual int64_t version() const = 0;
};
class WeightSubscriber {
 public:
  virtual ~WeightSubscriber() = default;
  // The newest published version when it is newer than the last one returned (or the
  // publisher was replaced); nullopt otherwise. Never returns a mix of versions.
  virtual std::optional<WeightUpdate> poll() = 0;
  virtual int64_t version() const = 0;
  virtual const WeightLayout& layout() const = 0;
};

struct ShmSyncOptions {
  std::string name = "rlx-weights";  // the segment's name (/dev/shm/NAME)
  bool delta = false;                 // write only changed tensors
  int64_t full_every = 10;            // delta mode: a full write at least every K versions
  double attach_timeout_s = 30;       // subscriber: how long to wait for the segment
  std::function<bool()> give_up;      // subscriber: asked while it waits; true ends the wait (an Error)
  int max_retries = 64;               // subscriber: copies redone after racing a write
  // Publisher: where the two slots live: "cpu" (in the segment) or "cuda:N" (CUDA IPC; a
  // CUDA build). A subscriber takes the device from the segment.
  std::string device = "cpu";
  // Publisher on a CUDA device, when it closes: how long it waits for subscribers still
  // copying a version from its device slots before it frees them (past that they are left
  // to the driver at exit).
  double close_wait_s = 10;
};

// Bounds on what a segment may describe (checked on both sides).
inline constexpr int64_t kMaxSyncTensors = 1 << 16;
inline constexpr int64_t kMaxSyncBytes = int64_t{1} << 40;

class ShmWeightPublisher final : public WeightPublisher {
 public:
  ShmWeightPublisher(ShmSyncOptions options, WeightLayout layout);
  ~ShmWeightPublisher();  // marks the segment closed and unlinks it
  ShmWeightPublisher(const ShmWeightPublisher&) = delete;
  ShmWeightPublisher& operator=(const ShmWeightPublisher&) = delete;

  int64_t publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  int64_t version() const override { return version_; }
  const WeightLayout& layout() const { return layout_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ShmSyncOptions opt_;
  WeightLayout layout_;
  int64_t version_ = 0;
  std::vector<uint64_t> hashes_;  // delta mode: each tensor's last published bytes
};


class ShmWeightSubscriber final : public WeightSubscriber {
 public:
  // Waits up to options.attach_timeout_s for the segment to exist.
  explicit ShmWeightSubscriber(ShmSyncOptions options);
  ~ShmWeightSubscriber();
  ShmWeightSubscriber(const ShmWeightSubscriber&) = delete;
  ShmWeightSubscriber& operator=(const ShmWeightSubscriber&) = delete;

  // If the publisher went away and a new one created the segment again, reattaches.
  std::optional<WeightUpdate> poll() override;
  int64_t version() const override { return version_; }
  const WeightLayout& layout() const override { return layout_; }

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

// --- tcp ---------------------------------------------------------------------------

struct TcpSyncOptions {
  // Publisher: where to listen (port 0: any free port), and the host subscribers reach
  // it by (empty: this host's name).
  std::string bind = "tcp://0.0.0.0:0";
  std::string advertise_host;
  // Subscriber: where to connect; empty to read it from endpoint_file.
  std::string endpoint;
  // The publisher writes "tcp://HOST:PORT" here once it listens (atomically); a
  // subscriber reads it at start and again after losing the publisher.
  std::filesystem::path endpoint_file;
  bool delta = false;              // send only tensors changed since the subscriber's spare buffer
  int64_t full_every = 10;         // delta mode: every tensor travels at least every K versions
  double attach_timeout_s = 30;    // subscriber: for the endpoint and the first answer
  std::function<bool()> give_up;   // subscriber: asked while it waits for the first answer; true ends the wait (an Error)
  double keepalive_s = 2;          // publisher: a waiting request is answered at least this often
  double lost_after_s = 10;        // subscriber: no answer this long: reconnect (endpoint read again)
  int max_subscribers = 4096;      // publisher: waiting requests held at once
};

class TcpWeightPublisher final : public WeightPublisher {
 public:
  TcpWeightPublisher(TcpSyncOptions options, WeightLayout layout);
  ~TcpWeightPublisher() override;  // stops serving
  TcpWeightPublisher(const TcpWeightPublisher&) = delete;
  TcpWeightPublisher& operator=(const TcpWeightPublisher&) = delete;

  // Copies the version into a snapshot and hands it to the server thread; returns at
  // once (the bytes copied). Requests are answered from the newest snapshot.
  int64_t publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  int64_t version() const override { return version_; }
  const std::string& endpoint() const;  // tcp://HOST:PORT
  struct Counters {
    uint64_t answers = 0, bytes_sent = 0, keepalives = 0, refused = 0, dropped = 0;
  };
  Counters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t version_ = 0;
};

class TcpWeightSubscriber final : public WeightSubscriber {
 public:
  // Connects and waits up to options.attach_timeout_s for the publisher's first answer
  // (its layout, and its newest version if it has one).
  explicit TcpWeightSubscriber(TcpSyncOptions options);
  ~TcpWeightSubscriber() override;
  TcpWeightSubscriber(const TcpWeightSubscriber&) = delete;
  TcpWeightSubscriber& operator=(const TcpWeightSubscriber&) = delete;

  // Never blocks: looks at the answer to the outstanding request, if it came.
  std::optional<WeightUpdate> poll() override;
  int64_t version() const override { return version_; }
  const WeightLayout& layout() const override { return layout_; }
  uint64_t reconnects() const { return reconnects_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  WeightLayout layout_;
  int64_t version_ = 0;
  uint64_t reconnects_ = 0;
};

}  // namespace rlx::dist
