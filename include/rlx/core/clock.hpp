// Monotonic seconds, for timeouts and rates (never for anything compared across hosts).
#pragma once

#include <chrono>

namespace rlx {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace rlx
