// Turns on a shared device (core/device_turns.hpp).
#include "rlx/core/device_turns.hpp"

#include <chrono>

#include "rlx/core/clock.hpp"

namespace rlx {

DeviceTurns::Turn& DeviceTurns::Turn::operator=(Turn&& o) noexcept {
  if (this != &o) {
    release();
    owner_ = o.owner_, use_ = o.use_, since_ = o.since_;
    o.owner_ = nullptr;
  }
  return *this;
}

void DeviceTurns::Turn::release() {
  if (!owner_) return;
  owner_->release(use_, since_);
  owner_ = nullptr;
}

DeviceTurns::Turn DeviceTurns::hold(Use use, const std::atomic<bool>* cancel) {
  const int u = static_cast<int>(use);
  const double t0 = now_s();
  std::unique_lock lock(mu_);
  ++waiting_[u];
  const auto free_for_us = [&] { return !busy_ && (reserved_ < 0 || reserved_ == u); };
  while (!free_for_us()) {
    if (cancel && cancel->load()) {
      --waiting_[u];
      totals_.waited_s[u] += now_s() - t0;
      cv_.notify_all();  // a reservation for us may have to pass on
      if (reserved_ == u) reserved_ = -1;
      return {};
    }
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  --waiting_[u];
  busy_ = true;
  reserved_ = -1;
  totals_.waited_s[u] += now_s() - t0;
  const bool switching = !any_holder_ || last_ != use;
  any_holder_ = true;
  last_ = use;
  if (switching && o_.on_switch) {
    ++totals_.switches;
    lock.unlock();  // the hook may take long (freeing or allocating memory); the device stays ours
    try {
      o_.on_switch(use);
    } catch (...) {
      lock.lock();
      busy_ = false;
      any_holder_ = false;  // the next holder runs the hook again
      cv_.notify_all();
      throw;
    }
    lock.lock();
  }
  return Turn(this, use, now_s());
}

void DeviceTurns::release(Use use, double since) {
  std::lock_guard lock(mu_);
  const int u = static_cast<int>(use), other = 1 - u;
  totals_.held_s[u] += now_s() - since;
  busy_ = false;
  // Alternate when both want it: the other use, if it waits, goes next.
  reserved_ = waiting_[other] > 0 ? other : -1;
  cv_.notify_all();
}

DeviceTurns::Totals DeviceTurns::totals() const {
  std::lock_guard lock(mu_);
  return totals_;
}

DeviceTurns::Use DeviceTurns::last_use() const {
  std::lock_guard lock(mu_);
  return last_;
}

}  // namespace rlx
