// A role's heartbeat (written by a thread of the role, read by the launcher), and whether
// its launcher is still there.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "rlx/core/files.hpp"
#include "rlx/core/status.hpp"
#include "rlx/launch/roles.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

void start_heartbeat(const RunDir& run_dir, Role role, int index) {
  const auto file = run_dir.heartbeat(role, index);
  fs::create_directories(file.parent_path());
  status::set("starting");
  std::thread([file] {
    for (;;) {
      // Replaced whole (not durable: a beat is news, not state): its mtime is the beat, its
      // text what the role is doing. A failed write (a full disk) is a beat missed.
      const auto now = status::get();
      const auto text = json{{"pid", ::getpid()}, {"status", now.what}, {"since", now.since}, {"ready", now.ready}}.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
      try {
        write_file_atomic(file, text, /*durable=*/false);
      } catch (const std::exception&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }).detach();
}

RoleBeat read_heartbeat(const RunDir& run_dir, Role role, int index) {
  RoleBeat b;
  const auto file = run_dir.heartbeat(role, index);
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return b;
  b.beat = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
  std::ifstream in(file);
  const auto j = json::parse(in, nullptr, false);
  if (!j.is_object()) return b;
  b.pid = j.value("pid", int64_t{0});
  b.status = j.value("status", std::string());
  b.since = j.value("since", 0.0);
  b.ready = j.value("ready", false);
  return b;
}

bool launcher_gone() {
  const char* p = std::getenv("RLX_LAUNCHER_PID");
  return p && ::getppid() != std::atoi(p);
}

}  // namespace rlx::launch
