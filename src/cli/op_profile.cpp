#include "op_profile.hpp"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
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

namespace {
const torch::profiler::impl::ProfilerConfig& kineto_config() {
  static const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  return config;
}

// LibTorch 2.x reports nanoseconds, 1.13 microseconds.
template <class Event>
double duration_us(const Event& e) {
  if constexpr (requires { e.durationNs(); })
    return static_cast<double>(e.durationNs()) / 1e3;
  else
    return static_cast<double>(e.durationUs());
}
}  // namespace

void KernelTrace::start(bool cuda) {
  std::set<torch::profiler::impl::ActivityType> activities{torch::profiler::impl::ActivityType::CPU};
  if (cuda) activities.insert(torch::profiler::impl::ActivityType::CUDA);
  prof::prepareProfiler(kineto_config(), activities);
  prof::enableProfiler(kineto_config(), activities);
}

nlohmann::json KernelTrace::stop(const std::string& dir, double per) {
  const auto result = prof::disableProfiler();
  std::filesystem::create_directories(dir);
  struct Sum {
    int64_t count = 0;
    double total_us = 0;
  };
  std::map<std::string, Sum> device, host;
  for (const auto& e : result->events()) {
    auto& s = (e.deviceType() == c10::DeviceType::CPU ? host : device)[e.name()];
    ++s.count;
    s.total_us += duration_us(e);
  }
  // A named range (RECORD_FUNCTION, rlx::learner::micro_batch) also shows on the device's
  // timeline, spanning the kernels it launched: not a kernel, so not counted.
  for (const auto& [name, s] : host) device.erase(name);
  const bool on_device = !device.empty();
  std::vector<std::pair<std::string, Sum>> rows(on_device ? device.begin() : host.begin(),
                                                on_device ? device.end() : host.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.total_us > b.second.total_us; });
  std::ofstream csv(dir + "/kernels.csv");
  csv << "name,launches_per_step,total_us_per_step,mean_us,share\n";
  double all = 0;
  int64_t launches = 0;
  for (const auto& [name, s] : rows) {
    all += s.total_us;
    launches += s.count;
  }
  for (const auto& [name, s] : rows) {
    std::string quoted = "\"";
    for (char c : name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    csv << fmt::format("{}\",{:.2f},{:.2f},{:.3f},{:.4f}\n", quoted, static_cast<double>(s.count) / per,
                       s.total_us / per, s.total_us / static_cast<double>(s.count), all > 0 ? s.total_us / all : 0.0);
  }
  bool saved = false;
  try {
    result->save(dir + "/trace.json");
    saved = true;
  } catch (const c10::Error&) {  // a LibTorch without Kineto (Debian's) keeps the events, not the trace
  }
  auto top = nlohmann::json::array();
  for (size_t i = 0; i < std::min<size_t>(rows.size(), 12); ++i)
    top.push_back({{"name", rows[i].first.substr(0, 120)},
                   {"launches_per_step", static_cast<double>(rows[i].second.count) / per},
                   {"us_per_step", rows[i].second.total_us / per}});
  return {{"dir", dir},
          {"what", on_device ? "device kernels" : "cpu operators"},
          {"launches_per_step", static_cast<double>(launches) / per},
          {"busy_us_per_step", all / per},
          {"chrome_trace", saved},
          {"top", top}};
}

}  // namespace rlx::cli
