#include "rlx/bus/hub_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rlx/core/error.hpp"
#include "rlx/core/json.hpp"
#include "rlx/core/rng.hpp"

namespace rlx::bus {

std::vector<std::string> load_jsonl(const std::filesystem::path& file, size_t max_records, size_t max_record_bytes) {
  std::ifstream in(file, std::ios::binary);
  RLX_CHECK(in.good(), "cannot read dataset {}", file.string());
  std::vector<std::string> out;
  std::string line;
  size_t lineno = 0;
  for (;;) {
    // One line, read at most max_record_bytes + 1 bytes into memory.
    line.clear();
    bool ended = false;
    for (int c; (c = in.get()) != std::char_traits<char>::eof();) {
      if (c == '\n') {
        ended = true;
        break;
      }
      line.push_back(static_cast<char>(c));
      RLX_CHECK(line.size() <= max_record_bytes, "{}:{}: a record longer than {} bytes (the limit of one dataset line)",
                file.string(), lineno + 1, max_record_bytes);
    }
    if (!ended && line.empty()) break;
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = parse_json(line, fmt::format("{}:{}", file.string(), lineno));
    } catch (const JsonError& e) {
      throw Error(e.what());
    }
    // Which fields a task needs is the environment's to say (math reads "question" or "problem").
    RLX_CHECK(j.is_object(), "{}:{}: each record must be a JSON object (a task for the environment), got {}",
              file.string(), lineno, j.type_name());
    RLX_CHECK(out.size() < max_records, "{}: more than {} records", file.string(), max_records);
    out.push_back(j.dump());
  }
  RLX_CHECK(!out.empty(), "dataset {} has no records: a run would train zero steps", file.string());
  return out;
}

PromptSource::PromptSource(std::vector<std::string> records, PromptSourceOptions options)
    : records_(std::move(records)), options_(options) {
  RLX_CHECK(!records_.empty(), "prompt source: no records");
  shuffle_epoch();
}

void PromptSource::shuffle_epoch() {
  order_.resize(records_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  if (!options_.shuffle) return;
  RngStream rng(options_.seed, hash_name("prompt_source") + cursor_.epoch);
  for (size_t i = order_.size(); i > 1; --i)
    std::swap(order_[i - 1], order_[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1))]);
}

bool PromptSource::exhausted() const { return options_.epochs != 0 && cursor_.epoch >= options_.epochs; }

std::optional<PromptSource::Item> PromptSource::next() {
  if (exhausted()) return std::nullopt;
  Item item{cursor_.epoch, cursor_.position, order_[cursor_.position], nullptr};
  item.task = &records_[item.index];
  if (++cursor_.position == records_.size()) {
    cursor_.position = 0;
    ++cursor_.epoch;
    shuffle_epoch();
  }
  return item;
}

void PromptSource::restore(Cursor c) {
  RLX_CHECK(c.position < records_.size(), "prompt source: cursor position {} is past the {} records", c.position,
            records_.size());
  cursor_ = c;
  shuffle_epoch();
}

std::optional<Lease> LeaseTable::issue(const std::string& worker, double now, int64_t min_version) {
  Lease lease;
  if (!reissue_.empty()) {
    lease = std::move(reissue_.front());
    reissue_.pop_front();
    ++lease.attempt;
  } else {
    auto item = source_.next();
    if (!item) return std::nullopt;
    lease = Lease{.lease_id = next_id_++, .prompt_index = item->index, .epoch = item->epoch,
                  .group_size = options_.group_size, .task = *item->task};
  }
  lease.min_version = std::max(lease.min_version, min_version);
  active_.emplace(lease.lease_id, Active{lease, worker, now + options_.timeout_s});
  return lease;
}

bool LeaseTable::complete(uint64_t lease_id) {
  if (auto it = active_.find(lease_id); it != active_.end()) {
    active_.erase(it);
  } else {
    auto r = waiting(lease_id);
    if (r == reissue_.end()) return false;  // late duplicate, or a lease that already ended
    reissue_.erase(r);
  }
  ended_.emplace(lease_id, true);
  ++completed_count_;
  return true;
}

bool LeaseTable::hold(uint64_t lease_id, const std::string& worker, double now) {
  if (auto it = active_.find(lease_id); it != active_.end()) {
    it->second.worker = worker;
    it->second.deadline = now + options_.timeout_s;
    return true;
  }
  auto r = waiting(lease_id);
  if (r == reissue_.end()) return false;
  active_.emplace(lease_id, Active{*r, worker, now + options_.timeout_s});
  reissue_.erase(r);
  return true;
}

const Lease* LeaseTable::find(uint64_t lease_id) const {
  if (auto it = active_.find(lease_id); it != active_.end()) return &it->second.lease;
  for (const auto& l : reissue_)
    if (l.lease_id == lease_id) return &l;
  return nullptr;
}

bool LeaseTable::is_open(uint64_t lease_id) const {
  return active_.contains(lease_id) || waiting(lease_id) != reissue_.end();
}

std::deque<Lease>::const_iterator LeaseTable::waiting(uint64_t lease_id) const {
  return std::find_if(reissue_.begin(), reissue_.end(), [&](const Lease& l) { return l.lease_id == lease_id; });
}

LeaseTableState LeaseTable::state(double now) const {
  LeaseTableState st{.next_id = next_id_, .completed = completed_count_, .errors = errors_};
  for (const auto& [id, a] : active_) st.active.push_back({a.lease, a.worker, std::max(0.0, a.deadline - now)});
  st.reissue.assign(reissue_.begin(), reissue_.end());
  st.ended.assign(ended_.begin(), ended_.end());
  return st;
}

void LeaseTable::restore(const LeaseTableState& st, double now) {
  next_id_ = st.next_id;
  active_.clear();
  for (const auto& a : st.active) {
    RLX_CHECK(a.lease.lease_id < next_id_, "saved lease table: lease {} is not below next id {}", a.lease.lease_id, next_id_);
    active_.emplace(a.lease.lease_id, Active{a.lease, a.worker, now + a.remaining_s});
  }
  reissue_.assign(st.reissue.begin(), st.reissue.end());
  ended_ = std::map<uint64_t, bool>(st.ended.begin(), st.ended.end());
  completed_count_ = st.completed;
  errors_ = st.errors;
}

std::optional<ErrorRecord> LeaseTable::retire(uint64_t lease_id, const std::string& kind, const std::string& reason) {
  auto it = active_.find(lease_id);
  if (it == active_.end()) return std::nullopt;
  Lease lease = std::move(it->second.lease);
  active_.erase(it);
  if (kind == "infra" && lease.attempt + 1 < options_.max_attempts) {
    reissue_.push_back(std::move(lease));
    return std::nullopt;
  }
  ErrorRecord rec{lease_id, kind, kind == "infra" ? fmt::format("{} (after {} attempts)", reason, lease.attempt + 1) : reason};
  ended_.emplace(lease_id, false);
  errors_.push_back(rec);
  return rec;
}

std::optional<ErrorRecord> LeaseTable::fail(uint64_t lease_id, const std::string& kind, const std::string& reason) {
  RLX_CHECK(kind == "infra" || kind == "data" || kind == "filtered",
            "lease {}: failure kind must be infra, data or filtered, got '{}'", lease_id, kind);
  return retire(lease_id, kind, reason);
}

std::vector<ErrorRecord> LeaseTable::expire(double now) {
  std::vector<uint64_t> late;
  for (const auto& [id, a] : active_)
    if (a.deadline <= now) late.push_back(id);
  std::vector<ErrorRecord> out;
  for (uint64_t id : late)
    if (auto rec = retire(id, "infra", "lease timed out")) out.push_back(*rec);
  return out;
}

std::vector<ErrorRecord> LeaseTable::worker_lost(const std::string& worker) {
  std::vector<uint64_t> held;
  for (const auto& [id, a] : active_)
    if (a.worker == worker) held.push_back(id);
  std::vector<ErrorRecord> out;
  for (uint64_t id : held)
    if (auto rec = retire(id, "infra", fmt::format("worker {} was lost", worker))) out.push_back(*rec);
  return out;
}

StoredGroup StoredGroup::of(std::shared_ptr<const char> frame, size_t frame_bytes, const GroupView& view) {
  bool uniform = view.samples.size() > 1;
  for (const auto& s : view.samples) uniform &= s.reward == view.samples.front().reward;
  return {.frame = std::move(frame),
          .frame_bytes = frame_bytes,
          .lease_id = view.lease_id,
          .tokens = view.num_tokens(),
          .oldest_version = view.version_range().first,
          .uniform_rewards = uniform};
}

StoredGroup StoredGroup::of(const TrajectoryGroup& group) {
  auto bytes = std::make_shared<const std::string>(pack(group));
  std::shared_ptr<const char> frame(bytes, bytes->data());
  return of(std::move(frame), bytes->size(), view_of(group));
}

TrajectoryGroup StoredGroup::unpack(const Limits& limits) const {
  return bus::unpack<TrajectoryGroup>(decode_frame(bytes(), limits), limits);
}

ReplayBuffer::Verdict ReplayBuffer::push(StoredGroup group, int64_t current_version) {
  const Verdict v = admit(group, current_version);
  if (v == Verdict::accepted) push_accepted(std::move(group));
  return v;
}

void ReplayBuffer::push_accepted(StoredGroup group) {
  groups_.push_back(std::move(group));
  ++counts_.accepted;
}

ReplayBuffer::Verdict ReplayBuffer::admit(const StoredGroup& group, int64_t current_version) {
  if (too_stale(group, current_version)) {
    ++counts_.stale;
    return Verdict::stale;
  }
  if (options_.drop_uniform_rewards && group.uniform_rewards) {
    ++counts_.filtered;
    return Verdict::filtered;
  }
  if (groups_.size() >= options_.capacity_groups) {
    ++counts_.full;
    return Verdict::full;
  }
  return Verdict::accepted;
}

size_t ReplayBuffer::evict_stale(int64_t current_version) {
  const size_t evicted = std::erase_if(groups_, [&](const StoredGroup& g) { return too_stale(g, current_version); });
  counts_.evicted_stale += evicted;
  return evicted;
}

void ReplayBuffer::requeue_front(std::vector<StoredGroup> groups) {
  for (auto it = groups.rbegin(); it != groups.rend(); ++it) groups_.push_front(std::move(*it));
}

void ReplayBuffer::restore(std::deque<StoredGroup> groups, Counts counts) {
  groups_ = std::move(groups);
  counts_ = counts;
}

std::vector<StoredGroup> ReplayBuffer::pop(size_t max_groups, uint64_t max_tokens, int64_t train_version) {
  std::vector<StoredGroup> out;
  uint64_t tokens = 0;
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (too_stale(*it, train_version)) {
      ++it;  // stale by then: left for evict_stale
      continue;
    }
    const auto n = static_cast<uint64_t>(it->tokens);
    if (!out.empty() && ((max_groups && out.size() >= max_groups) || (max_tokens && tokens + n > max_tokens))) break;
    tokens += n;
    out.push_back(std::move(*it));
    it = groups_.erase(it);
  }
  return out;
}

bool ReplayBuffer::has_batch(size_t max_groups, uint64_t max_tokens, int64_t train_version) const {
  size_t groups = 0;
  uint64_t tokens = 0;
  for (const auto& g : groups_) {
    if (too_stale(g, train_version)) continue;
    ++groups;
    tokens += static_cast<uint64_t>(g.tokens);
    if (max_groups ? groups >= max_groups : (!max_tokens || tokens >= max_tokens)) return true;
  }
  return false;
}

double coalesce_wait_s(double coalesce_s, double group_interval_s, uint32_t credits_per_peer, double acks_due_in_s) {
  if (coalesce_s <= 0 || group_interval_s <= 0) return 0;
  double wait = std::min(coalesce_s, group_interval_s * (credits_per_peer / 2));
  if (acks_due_in_s >= 0) wait = std::min(wait, acks_due_in_s);
  return std::max(0.0, wait);
}

namespace {
bool token_valid(const SampleView& s, size_t t) {
  return s.tokens[t] >= 0 && s.loss_mask[t] <= 1 && std::isfinite(s.logprobs[t]);
}
}  // namespace

std::optional<std::string> group_mismatch(const GroupView& g, const Lease& lease) {
  if (g.samples.size() != lease.group_size)
    return fmt::format("{} samples, the lease asked for {}", g.samples.size(), lease.group_size);
  if (g.prompt_index != lease.prompt_index || g.epoch != lease.epoch)
    return fmt::format("prompt {}/epoch {} does not match the lease's {}/{}", g.prompt_index, g.epoch,
                       lease.prompt_index, lease.epoch);
  for (size_t i = 0; i < g.samples.size(); ++i) {
    const auto& s = g.samples[i];
    const size_t n = s.tokens.size();
    if (n == 0) return fmt::format("sample {} has no tokens", i);
    if (s.loss_mask.size() != n || s.logprobs.size() != n || s.versions.size() != n)
      return fmt::format("sample {}: tokens, loss_mask, logprobs and versions differ in length", i);
    if (s.prompt_len < 0 || static_cast<size_t>(s.prompt_len) > n)
      return fmt::format("sample {}: prompt_len {} is outside [0, {}]", i, s.prompt_len, n);
    if (!s.tokens_valid()) {  // a branch-free scan first (vectorised); the slow search only on failure
      size_t t = 0;
      while (t < n && token_valid(s, t)) ++t;
      return fmt::format("sample {} token {}: negative id, mask not 0/1, or non-finite log-prob", i, t);
    }
    if (!std::isfinite(s.reward)) return fmt::format("sample {}: non-finite reward", i);
    if (auto bad = routing_mismatch(s.routing, n)) return fmt::format("sample {}: {}", i, *bad);
    const auto& first = g.samples[0].routing;
    if (!s.routing.empty() && !first.empty() && (s.routing.layers != first.layers || s.routing.top_k != first.top_k))
      return fmt::format("sample {}: routing of {} sparse layers x top {}, sample 0's is {} x {}", i, s.routing.layers,
                         s.routing.top_k, first.layers, first.top_k);
  }
  return std::nullopt;
}

}  // namespace rlx::bus
