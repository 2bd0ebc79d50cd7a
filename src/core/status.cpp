#include "rlx/core/status.hpp"

#include <chrono>
#include <mutex>

namespace rlx::status {

namespace {
// Never destroyed: a role's heartbeat thread (detached) reads them until the process is gone,
// static destructors included.
std::mutex& g_mutex = *new std::mutex;
Snapshot& g_now = *new Snapshot;

double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

void set(std::string what) {
  std::lock_guard lock(g_mutex);
  g_now.what = std::move(what);
  g_now.since = wall_s();
}

void ready() {
  std::lock_guard lock(g_mutex);
  g_now.ready = true;
}

Snapshot get() {
  std::lock_guard lock(g_mutex);
  return g_now;
}

Scope::Scope(std::string what) : before_(get()) { set(std::move(what)); }

Scope::~Scope() {
  std::lock_guard lock(g_mutex);
  g_now.what = std::move(before_.what);
  g_now.since = before_.since;
}

}  // namespace rlx::status
