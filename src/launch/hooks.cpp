#include "rlx/launch/hooks.hpp"

#include <mutex>

namespace rlx::launch {

namespace {
std::vector<Hooks>& registered() {
  static std::vector<Hooks> h;
  return h;
}
std::mutex& registered_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

void add_hooks(Hooks hooks) {
  std::lock_guard lock(registered_mutex());
  registered().push_back(std::move(hooks));
}

const std::vector<Hooks>& hooks() {
  std::lock_guard lock(registered_mutex());
  return registered();
}

}  // namespace rlx::launch
