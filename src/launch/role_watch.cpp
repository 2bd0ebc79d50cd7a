// What the supervisor's backends read of a role: its heartbeat's age, and how it ended (its
// exit, its own words on why), which the supervisor (supervisor.hpp) weighs.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>

#include "launch_common.hpp"
#include "rlx/launch/roles.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;

namespace {
// The last line of a role's stderr that reports an error (its own words on why it ended),
// else "".
std::string last_error_line(const fs::path& log) {
  std::ifstream in(log, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(in.tellg());
  in.seekg(std::max<std::streamoff>(0, size - 65536));
  std::string found;
  for (std::string line; std::getline(in, line);)
    if (line.find("error") != std::string::npos || line.find("cannot run") != std::string::npos) found = line;
  if (found.size() > 600) found = found.substr(0, 600) + "...";
  return found;
}
}  // namespace

double wall_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

double heartbeat_mtime(const RunDir& run_dir, RoleId id) {
  struct stat st {};
  if (::stat(run_dir.heartbeat(id.role, id.index).c_str(), &st) != 0) return -1;
  return static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
}

RoleEnd role_end(const RunDir& run_dir, RoleId id, const dist::RankExit& e) {
  RoleEnd end{.ok = e.ok(), .stop_signal = e.signal == SIGTERM, .how = e.describe()};
  auto& f = end.failure;
  f.id = id;
  f.what = fmt::format("{} {} ended: {} (log: {})", role_name(id.role), id.index, e.describe(), e.err.string());
  const auto beat = read_heartbeat(run_dir, id.role, id.index);
  f.at_start = beat.pid != e.pid || !beat.ready;  // another pid: it never beat (a predecessor's file)
  f.cannot_run = e.exited && (e.code == kExitCannotRun || e.code == 2);
  if (e.exited && e.code == kExitCannotRun) {
    std::ifstream in(run_dir.failure(id.role, id.index));
    std::getline(in, f.cause);
  }
  if (f.cause.empty()) f.cause = last_error_line(e.err);
  return end;
}

}  // namespace rlx::launch
