#include "rlx/core/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>

#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"

namespace rlx::log {

namespace {
struct State {
  std::mutex mutex;
  std::string identity;
  int file_fd = -1;
  bool to_stderr = true;
};
State& state() {
  static State s;
  return s;
}
std::atomic<int> g_level{static_cast<int>(Level::info)};

constexpr std::array<char, 6> kLetters = {'T', 'D', 'I', 'W', 'E', '-'};

}  // namespace

Level parse_level(std::string_view name) {
  for (const auto& [level, n] : enum_names(Level{}))
    if (n == name) return level;
  throw Error(fmt::format("unknown log level '{}' (expected trace, debug, info, warn, error or off)", name));
}

void set_level(Level level) { g_level.store(static_cast<int>(level)); }
Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }

void set_identity(std::string_view role, int rank) {
  std::lock_guard lock(state().mutex);
  state().identity = rank >= 0 ? fmt::format("{}-{}", role, rank) : std::string(role);
}

void set_file(const std::string& path) {
  std::lock_guard lock(state().mutex);
  if (state().file_fd >= 0) ::close(state().file_fd);
  state().file_fd = -1;
  if (path.empty()) return;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("cannot open log file {}: {}", path, std::strerror(errno)));
  state().file_fd = fd;
}

void set_stderr(bool enabled) {
  std::lock_guard lock(state().mutex);
  state().to_stderr = enabled;
}

void write(Level level, std::string_view message) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  std::lock_guard lock(state().mutex);
  std::string line = fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03} {} {}{}{}\n", tm.tm_year + 1900,
                                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms,
                                 kLetters[static_cast<size_t>(level)], state().identity,
                                 state().identity.empty() ? "" : " ", message);
  if (state().to_stderr) write_all(STDERR_FILENO, line);
  if (state().file_fd >= 0) write_all(state().file_fd, line);
}

}  // namespace rlx::log
