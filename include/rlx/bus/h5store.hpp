// Append-only HDF5 store of accepted trajectory groups (the hub writes one per run).
//
// Layout (all 1-D, chunked, extendible; T tokens, R runs of versions, X bytes of text,
// S samples, G groups):
//   /tokens int32[T]  /loss_mask uint8[T]  /logprobs float32[T]
//   /run_version int64[R]  /run_length uint32[R]: a sample's per-token weight versions, as
//     runs (VersionRuns: run_version[r] for run_length[r] tokens)
//   /text uint8[X]: every string's UTF-8 bytes, back to back; a group's are its worker's
//     name, then each sample's finish reason and metadata
//   /sample_offset int64[S] (first token)  /sample_length int64[S]
//   /sample_first_run int64[S]  /sample_num_runs int64[S]  /prompt_len int32[S]
//   /reward float32[S]  /finish_offset int64[S] /finish_length uint32[S] (into /text)
//   /metadata_offset int64[S]  /metadata_length uint32[S]
//   /group_lease_id uint64[G]  /group_prompt_index uint64[G]  /group_epoch uint64[G]
//   /group_first_sample int64[G]  /group_num_samples int64[G]
//   /group_worker_offset int64[G]  /group_worker_length uint32[G]
//   /group_accepted_version int64[G]: the hub's weight version when it accepted the group
//   /routing int16[E]: mixture-of-experts samples' routing (bus::TokenRouting), back to back
//   /sample_routing_offset int64[S] (first value)  /sample_routing_layers uint16[S]
//   /sample_routing_top_k uint16[S]: a sample's sample_length x layers x top_k values (0 x 0: none)
//   /committed uint64 (compact): the groups written and flushed; readers count no more
// Root attributes: format = "rlx-trajectories", format_version = 4 (3 had no routing; 2 held
// the strings as HDF5 variable-length strings, which SWMR readers cannot read safely; 1 had
// /versions int64[T]; this build refuses them, naming the versions, and upgrades them).
//
// Read while written: the file is in HDF5's latest format and its writer in SWMR mode, so
// `rlx inspect trajectories` (and h5py with swmr=True) can read it during a run. Readers
// see the groups of the last write, which comes every StoreOptions::stage_bytes or
// max_stage_age_s. A file has one writer at a time (a lock that ends with its process); a
// writer killed with SIGKILL leaves a file that reads, and that the next writer opens.
//
//   rlx::bus::TrajectoryStore store("run/trajectories/hub.h5");
//   if (!store.append(group, hub_version)) { /* the file is full: keep the group, try again later */ }
//   store.flush();  // written, or an rlx::Error that says why (the groups stay staged)
//   auto groups = rlx::bus::read_trajectory_groups("run/trajectories/hub.h5", 0, 10);
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rlx/bus/message.hpp"

namespace rlx::bus {

struct StoreOptions {
  size_t stage_bytes = size_t{8} << 20;         // appends gather this much, then go to the file together
  size_t max_pending_bytes = size_t{256} << 20;  // while the file cannot be written, at most this much waits
  double max_stage_age_s = 5;                    // or once the first of them has waited this long (write_if_due)
};

// Appends are staged in memory and written in bulk. A write that fails (a full disk) leaves
// the file as it was before it, and its groups stay staged to be written again: by later
// appends, write_pending(), flush(). Once max_pending_bytes wait, append() refuses.
class TrajectoryStore {
 public:
  // Opens FILE for appending, creating it (and its directory) if needed.
  explicit TrajectoryStore(const std::filesystem::path& file, StoreOptions options = {});
  ~TrajectoryStore();
  TrajectoryStore(const TrajectoryStore&) = delete;
  TrajectoryStore& operator=(const TrajectoryStore&) = delete;

  // False, and nothing staged, when full(): the caller keeps the group (the hub answers
  // "full", and the worker sends it again later).
  [[nodiscard]] bool append(const GroupView& group, int64_t accepted_version);
  [[nodiscard]] bool append(const TrajectoryGroup& group, int64_t accepted_version) {
    return append(view_of(group), accepted_version);
  }
  // Keeps the first `groups` groups (a hub restored from a saved state drops what it
  // accepted after that save, so the file never holds a group twice).
  void truncate(uint64_t groups);
  // Writes what is staged and flushes HDF5; an rlx::Error when the write fails (naming
  // the file, the column and the system's reason), the groups still staged.
  void flush();
  // Writes what is staged; false when the write failed (last_error() says why).
  bool write_pending();
  // Writes what is staged if its first group has waited StoreOptions::max_stage_age_s
  // (readers see a slow run's groups too); false when that write failed. The hub calls it
  // from its periodic tick.
  bool write_if_due();
  bool full() const;                  // max_pending_bytes wait: append() refuses
  size_t pending_bytes() const;       // staged, not yet in the file
  uint64_t write_failures() const;    // writes that failed, ever
  const std::string& last_error() const;  // of the last write; empty when it succeeded
  uint64_t groups() const;
  uint64_t samples() const;
  uint64_t tokens() const;
  const std::filesystem::path& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TrajectoryFileSummary {
  uint64_t groups = 0, samples = 0, tokens = 0, policy_tokens = 0;
  double reward_mean = 0, reward_min = 0, reward_max = 0;
  int64_t version_min = -1, version_max = -1;
  std::map<std::string, uint64_t> finish;   // finish reason -> samples
  std::map<std::string, uint64_t> workers;  // worker -> groups
  uint64_t distinct_leases = 0, distinct_prompts = 0;
};
TrajectoryFileSummary summarize_trajectories(const std::filesystem::path& file);
// Groups [first, first + count) as they were appended (count clipped to the file).
std::vector<TrajectoryGroup> read_trajectory_groups(const std::filesystem::path& file, uint64_t first, uint64_t count);
// Writes the groups of a format 1, 2 or 3 file (which this build refuses) to a new file `to`
// in this build's format, accepted versions and all; the groups it wrote. A torn tail (a
// writer killed past its last flush) is left behind, with a warning.
uint64_t upgrade_trajectories(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace rlx::bus
