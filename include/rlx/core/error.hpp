// rlx::Error and the two checking macros every module uses.
//
//   RLX_CHECK(cond, fmt, args...)   bad user input (a config key, a file, a frame):
//                                   throws rlx::Error with the message and the call site.
//   RLX_ASSERT(cond, fmt, args...)  a broken invariant, i.e. a bug in rlx: throws
//                                   rlx::InternalError that says so.
//
//   RLX_CHECK(n > 0, "model.num_layers must be >= 1, got {}", n);
//
// A library never exits on user error; the CLI turns Error into exit codes.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace rlx {

// A user-facing error: the message names what was wrong and where.
class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

// A configuration error (the CLI maps it to exit code 2).
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A failure that will not heal by trying again: a configuration or a machine that cannot
// run (an env server that cannot start in its sandbox, a file that cannot be read). The
// run stops with it on the console instead of retrying or restarting.
class FatalError : public Error {
 public:
  using Error::Error;
};

// A broken invariant inside rlx.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(std::string message) : std::logic_error(std::move(message)) {}
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* cond, const char* file, int line, std::string message);
[[noreturn]] void throw_assert_failure(const char* cond, const char* file, int line, std::string message);

inline std::string format_or_empty() { return {}; }
template <class... Args>
std::string format_or_empty(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...);
}
}  // namespace detail

}  // namespace rlx

#define RLX_CHECK(cond, ...)                                                                   \
  do {                                                                                         \
    if (!(cond)) [[unlikely]]                                                                  \
      ::rlx::detail::throw_check_failure(#cond, __FILE__, __LINE__,                            \
                                         ::rlx::detail::format_or_empty(__VA_ARGS__));         \
  } while (0)

#define RLX_ASSERT(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) [[unlikely]]                                                                  \
      ::rlx::detail::throw_assert_failure(#cond, __FILE__, __LINE__,                           \
                                          ::rlx::detail::format_or_empty(__VA_ARGS__));        \
  } while (0)

// Debug-only check for hot paths.
#ifdef NDEBUG
#define RLX_DCHECK(cond, ...) ((void)0)
#else
#define RLX_DCHECK(cond, ...) RLX_ASSERT(cond, __VA_ARGS__)
#endif
