// Turns on one device that training and generation share in one process
// (train.placement = colocated): one of them holds the device at a time. When the holder
// changes from one use to the other, a hook runs first, so memory can be handed over
// exactly: the colocated role releases the rollout engine's KV pool before training and
// takes it back before generation. When both wait, the device alternates between them.
// It also keeps how long each use held the device and waited for it.
//
//   rlx::DeviceTurns turns({.on_switch = [&](rlx::DeviceTurns::Use to) {
//     to == rlx::DeviceTurns::Use::train ? engine.sleep() : engine.wake(); }});
//   {
//     auto turn = turns.hold(rlx::DeviceTurns::Use::train, &stop);   // blocks while generation holds it
//     if (turn) train();                                               // empty: `stop` was set while waiting
//   }                                                                  // released here
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

namespace rlx {

class DeviceTurns {
 public:
  enum class Use { generate = 0, train = 1 };
  struct Options {
    // Runs (in the thread taking the turn, before hold() returns) when the device goes to
    // `to` and the last holder had the other use (also at the first hold). An exception
    // from it leaves the device free and reaches hold()'s caller.
    std::function<void(Use to)> on_switch;
  };
  struct Totals {
    std::array<double, 2> held_s{0, 0};    // by Use: seconds holding the device
    std::array<double, 2> waited_s{0, 0};  // by Use: seconds waiting for it
    int64_t switches = 0;                  // on_switch calls
  };

  // A held turn; moving it moves the hold, destroying it releases the device.
  class Turn {
   public:
    Turn() = default;
    Turn(Turn&& o) noexcept : owner_(o.owner_), use_(o.use_), since_(o.since_) { o.owner_ = nullptr; }
    Turn& operator=(Turn&& o) noexcept;
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    ~Turn() { release(); }
    explicit operator bool() const { return owner_ != nullptr; }
    void release();

   private:
    friend class DeviceTurns;
    Turn(DeviceTurns* owner, Use use, double since) : owner_(owner), use_(use), since_(since) {}
    DeviceTurns* owner_ = nullptr;
    Use use_ = Use::generate;
    double since_ = 0;
  };

  explicit DeviceTurns(Options options = {}) : o_(std::move(options)) {}
  DeviceTurns(const DeviceTurns&) = delete;
  DeviceTurns& operator=(const DeviceTurns&) = delete;

  // Waits until the device is free (and, if the other use was waiting when it was last
  // released, until that one had its turn), then holds it for `use`. Returns an empty Turn
  // when `cancel` reads true while waiting (checked every 20 ms). Not reentrant.
  Turn hold(Use use, const std::atomic<bool>* cancel = nullptr);
  Totals totals() const;
  // Who held the device last (or holds it now); Use::generate before the first hold.
  Use last_use() const;

 private:
  void release(Use use, double since);
  Options o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;
  bool any_holder_ = false;      // someone held it before
  Use last_ = Use::generate;
  std::array<int, 2> waiting_{0, 0};
  int reserved_ = -1;            // the use that gets the next turn (it was waiting at a release); -1: either
  Totals totals_;
};

}  // namespace rlx
