// The fatal signals' report (signals.hpp). The handler uses only async-signal-safe calls, and
// backtrace(), whose first call (which loads libgcc and allocates) is made at install time.
#include "rlx/core/signals.hpp"

#include <execinfo.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>

namespace rlx {
namespace {

constexpr std::array<int, 5> kFatal = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// Appends text to buf at n (bounded by the buffer).
template <size_t N>
void put(std::array<char, N>& buf, size_t& n, const char* text) {
  while (*text && n < N) buf[n++] = *text++;
}
template <size_t N>
void put_number(std::array<char, N>& buf, size_t& n, uintptr_t v, unsigned base) {
  char digits[24];
  int d = 0;
  do {
    digits[d++] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0 && d < 24);
  if (base == 16) put(buf, n, "0x");
  while (d > 0 && n < N) buf[n++] = digits[--d];
}

void on_fatal(int sig, siginfo_t* info, void* context) {
  std::array<char, 256> line{};
  size_t n = 0;
  put(line, n, "rlx: fatal signal ");
  put_number(line, n, static_cast<uintptr_t>(sig), 10);
  put(line, n, " (");
  put(line, n, sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
  put(line, n, ")");
  if (info && info->si_code <= 0) {  // kill() or raise(): a sender, not a fault
    put(line, n, " sent by pid ");
    put_number(line, n, static_cast<uintptr_t>(info->si_pid), 10);
  } else if (info) {
    put(line, n, " at address ");
    put_number(line, n, reinterpret_cast<uintptr_t>(info->si_addr), 16);
  }
  put(line, n, " in pid ");
  put_number(line, n, static_cast<uintptr_t>(::getpid()), 10);
  put(line, n, "; the stack (addr2line -e LIBRARY OFFSET names a frame):\n");
  (void)!::write(STDERR_FILENO, line.data(), n);
#if defined(__x86_64__)
  // A call through a null pointer (pc 0) leaves no frame to unwind from: the word at the stack
  // pointer is the caller's return address. (Read only then: after a stack overflow it faults.)
  if (context) {
    const auto& regs = static_cast<const ucontext_t*>(context)->uc_mcontext.gregs;
    if (regs[REG_RIP] == 0) {
      void* caller = *reinterpret_cast<void* const*>(regs[REG_RSP]);
      constexpr char kCaller[] = "pc 0: called through a null pointer from\n";
      (void)!::write(STDERR_FILENO, kCaller, sizeof kCaller - 1);
      ::backtrace_symbols_fd(&caller, 1, STDERR_FILENO);
    }
  }
#endif
  void* frames[64];
  const int depth = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  // SA_RESETHAND restored the default action: returning re-runs the faulting instruction
  // (or abort() raises again), and the process ends with this signal as it would have.
}

}  // namespace

void report_crashes() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  void* warm[1];
  (void)::backtrace(warm, 1);
  static std::array<char, 64 * 1024> alt_stack;
  stack_t ss{};
  ss.ss_sp = alt_stack.data();
  ss.ss_size = alt_stack.size();
  (void)::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (const int s : kFatal) ::sigaction(s, &sa, nullptr);
}

}  // namespace rlx
