#include "rollout/engine_inbox.hpp"

#include "rlx/core/error.hpp"

namespace rlx {

void EngineInbox::add(GenerationRequest r, const std::string& who) {
  std::lock_guard lock(mu_);
  RLX_CHECK(!live_ids_.contains(r.id), "{}: duplicate request id (a request with this id is in flight)", who);
  RLX_CHECK(static_cast<int64_t>(live_ids_.size()) < max_queued_, "{}: {} requests are in flight (max_queued)", who,
            live_ids_.size());
  live_ids_.insert(r.id);
  requests_.push_back(std::move(r));
}

bool EngineInbox::abort(const std::string& id) {
  std::lock_guard lock(mu_);
  if (!live_ids_.contains(id)) return false;
  aborts_.push_back(id);
  return true;
}

bool EngineInbox::has_work() const {
  std::lock_guard lock(mu_);
  return !live_ids_.empty();
}

size_t EngineInbox::in_flight() const {
  std::lock_guard lock(mu_);
  return live_ids_.size();
}

void EngineInbox::pause(bool paused) {
  std::lock_guard lock(mu_);
  paused_ = paused;
}

bool EngineInbox::paused() const {
  std::lock_guard lock(mu_);
  return paused_;
}

int64_t EngineInbox::version() const {
  std::lock_guard lock(mu_);
  return version_;
}

void EngineInbox::set_version(int64_t version) {
  std::lock_guard lock(mu_);
  version_ = version;
}

void EngineInbox::check_newer(const std::string& who, int64_t version, bool idle) const {
  std::lock_guard lock(mu_);
  RLX_CHECK(version > latest_, "{}: versions must increase; the latest is {}", who, latest_);
  RLX_CHECK(!idle || live_ids_.empty(),
            "{}: {} requests are in flight (load_weights needs an idle engine; update_weights "
            "stages weights for a busy one)",
            who, live_ids_.size());
}

void EngineInbox::stage(const std::string& who, PendingUpdate u) {
  std::lock_guard lock(mu_);
  RLX_CHECK(u.version > latest_, "{}: versions must increase; the latest is {}", who, latest_);
  latest_ = u.version;
  update_ = std::move(u);
}

void EngineInbox::loaded(int64_t version) {
  std::lock_guard lock(mu_);
  update_.reset();  // older than this one
  latest_ = version;
}

EngineInbox::Taken EngineInbox::take() {
  Taken t;
  std::lock_guard lock(mu_);
  t.requests.swap(requests_);
  t.aborts.swap(aborts_);
  t.update = std::move(update_);
  update_.reset();
  return t;
}

void EngineInbox::retire(const std::vector<std::string>& ids) {
  if (ids.empty()) return;
  std::lock_guard lock(mu_);
  for (const auto& id : ids) live_ids_.erase(id);
}

}  // namespace rlx
