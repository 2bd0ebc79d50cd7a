// Append-only HDF5 store of accepted trajectory groups (the hub writes one per run).
//
// Layout (all 1-D, chunked, extendible; T tokens, S samples, G groups in the file):
//   /tokens int32[T]  /loss_mask uint8[T]  /logprobs float32[T]  /versions int64[T]
//   /sample_offset int64[S] (first token)  /sample_length int64[S]  /prompt_len int32[S]
//   /reward float32[S]  /finish string[S]  /metadata string[S]
//   /group_lease_id uint64[G]  /group_prompt_index uint64[G]  /group_epoch uint64[G]
//   /group_first_sample int64[G]  /group_num_samples int64[G]  /group_worker string[G]
//   /group_accepted_version int64[G]: the hub's weight version when it accepted the group
// Root attributes: format = "rlx-trajectories", format_version = 1.
//
//   rlx::bus::TrajectoryStore store("run/trajectories/hub.h5");
//   store.append(group, hub_version);
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

class TrajectoryStore {
 public:
  // Opens FILE for appending, creating it (and its directory) if needed.
  explicit TrajectoryStore(const std::filesystem::path& file);
  ~TrajectoryStore();
  TrajectoryStore(const TrajectoryStore&) = delete;
  TrajectoryStore& operator=(const TrajectoryStore&) = delete;

  void append(const GroupView& group, int64_t accepted_version);
  void append(const TrajectoryGroup& group, int64_t accepted_version) { append(view_of(group), accepted_version); }
  // Keeps the first `groups` groups (a hub restored from a saved state drops what it
  // accepted after that save, so the file never holds a group twice).
  void truncate(uint64_t groups);
  void flush();
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

}  // namespace rlx::bus
