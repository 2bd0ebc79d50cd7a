// Stop signals of long-running commands and roles: the handler only records the signal
// (a flag the main loop checks); blocking calls it interrupts return EINTR.
//
//   std::atomic<bool> g_stop{false};
//   rlx::on_stop_signals([](int) { g_stop = true; });   // SIGINT and SIGTERM
#pragma once

#include <signal.h>

#include <initializer_list>

namespace rlx {

inline void on_stop_signals(void (*handler)(int), std::initializer_list<int> signals = {SIGINT, SIGTERM}) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  for (const int s : signals) ::sigaction(s, &sa, nullptr);
}

}  // namespace rlx
