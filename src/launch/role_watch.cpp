// How the launcher judges its roles: stuck (heartbeat files), and how one ended (its exit,
// its own words on why), which the restart policy weighs.
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

std::string stuck_reason(const TrainSection& train, const fs::path& run_dir, const std::string& role, int index,
                         double started) {
  struct stat st {};
  double beat = -1;  // the heartbeat file's mtime; a file older than this start is a predecessor's
  if (::stat(heartbeat_file(run_dir, role, index).c_str(), &st) == 0)
    beat = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
  const bool beaten = beat >= started;
  const double silent = wall_now() - (beaten ? beat : started);
  if (beaten && silent > train.heartbeat_timeout_s)
    return fmt::format("no heartbeat for {:.0f} s (train.heartbeat_timeout_s)", silent);
  if (!beaten && silent > train.start_timeout_s)
    return fmt::format("no first heartbeat {:.0f} s after its start (train.start_timeout_s)", silent);
  return "";
}

RoleFailure role_failure(const fs::path& run_dir, const char* role, int index, const dist::RankExit& e) {
  RoleFailure f{.role = role, .index = index};
  f.what = fmt::format("{} {} ended: {} (log: {})", role, index, e.describe(), e.err.string());
  const auto beat = read_heartbeat(run_dir, role, index);
  f.at_start = beat.pid != e.pid || !beat.ready;  // another pid: it never beat (a predecessor's file)
  f.cannot_run = e.exited && (e.code == kExitCannotRun || e.code == 2);
  if (e.exited && e.code == kExitCannotRun) {
    std::ifstream in(failure_file(run_dir, role, index));
    std::getline(in, f.cause);
  }
  if (f.cause.empty()) f.cause = last_error_line(e.err);
  return f;
}

}  // namespace rlx::launch
