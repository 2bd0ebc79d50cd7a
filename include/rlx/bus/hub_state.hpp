// The hub's bookkeeping, without sockets: the prompt source and its cursor, the lease
// table, and the replay buffer. The hub process (a ZeroMQ event loop) drives these;
// keeping them free of I/O makes exactly-once testable on its own.
//
//   rlx::bus::PromptSource src(rlx::bus::load_jsonl("train.jsonl"), {.seed = 1, .epochs = 2});
//   rlx::bus::LeaseTable leases(src, {.group_size = 8, .timeout_s = 60});
//   auto lease = leases.issue("worker-0", now, /*min_version=*/3);   // or nothing
//   if (leases.complete(lease->lease_id)) buffer.push(group, current_version);
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rlx/bus/message.hpp"
#include "rlx/core/config.hpp"

namespace rlx::bus {

// A JSONL dataset: one JSON object per line, a task whose fields the environment reads
// ({"prompt": ...}, GSM8K's {"question", "answer"}, ...). Throws rlx::Error naming the file
// and line of the first line that is not a JSON object; an empty file is an error. A line
// longer than max_record_bytes is an error at that line, found without reading it whole.
inline constexpr size_t kMaxRecordBytes = size_t{16} << 20;
std::vector<std::string> load_jsonl(const std::filesystem::path& file, size_t max_records = size_t{1} << 26,
                                    size_t max_record_bytes = kMaxRecordBytes);

struct PromptSourceOptions {
  uint64_t seed = 0;
  uint64_t epochs = 1;  // 0: endless
  bool shuffle = true;
};

// Walks the records epoch by epoch in a seeded permutation per epoch. The cursor is
// (epoch, position); the same seed gives the same order on every machine.
class PromptSource {
 public:
  PromptSource(std::vector<std::string> records, PromptSourceOptions options);
  struct Item {
    uint64_t epoch, position, index;  // index: the record's line in the dataset
    const std::string* task;
  };
  // The next record, or nothing once the last epoch is done.
  std::optional<Item> next();
  bool exhausted() const;
  size_t size() const { return records_.size(); }
  struct Cursor {
    uint64_t epoch = 0, position = 0;
    bool operator==(const Cursor&) const = default;
  };
  Cursor cursor() const { return cursor_; }
  void restore(Cursor c);
  const std::string& record(uint64_t index) const { return records_.at(index); }

 private:
  void shuffle_epoch();
  std::vector<std::string> records_;
  PromptSourceOptions options_;
  Cursor cursor_;
  std::vector<uint64_t> order_;  // permutation of the current epoch
};

struct LeaseOptions {
  uint32_t group_size = 1;
  double timeout_s = 600;      // a lease not returned in time is re-issued
  uint32_t max_attempts = 3;   // infra failures before the lease ends as an error record
};

// A lease table's contents, for the hub's saved state. Deadlines are kept as time left,
// so a restored table gives every active lease the time it had when it was saved.
struct LeaseTableState {
  struct Active {
    Lease lease;
    std::string worker;
    double remaining_s = 0;
    template <class Ar> void serialize(Ar& ar) { ar(lease, worker, remaining_s); }
    bool operator==(const Active&) const = default;
  };
  uint64_t next_id = 1;
  std::vector<Active> active;
  std::vector<Lease> reissue;
  std::vector<std::pair<uint64_t, bool>> ended;
  uint64_t completed = 0;
  std::vector<ErrorRecord> errors;
  template <class Ar> void serialize(Ar& ar) { ar(next_id, active, reissue, ended, completed, errors); }
  bool operator==(const LeaseTableState&) const = default;
};

// Why a trajectory group cannot be the result of `lease` (sample count, prompt and epoch,
// array lengths, prompt length, token ids, masks, finite log-probs and rewards, the
// routing's shape and experts), or nothing when it can.
std::optional<std::string> group_mismatch(const GroupView& g, const Lease& lease);

// Every lease ends exactly once: completed (its group accepted), or an error record.
class LeaseTable {
 public:
  LeaseTable(PromptSource& source, LeaseOptions options) : source_(source), options_(options) {}

  // The lease if it is open (active or waiting to be re-issued).
  const Lease* find(uint64_t lease_id) const;
  // The next lease for `worker`: a re-issued one first, else a new one from the source.
  std::optional<Lease> issue(const std::string& worker, double now, int64_t min_version);
  // A result arrived for the lease: true the first time (accept it), false for a late
  // duplicate or an unknown lease (drop it). A result for a lease waiting to be re-issued
  // (its worker was presumed lost, then answered) is accepted: the work is not wasted.
  bool complete(uint64_t lease_id);
  // `worker` holds the lease's finished result, which the hub had no room for (its replay
  // buffer or trajectory file full): its time starts again from `now`, and a lease waiting
  // to be re-issued (timed out meanwhile) is the worker's again, so that back-pressure
  // longer than the timeout re-issues nothing. False when the lease is not open.
  bool hold(uint64_t lease_id, const std::string& worker, double now);
  // Whether the lease is still open (active or waiting to be re-issued).
  bool is_open(uint64_t lease_id) const;
  // The lease failed. "infra" failures are re-issued until max_attempts; "data" failures
  // (the task itself is bad) and "filtered" groups (dropped by a replay filter) end the
  // lease at once. Returns the error record when the lease ended.
  std::optional<ErrorRecord> fail(uint64_t lease_id, const std::string& kind, const std::string& reason);
  // Leases past their deadline, and every lease of a worker known dead, are re-issued.
  std::vector<ErrorRecord> expire(double now);
  std::vector<ErrorRecord> worker_lost(const std::string& worker);

  size_t outstanding() const { return active_.size(); }
  size_t pending_reissue() const { return reissue_.size(); }
  uint64_t completed() const { return completed_count_; }
  const std::vector<ErrorRecord>& errors() const { return errors_; }
  bool done() const { return active_.empty() && reissue_.empty() && source_.exhausted(); }

  LeaseTableState state(double now) const;
  void restore(const LeaseTableState& state, double now);

 private:
  struct Active {
    Lease lease;
    std::string worker;
    double deadline;
  };
  std::optional<ErrorRecord> retire(uint64_t lease_id, const std::string& kind, const std::string& reason);
  std::deque<Lease>::const_iterator waiting(uint64_t lease_id) const;  // in reissue_, or end()

  PromptSource& source_;
  LeaseOptions options_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Active> active_;
  std::deque<Lease> reissue_;
  std::map<uint64_t, bool> ended_;  // lease id -> completed (true) or errored (false)
  uint64_t completed_count_ = 0;
  std::vector<ErrorRecord> errors_;
};

struct ReplayOptions {
  size_t capacity_groups = 1024;        // the buffer never holds more (producers get no credit)
  int64_t max_staleness = 1;            // accept groups whose oldest token version >= current - this
  bool drop_uniform_rewards = false;    // DAPO dynamic sampling: drop groups whose rewards are all equal
  template <class V>
  void visit(V& v) {
    v("capacity_groups", capacity_groups, "trajectory groups the replay buffer holds at most", config::at_least(1));
    v("max_staleness", max_staleness, "accepted weight-version lag of a group's oldest token", config::at_least(0));
    v("drop_uniform_rewards", drop_uniform_rewards, "drop groups whose rewards are all equal (DAPO dynamic sampling)");
  }
};

// A trajectory group as it arrived: its frame, shared and never copied (the hub forwards
// it to a learner as it came, so each worker's checksum is checked end to end), and what
// the replay buffer needs to know of it.
struct StoredGroup {
  std::shared_ptr<const char> frame;  // the whole frame, header included
  size_t frame_bytes = 0;
  uint64_t lease_id = 0;
  int64_t tokens = 0;
  int64_t oldest_version = -1;   // of its generated tokens (-1: none)
  bool uniform_rewards = false;  // more than one sample, all with the same reward

  // `frame` holds a valid trajectory_group frame and `view` is its parse.
  static StoredGroup of(std::shared_ptr<const char> frame, size_t frame_bytes, const GroupView& view);
  static StoredGroup of(const TrajectoryGroup& group);  // packs it
  std::string_view bytes() const { return {frame.get(), frame_bytes}; }
  TrajectoryGroup unpack(const Limits& limits) const;
};

// FIFO of trajectory groups with a staleness bound applied per group.
class ReplayBuffer {
 public:
  explicit ReplayBuffer(ReplayOptions options) : options_(options) {}
  enum class Verdict { accepted, stale, filtered, full };
  Verdict push(StoredGroup group, int64_t current_version);
  // The verdict push() would give, counting a rejection; push_accepted() then adds it.
  Verdict admit(const StoredGroup& group, int64_t current_version);
  void push_accepted(StoredGroup group);
  // Drops groups that became too stale while waiting; returns how many.
  size_t evict_stale(int64_t current_version);
  // Up to max_groups groups (0: no limit) and max_tokens tokens (0: no limit), oldest first;
  // at least one group when any fits. Only groups within max_staleness of `train_version`
  // are taken (the others stay, for evict_stale): a batch trained after a later version.
  std::vector<StoredGroup> pop(size_t max_groups, uint64_t max_tokens, int64_t train_version = -1);
  // Whether pop() for `train_version` would fill a batch: max_groups groups fresh then, or
  // max_tokens of their tokens, or (both 0) any group. It stops counting once it knows:
  // the hub asks on every group it receives while a learner waits.
  bool has_batch(size_t max_groups, uint64_t max_tokens, int64_t train_version) const;
  size_t size() const { return groups_.size(); }
  size_t free_slots() const { return options_.capacity_groups - groups_.size(); }
  const std::deque<StoredGroup>& contents() const { return groups_; }
  // Groups handed to a learner that did not confirm them go back to the front, in order.
  void requeue_front(std::vector<StoredGroup> groups);
  struct Counts {
    uint64_t accepted = 0, stale = 0, filtered = 0, full = 0, evicted_stale = 0;
    template <class Ar> void serialize(Ar& ar) { ar(accepted, stale, filtered, full, evicted_stale); }
    bool operator==(const Counts&) const = default;
  };
  const Counts& counts() const { return counts_; }
  // Restores saved contents and counters (the hub's saved state).
  void restore(std::deque<StoredGroup> groups, Counts counts);

 private:
  bool too_stale(const StoredGroup& g, int64_t current_version) const {
    return g.oldest_version >= 0 && g.oldest_version < current_version - options_.max_staleness;
  }
  ReplayOptions options_;
  std::deque<StoredGroup> groups_;
  Counts counts_;
};

// How long the hub waits before its next turn after one that took trajectory groups
// (HubOptions::coalesce_us): at most `coalesce_s`; nothing while the interval between
// groups of the fastest worker sending lately (`group_interval_s`) is unknown (0); at most
// the time in which that worker uses half its credits (acks go out once half its
// credits wait on them, so it keeps sending meanwhile); and not past the held acks'
// deadline (`acks_due_in_s`; negative: none held).
double coalesce_wait_s(double coalesce_s, double group_interval_s, uint32_t credits_per_peer, double acks_due_in_s);

}  // namespace rlx::bus
