#include "op_profile.hpp"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <map>

namespace rlx::cli {

namespace prof = torch::autograd::profiler;

void OpProfile::start() {
  prof::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU));
}

std::vector<OpTime> OpProfile::stop() {
  const auto lists = prof::disableProfilerLegacy();
  std::map<std::string, OpTime> by_name;
  for (const auto& events : lists) {
    // Each thread's events are in order: a push opens a call, a pop closes the innermost.
    struct Open {
      const prof::LegacyEvent* push;
      double child_us;
    };
    std::vector<Open> stack;
    std::map<std::string, int> depth;  // open calls per name, so a recursion counts once in total
    for (const auto& e : events) {
      if (e.kind() == prof::EventKind::PushRange) {
        stack.push_back({&e, 0.0});
        ++depth[e.name()];
      } else if (e.kind() == prof::EventKind::PopRange && !stack.empty()) {
        const auto open = stack.back();
        stack.pop_back();
        const double us = open.push->cpuElapsedUs(e);
        auto& op = by_name[open.push->name()];
        op.name = open.push->name();
        ++op.calls;
        op.self_us += us - open.child_us;
        if (--depth[op.name] == 0) op.total_us += us;
        if (!stack.empty()) stack.back().child_us += us;
      }
    }
  }
  std::vector<OpTime> out;
  for (auto& [name, op] : by_name) out.push_back(std::move(op));
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.self_us > b.self_us; });
  return out;
}

nlohmann::json OpProfile::to_json(const std::vector<OpTime>& ops, size_t top, double per) {
  auto j = nlohmann::json::array();
  double all = 0;
  for (const auto& op : ops) all += op.self_us;
  for (size_t i = 0; i < std::min(top, ops.size()); ++i)
    j.push_back({{"op", ops[i].name},
                 {"calls", static_cast<double>(ops[i].calls) / per},
                 {"self_ms", ops[i].self_us / per / 1e3},
                 {"total_ms", ops[i].total_us / per / 1e3}});
  j.push_back({{"op", "(all)"}, {"calls", nullptr}, {"self_ms", all / per / 1e3}, {"total_ms", nullptr}});
  return j;
}

std::string OpProfile::table(const nlohmann::json& rows) {
  const double all = rows.empty() ? 0.0 : rows.back()["self_ms"].get<double>();
  std::string s = fmt::format("{:<44} {:>8} {:>10} {:>10} {:>6}\n", "operator", "calls", "self ms", "total ms", "self%");
  for (const auto& r : rows) {
    const auto name = r["op"].get<std::string>();
    const double self = r["self_ms"].get<double>();
    if (r["calls"].is_null()) {
      s += fmt::format("{:<44} {:>8} {:>10.3f}\n", "all operators (self)", "", self);
      continue;
    }
    s += fmt::format("{:<44} {:>8.1f} {:>10.3f} {:>10.3f} {:>5.1f}%\n", name.substr(0, 44), r["calls"].get<double>(),
                     self, r["total_ms"].get<double>(), all > 0 ? 100 * self / all : 0.0);
  }
  return s;
}

}  // namespace rlx::cli
