// What other threads hand the engine between steps: requests, aborts, staged weights, the
// pause flag, and the ids in flight (add() refuses a duplicate). Engine's public calls
// write it under one mutex from any thread; the thread that steps takes it all at once.
//
//   EngineInbox inbox(/*max_queued=*/64, /*version=*/0);
//   inbox.add(std::move(request));        // any thread
//   auto taken = inbox.take();            // the stepping thread: taken.requests, aborts, update
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rlx/rollout/engine.hpp"

namespace rlx {

// A complete set of weights staged by update_weights(), applied at a step boundary.
struct PendingUpdate {
  int64_t version;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  UpdatePolicy policy;
};

class EngineInbox {
 public:
  EngineInbox(int64_t max_queued, int64_t version) : max_queued_(max_queued), version_(version), latest_(version) {}

  // Queues a request whose id is not in flight (while fewer than max_queued are); `who`
  // names it in the error.
  void add(GenerationRequest r, const std::string& who);
  bool abort(const std::string& id);
  bool has_work() const;
  size_t in_flight() const;
  void pause(bool paused);
  bool paused() const;

  // The version the model holds now, set when the stepping thread installs weights.
  int64_t version() const;
  void set_version(int64_t version);
  // Throws unless `version` is newer than every version accepted; with `idle`, also unless
  // nothing is in flight (load_weights).
  void check_newer(const std::string& who, int64_t version, bool idle = false) const;
  // Stages `u` (checked again: another thread may have staged a newer one meanwhile); a newer
  // version staged before the older was taken replaces it.
  void stage(const std::string& who, PendingUpdate u);
  // `version` was loaded directly: a staged older update is dropped.
  void loaded(int64_t version);

  struct Taken {
    std::vector<GenerationRequest> requests;
    std::vector<std::string> aborts;
    std::optional<PendingUpdate> update;
  };
  Taken take();
  // These requests were returned: their ids may be used again.
  void retire(const std::vector<std::string>& ids);

 private:
  mutable std::mutex mu_;
  int64_t max_queued_;
  std::vector<GenerationRequest> requests_;
  std::vector<std::string> aborts_;
  std::optional<PendingUpdate> update_;
  std::unordered_set<std::string> live_ids_;
  int64_t version_;
  int64_t latest_;  // newest version accepted by update_weights or load_weights
  bool paused_ = false;
};

}  // namespace rlx
