// Stop signals of long-running commands and roles: the handler only records the signal
// (a flag the main loop checks); blocking calls it interrupts return EINTR.
//
//   std::atomic<bool> g_stop{false};
//   rlx::on_stop_signals([](int) { g_stop = true; });   // SIGINT and SIGTERM
//
// And the fatal ones: report_crashes() (every rlx main calls it first) makes a SIGSEGV,
// SIGBUS, SIGFPE, SIGILL or SIGABRT print its name, the faulting address and the stack to
// stderr (a role's log) before the process ends with the same signal.
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

// Installs the fatal signals' report (idempotent; the main thread's reports run on an
// alternate stack, so a stack overflow there is reported too).
void report_crashes();

}  // namespace rlx
