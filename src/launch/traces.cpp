// The roles' traces (trace.enabled): each process's file, merged at the end of a run.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "role_common.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/trace.hpp"
#include "rlx/launch/roles.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

void start_trace(const RoleContext& ctx, Role role) {
  if (!ctx.cfg.trace.enabled) return;
  fs::create_directories(ctx.run_dir.traces());
  TraceWriter::install(std::make_shared<TraceWriter>(ctx.run_dir.trace(role, ctx.index, ::getpid()).string(),
                                                     fmt::format("{} {}", role_name(role), ctx.index)));
}

size_t merge_traces(const RunDir& run_dir) {
  const auto dir = run_dir.traces();
  if (!fs::exists(dir)) return 0;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::ostringstream out;
  out << "[\n";
  size_t events = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    // One event per line; a process killed mid-write leaves its last line cut: skipped.
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && (line.back() == ',' || line.back() == ' ')) line.pop_back();
      if (line.empty() || line[0] != '{') continue;
      if (json::parse(line, nullptr, false).is_discarded()) continue;
      out << (events++ > 0 ? ",\n" : "") << line;
    }
  }
  out << "\n]\n";
  write_file_atomic(run_dir.merged_trace(), out.str(), /*durable=*/false);
  return events;
}

}  // namespace rlx::launch
