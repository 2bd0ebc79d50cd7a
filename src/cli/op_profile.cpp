#include "op_profile.hpp"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <map>

namespace rlx::cli {

namespace prof = torch::autograd::profiler;

void OpProfile::start(bool cuda) {
  cuda_ = cuda;
  prof::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(cuda ? torch::profiler::impl::ProfilerState::CUDA
                                                                        : torch::profiler::impl::ProfilerState::CPU));
}

std::vector<OpTime> OpProfile::stop() {
  const auto lists = prof::disableProfilerLegacy();
  std::map<std::string, OpTime> by_name;
  for (const auto& events : lists) {
    // Each thread's events are in order: a push opens a call, a pop closes the innermost.
    struct Open {
      const prof::LegacyEvent* push;
      double child_us;
      double child_device_us;
    };
    std::vector<Open> stack;
    std::map<std::string, int> depth;  // open calls per name, so a recursion counts once in total
    for (const auto& e : events) {
      if (e.kind() == prof::EventKind::PushRange) {
        stack.push_back({&e, 0.0, 0.0});
        ++depth[e.name()];
      } else if (e.kind() == prof::EventKind::PopRange && !stack.empty()) {
        const auto open = stack.back();
        stack.pop_back();
        const double us = open.push->cpuElapsedUs(e);
        const double dev = open.push->hasCuda() && e.hasCuda() ? open.push->cudaElapsedUs(e) : 0.0;
        auto& op = by_name[open.push->name()];
        op.name = open.push->name();
        ++op.calls;
        op.self_us += us - open.child_us;
        op.self_device_us += dev - open.child_device_us;
        if (--depth[op.name] == 0) op.total_us += us;
        if (!stack.empty()) {
          stack.back().child_us += us;
          stack.back().child_device_us += dev;
        }
      }
    }
  }
  std::vector<OpTime> out;
  for (auto& [name, op] : by_name) out.push_back(std::move(op));
  if (cuda_)
    std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.self_device_us > b.self_device_us; });
  else
    std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.self_us > b.self_us; });
  return out;
}

nlohmann::json OpProfile::to_json(const std::vector<OpTime>& ops, size_t top, double per) {
  auto j = nlohmann::json::array();
  double all = 0, all_device = 0;
  for (const auto& op : ops) {
    all += op.self_us;
    all_device += op.self_device_us;
  }
  for (size_t i = 0; i < std::min(top, ops.size()); ++i)
    j.push_back({{"op", ops[i].name},
                 {"calls", static_cast<double>(ops[i].calls) / per},
                 {"self_ms", ops[i].self_us / per / 1e3},
                 {"total_ms", ops[i].total_us / per / 1e3},
                 {"self_device_ms", ops[i].self_device_us / per / 1e3}});
  j.push_back({{"op", "(all)"}, {"calls", nullptr}, {"self_ms", all / per / 1e3}, {"total_ms", nullptr},
               {"self_device_ms", all_device / per / 1e3}});
  return j;
}

std::string OpProfile::table(const nlohmann::json& rows) {
  // With device times (a GPU profile), the shares are of the device's time.
  const bool device = !rows.empty() && rows.back().value("self_device_ms", 0.0) > 0;
  const char* key = device ? "self_device_ms" : "self_ms";
  const double all = rows.empty() ? 0.0 : rows.back()[key].get<double>();
  std::string s = fmt::format("{:<44} {:>8} {:>10} {:>10} {:>10} {:>6}\n", "operator", "calls", "self ms", "total ms",
                              "device ms", "share");
  for (const auto& r : rows) {
    const auto name = r["op"].get<std::string>();
    const double self = r["self_ms"].get<double>(), dev = r.value("self_device_ms", 0.0);
    if (r["calls"].is_null()) {
      s += fmt::format("{:<44} {:>8} {:>10.3f} {:>10} {:>10.3f}\n", "all operators (self)", "", self, "", dev);
      continue;
    }
    s += fmt::format("{:<44} {:>8.1f} {:>10.3f} {:>10.3f} {:>10.3f} {:>5.1f}%\n", name.substr(0, 44),
                     r["calls"].get<double>(), self, r["total_ms"].get<double>(), dev,
                     all > 0 ? 100 * r[key].get<double>() / all : 0.0);
  }
  return s;
}

}  // namespace rlx::cli
