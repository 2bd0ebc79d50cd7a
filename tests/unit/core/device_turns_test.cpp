#include "rlx/core/device_turns.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../helpers.hpp"

using rlx::DeviceTurns;
using Use = rlx::DeviceTurns::Use;

TEST_CASE("device turns: one holder at a time, the hook only when the use changes", "[core][colocated]") {
  std::vector<int> switches;  // 0 generate, 1 train
  DeviceTurns turns({.on_switch = [&](Use to) { switches.push_back(static_cast<int>(to)); }});
  { auto t = turns.hold(Use::generate); REQUIRE(t); }
  { auto t = turns.hold(Use::generate); REQUIRE(t); }  // same use: no hook
  { auto t = turns.hold(Use::train); REQUIRE(t); }
  { auto t = turns.hold(Use::generate); REQUIRE(t); }
  REQUIRE(switches == std::vector<int>{0, 1, 0});
  REQUIRE(turns.totals().switches == 3);
  REQUIRE(turns.last_use() == Use::generate);
}

TEST_CASE("device turns: the other use waits while one holds the device, and is cancelled by its flag",
          "[core][colocated]") {
  DeviceTurns turns;
  auto held = turns.hold(Use::generate);
  std::atomic<bool> got{false}, cancel{false};
  std::thread trainer([&] {
    auto t = turns.hold(Use::train);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_FALSE(got);  // generation still holds it
  // A third party asking with a flag that is set gives up, empty-handed.
  std::thread quitter([&] {
    auto t = turns.hold(Use::train, &cancel);
    REQUIRE_FALSE(t);
  });
  cancel = true;
  quitter.join();
  held.release();
  trainer.join();
  REQUIRE(got);
  REQUIRE(turns.totals().waited_s[1] >= 0.05);
}

TEST_CASE("device turns: both waiting, the device alternates between the uses", "[core][colocated]") {
  DeviceTurns turns;
  std::mutex mu;
  std::vector<Use> order;
  std::atomic<bool> go{false};
  auto user = [&](Use use) {
    while (!go) std::this_thread::yield();
    for (int i = 0; i < 20; ++i) {
      auto t = turns.hold(use);
      {
        std::lock_guard lock(mu);
        order.push_back(use);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  std::thread a(user, Use::generate), b(user, Use::train);
  go = true;
  a.join();
  b.join();
  REQUIRE(order.size() == 40);
  // While both still want it, no use takes two turns in a row (the tail may run alone).
  int repeats = 0;
  for (size_t i = 1; i < order.size(); ++i) repeats += order[i] == order[i - 1];
  REQUIRE(repeats <= 2);
}

TEST_CASE("device turns: a failing hook leaves the device free and runs again next time", "[core][colocated]") {
  int calls = 0;
  DeviceTurns turns({.on_switch = [&](Use) {
    if (++calls == 1) throw std::runtime_error("no memory for the KV pool");
  }});
  REQUIRE_THROWS_WITH(turns.hold(Use::generate), Catch::Matchers::Contains("no memory"));
  auto t = turns.hold(Use::generate);  // not deadlocked; the hook runs again
  REQUIRE(t);
  REQUIRE(calls == 2);
}
