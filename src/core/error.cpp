#include "rlx/core/error.hpp"

#include <cstring>

namespace rlx::detail {

namespace {
const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void throw_check_failure(const char* cond, const char* file, int line, std::string message) {
  // User errors carry the message alone; the call site is kept for whoever debugs it.
  if (message.empty()) message = fmt::format("check failed: {}", cond);
  throw Error(fmt::format("{} [{}:{}]", message, basename_of(file), line));
}

void throw_assert_failure(const char* cond, const char* file, int line, std::string message) {
  throw InternalError(fmt::format("internal error (this is a bug in rlx): {} failed at {}:{}{}{}", cond,
                                  basename_of(file), line, message.empty() ? "" : ": ", message));
}

}  // namespace rlx::detail
