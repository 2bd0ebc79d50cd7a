// LocalGroup's process handling that needs no collective: SIGTERM held while a process starts.
#include "rlx/dist/local_group.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <thread>

namespace {

// A process that takes 0.5 s to start (as a role loading LibTorch does), then installs a
// SIGTERM handler (exit 7) and unblocks SIGTERM, as a rollout worker does.
rlx::dist::LocalGroupOptions slow_starter(bool block) {
  return {.argv = {"python3", "-c",
                   "import os, signal, time\n"
                   "time.sleep(0.5)\n"
                   "signal.signal(signal.SIGTERM, lambda *a: os._exit(7))\n"
                   "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})\n"
                   "time.sleep(10)\n"},
          .block_sigterm = block};
}

rlx::dist::RankExit terminated_while_starting(bool block) {
  rlx::dist::LocalGroup g(slow_starter(block));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // python is still starting
  g.signal(0, SIGTERM);
  for (int i = 0; i < 200 && !g.poll(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return g.ranks()[0];
}

}  // namespace

TEST_CASE("local group: SIGTERM sent while a process starts reaches its handler when block_sigterm", "[dist]") {
  const auto held = terminated_while_starting(true);
  CHECK(held.exited);
  CHECK(held.code == 7);  // handled, once the handler was there
  const auto plain = terminated_while_starting(false);
  CHECK_FALSE(plain.exited);
  CHECK(plain.signal == SIGTERM);  // without: the default action, before the process could say a word
}
