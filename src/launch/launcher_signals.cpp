#include "launcher_signals.hpp"

#include <signal.h>

#include <atomic>

#include "rlx/core/signals.hpp"

namespace rlx::launch {

namespace {
std::atomic<int> g_launcher_signal{0};
std::atomic<bool> g_reload{false};
extern "C" void on_launcher_signal(int sig) { g_launcher_signal = sig; }
extern "C" void on_reload_signal(int) { g_reload = true; }
}  // namespace

void watch_stop_signals() { on_stop_signals(on_launcher_signal); }
void watch_reload_signal() { on_stop_signals(on_reload_signal, {SIGHUP}); }

void block_leave_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int take_stop_signal() { return g_launcher_signal.exchange(0); }
bool take_reload_signal() { return g_reload.exchange(false); }

}  // namespace rlx::launch
