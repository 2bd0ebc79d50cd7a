// report_crashes(): a process that faults prints the signal and its stack to stderr, and
// still ends with the signal (what a supervisor reports), in a child process of its own.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdint>
#include <string>

#include "rlx/core/signals.hpp"

namespace {

// Runs `fault` in a forked child that installed the report; its stderr and wait status.
template <class F>
std::pair<std::string, int> crash_in_child(F fault) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(p[1], STDERR_FILENO);
    ::close(p[0]);
    rlx::report_crashes();
    fault();
    ::_exit(0);
  }
  ::close(p[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {text, status};
}

[[gnu::noinline]] void write_through_null() {
  volatile uintptr_t address = 0;  // (a literal null store is one the compiler may delete)
  *reinterpret_cast<volatile int*>(address) = 1;
}

[[gnu::noinline]] int recurse(int n) {  // a stack overflow, on the main thread's stack
  volatile char pad[4096];
  pad[0] = static_cast<char>(n);
  return n == 0 ? pad[0] : recurse(n + 1) + pad[0];
}

[[gnu::noinline]] void call_through_null() {  // pc 0: no frame to unwind from
  volatile uintptr_t address = 0;
  reinterpret_cast<void (*)()>(address)();
}

}  // namespace

TEST_CASE("report_crashes: a call through a null pointer names its caller", "[signals]") {
  const auto [text, status] = crash_in_child([] { call_through_null(); });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK_THAT(text, Catch::Contains("at address 0x0 in pid "));
  // The return address into call_through_null's caller, in the test binary.
  CHECK_THAT(text, Catch::Contains("pc 0: called through a null pointer from\n") &&
                       Catch::Contains("rlx_tests"));
}

TEST_CASE("report_crashes: a fault prints its signal, address and stack; the process still dies of it", "[signals]") {
  const auto [text, status] = crash_in_child([] { write_through_null(); });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK_THAT(text, Catch::Contains("rlx: fatal signal 11 (SEGV) at address 0x0 in pid "));
  // The frames: one line each, the test binary's among them.
  CHECK(std::count(text.begin(), text.end(), '\n') >= 4);
  CHECK_THAT(text, Catch::Contains("rlx_tests"));
}

TEST_CASE("report_crashes: abort() and a stack overflow are reported too", "[signals]") {
  auto [text, status] = crash_in_child([] { std::abort(); });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK_THAT(text, Catch::StartsWith("rlx: fatal signal 6 (ABRT) sent by pid "));
  std::tie(text, status) = crash_in_child([] { (void)recurse(1); });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK_THAT(text, Catch::Contains("rlx: fatal signal 11 (SEGV) at address 0x"));
}
