#include "rlx/bus/hub_state.hpp"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "rlx/core/error.hpp"
#include "rlx/core/rng.hpp"

namespace rlx::bus {

std::vector<std::string> load_jsonl(const std::filesystem::path& file, size_t max_records) {
  std::ifstream in(file, std::ios::binary);
  RLX_CHECK(in.good(), "cannot read dataset {}", file.string());
  std::vector<std::string> out;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}:{}: not valid JSON: {}", file.string(), lineno, e.what()));
    }
    RLX_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
              "{}:{}: each record must be a JSON object with a string \"prompt\"", file.string(), lineno);
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
  auto it = active_.find(lease_id);
  if (it == active_.end()) return false;  // late duplicate, or a lease that already ended
  active_.erase(it);
  ended_.emplace(lease_id, true);
  ++completed_count_;
  return true;
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
  RLX_CHECK(kind == "infra" || kind == "data", "lease {}: failure kind must be infra or data, got '{}'", lease_id, kind);
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

ReplayBuffer::Verdict ReplayBuffer::push(TrajectoryGroup group, int64_t current_version) {
  const auto [oldest, newest] = group.version_range();
  if (oldest >= 0 && oldest < current_version - options_.max_staleness) {
    ++counts_.stale;
    return Verdict::stale;
  }
  if (options_.drop_uniform_rewards && group.samples.size() > 1) {
    bool uniform = true;
    for (const auto& s : group.samples) uniform &= s.reward == group.samples.front().reward;
    if (uniform) {
      ++counts_.filtered;
      return Verdict::filtered;
    }
  }
  if (groups_.size() >= options_.capacity_groups) {
    ++counts_.full;
    return Verdict::full;
  }
  groups_.push_back(std::move(group));
  ++counts_.accepted;
  return Verdict::accepted;
}

size_t ReplayBuffer::evict_stale(int64_t current_version) {
  const size_t before = groups_.size();
  std::erase_if(groups_, [&](const TrajectoryGroup& g) {
    const int64_t oldest = g.version_range().first;
    return oldest >= 0 && oldest < current_version - options_.max_staleness;
  });
  counts_.evicted_stale += before - groups_.size();
  return before - groups_.size();
}

std::vector<TrajectoryGroup> ReplayBuffer::pop(size_t max_groups, uint64_t max_tokens) {
  std::vector<TrajectoryGroup> out;
  uint64_t tokens = 0;
  while (!groups_.empty()) {
    const auto n = static_cast<uint64_t>(groups_.front().num_tokens());
    if (!out.empty() && ((max_groups && out.size() >= max_groups) || (max_tokens && tokens + n > max_tokens))) break;
    tokens += n;
    out.push_back(std::move(groups_.front()));
    groups_.pop_front();
  }
  return out;
}

}  // namespace rlx::bus
