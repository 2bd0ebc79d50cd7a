// What every role's process sets up: its threads, its stop signal, its peak memory.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "role_common.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

// Threads per process: the configured number, else the cores shared among the roles.
void set_threads(const RunConfig& cfg) {
  // Colocated, the learner's process rolls out too: taking turns (sync) one compute thread
  // at a time, overlapping (async) two, each with its share of the cores.
  const bool overlap = cfg.train.placement == Placement::colocated && cfg.train.mode == TrainMode::async;
  const auto procs = worker_processes(cfg) + cfg.train.learner_ranks + (overlap ? 1 : 0);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_compute_threads(cfg.run.threads > 0 ? cfg.run.threads : std::max(1, cores / static_cast<int>(procs)));
}

double peak_memory_mb(const RunConfig& cfg) {
  const auto device_peak = compat::device_peak_bytes(at::Device(cfg.model.device));
  if (device_peak >= 0) return static_cast<double>(device_peak) / (1024.0 * 1024.0);
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::atomic<bool> g_stop{false};
namespace {
extern "C" void on_stop(int) { g_stop = true; }
}  // namespace
void install_stop_handler() { on_stop_signals(on_stop); }

}  // namespace rlx::launch
