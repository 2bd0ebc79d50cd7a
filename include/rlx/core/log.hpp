// Logging on fmt: levels, a role/rank prefix, stderr and an optional file.
//
//   rlx::log::set_identity("learner", 1);
//   rlx::log::info("step {} loss {:.4f}", step, loss);
//   // 2026-11-22 10:04:05.123 I learner-1 step 3 loss 0.6931
//
// Thread-safe; one line per call is written with a single write.
#pragma once

#include <fmt/format.h>

#include <array>
#include <string>
#include <utility>
#include <string_view>

namespace rlx::log {

enum class Level { trace = 0, debug = 1, info = 2, warn = 3, error = 4, off = 5 };
constexpr std::array<std::pair<Level, std::string_view>, 6> enum_names(Level) {
  return {{{Level::trace, "trace"}, {Level::debug, "debug"}, {Level::info, "info"},
           {Level::warn, "warn"}, {Level::error, "error"}, {Level::off, "off"}}};
}

// Parses "trace|debug|info|warn|error|off"; throws rlx::Error naming the value.
Level parse_level(std::string_view name);

void set_level(Level level);
Level level();
// Role and rank shown on every line ("hub", "learner-0"); rank < 0 omits it.
void set_identity(std::string_view role, int rank = -1);
// Also append every line to this file (empty path: stop). Throws if it cannot be opened.
void set_file(const std::string& path);
// Lines go to stderr unless turned off (files only, e.g. for child processes).
void set_stderr(bool enabled);

void write(Level level, std::string_view message);

inline bool enabled(Level l) { return l >= level(); }

template <class... Args>
void trace(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::trace)) write(Level::trace, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::debug)) write(Level::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::info)) write(Level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::warn)) write(Level::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::error)) write(Level::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace rlx::log
