// What a process used while a benchmark ran: wall and CPU time, page faults, per-thread CPU
// and context switches, peak memory (rlx bench bus, in this process and its peers).
#pragma once

#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.hpp"
#include "rlx/core/clock.hpp"

namespace rlx::cli {

// CPU seconds this process has used (every thread, user and system).
inline double cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Minor page faults of this process so far (fresh heap memory touched for the first time).
inline double page_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

// Per thread name (threads that share one are summed): nanoseconds on a CPU and context
// switches, from /proc/self/task/*/{schedstat,status}.
struct ThreadUse {
  double cpu_ns = 0, switches = 0;
};
inline std::map<std::string, ThreadUse> thread_use() {
  std::map<std::string, ThreadUse> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm"), sched(task.path() / "schedstat"), status(task.path() / "status");
    std::string name;
    double ns = 0;
    if (!std::getline(comm, name) || !(sched >> ns)) continue;  // the thread ended meanwhile
    auto& u = out[name];
    u.cpu_ns += ns;
    for (std::string line; std::getline(status, line);)
      if (line.find("ctxt_switches:") != std::string::npos) u.switches += std::stod(line.substr(line.find(':') + 1));
  }
  return out;
}

// What this process used from its construction to take(): wall, CPU, page faults, and
// per thread CPU and context switches per message.
class Usage {
 public:
  Usage() : threads_(thread_use()), wall_(now_s()), cpu_(cpu_s()), faults_(page_faults()) {}
  double wall_s() const { return now_s() - wall_; }
  nlohmann::json take(int messages, const std::string& prefix = "") const {
    nlohmann::json per_thread = nlohmann::json::object();
    for (const auto& [name, a] : thread_use()) {
      const auto it = threads_.find(name);
      const ThreadUse b = it == threads_.end() ? ThreadUse{} : it->second;
      per_thread[prefix + name] = {{"cpu_us", (a.cpu_ns - b.cpu_ns) / 1e3 / messages},
                                   {"switches", (a.switches - b.switches) / messages}};
    }
    const std::string process = prefix.empty() ? "bench" : prefix.substr(0, prefix.size() - 1);
    return {{"wall_s", wall_s()},
            {"cpu_s", cpu_s() - cpu_},
            {"faults", page_faults() - faults_},
            {"threads", per_thread},
            {"peak_rss_mb", {{process, peak_rss_mb()}}}};
  }

 private:
  std::map<std::string, ThreadUse> threads_;
  double wall_, cpu_, faults_;
};

struct Timed {
  double wall_s = 0, cpu_s = 0, faults = 0;
  nlohmann::json threads = nlohmann::json::object();  // per thread: CPU us and context switches per message
  nlohmann::json peak_rss_mb = nlohmann::json::object();  // per process: its peak resident memory so far

  // Adds another process's share (its wall time does not add: the processes overlap).
  void add(const nlohmann::json& used) {
    cpu_s += used.at("cpu_s").get<double>();
    faults += used.at("faults").get<double>();
    threads.update(used.at("threads"));
    peak_rss_mb.update(used.at("peak_rss_mb"));
  }
};

}  // namespace rlx::cli
