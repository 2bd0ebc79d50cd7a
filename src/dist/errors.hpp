// Small helpers shared by the communicator and the rendezvous store (src/dist/).
#pragma once

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

namespace rlx::dist {

inline std::chrono::milliseconds to_ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0)); }

// An exception's message; a c10::Error's without its backtrace.
inline std::string error_text(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace rlx::dist
