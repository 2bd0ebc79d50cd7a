// The run directory's layout (include/rlx/launch/run_dir.hpp): the names, and what is done
// to the directory as a whole (clearing, resuming, locking).
#include "rlx/launch/run_dir.hpp"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/launch/config.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/learner/checkpoint.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kHubStatePrefix = "hub-step_";
}  // namespace

RunDir RunDir::of(const RunConfig& cfg) { return RunDir(fs::absolute(fs::path(cfg.run.out_dir) / cfg.run.name)); }

std::string RunDir::hub_state_name(int64_t step) { return fmt::format("{}{:08d}.state", kHubStatePrefix, step); }

std::vector<fs::path> RunDir::hub_states() const {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(root_))
    if (e.path().filename().string().starts_with(kHubStatePrefix)) out.push_back(e.path());
  return out;
}

fs::path RunDir::role_logs(Role role, int index, int restart) const {
  auto dir = logs() / fmt::format("{}-{}", role_name(role), index);
  if (restart > 0) dir += fmt::format(".{}", restart);
  return dir;
}

fs::path RunDir::heartbeat(Role role, int index) const {
  return heartbeats() / fmt::format("{}-{}", role_name(role), index);
}

fs::path RunDir::failure(Role role, int index) const {
  return root_ / "failures" / fmt::format("{}-{}", role_name(role), index);
}

fs::path RunDir::worker_stats(int index) const { return stats() / fmt::format("{}{}.json", kWorkerStatsPrefix, index); }

fs::path RunDir::trace(Role role, int index, int64_t pid) const {
  return traces() / fmt::format("{}-{}.{}.json", role_name(role), index, pid);
}

fs::path RunDir::write_probe(int64_t pid) const { return root_ / fmt::format(".rlx-probe-{}", pid); }

fs::path RunDir::socket_dir() const {
  // The longest name below it: env-sockets/worker-WWWW.SSSS/env.sock.
  constexpr size_t kMaxSocketPath = 107, kLongestName = 40;
  if (root_.string().size() + kLongestName <= kMaxSocketPath) return root_;
  return fs::temp_directory_path() /
         fmt::format("rlx-{}-{:016x}", root_.filename().string().substr(0, 24), hash_name(root_.string()));
}

fs::path RunDir::TaskFiles::worker_ended(int index) const { return dir / fmt::format("worker-{}-ended", index); }

bool RunDir::holds_run() const { return fs::exists(hub_state()) || fs::exists(checkpoints()) || fs::exists(metrics()); }

void RunDir::clear(bool logs_too) const {
  for (const auto& p : {hub_state(), trajectories(), metrics(), samples(), checkpoints(), critic_checkpoints(),
                        final_model(), heartbeats(), episodes(), scale_request(), traces(), merged_trace(), stats(),
                        tasks(), env_sockets(), hub_endpoint(), weights_endpoint()})
    rlx::remove_tree(p);
  if (logs_too) rlx::remove_tree(logs()), rlx::remove_tree(fault_marker());
  if (const auto sockets = socket_dir(); sockets != root_) rlx::remove_tree(sockets);
  for (const auto& p : hub_states()) fs::remove(p);
}

int64_t RunDir::prepare_resume() const {
  int64_t step = 0;
  for (const auto& c : list_checkpoints(checkpoints())) {
    auto info = verify_checkpoint(c);
    if (!info.ok) {
      log::warn("resume: skipping {}: {}", c.string(), info.problem);
      continue;
    }
    const auto name = info.learner.value("references", json::object()).value("hub_state", std::string());
    RLX_CHECK(!name.empty() && fs::exists(hub_state_file(name)), "resume: {} names no hub state, or {} is missing",
              c.string(), hub_state_file(name).string());
    fs::copy_file(hub_state_file(name), hub_state(), fs::copy_options::overwrite_existing);
    // Episodes saved after that checkpoint may carry versions the resumed learner has not
    // made yet: their leases start over.
    rlx::remove_tree(episodes());
    step = checkpoint_run_step(info.learner.value("references", json::object()), info.step);
    break;
  }
  if (step == 0) {
    log::warn("resume: {} has no checkpoint yet; starting from step 0", string());
    clear(/*logs=*/false);
    return 0;
  }
  // metrics.jsonl and samples.jsonl keep the lines of the steps the checkpoint holds.
  for (const auto& file : {metrics(), samples()}) {
    std::vector<std::string> keep;
    std::ifstream in(file);
    if (!in) continue;
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("step", int64_t{0}) <= step) keep.push_back(line);
    }
    in.close();
    std::ofstream out(file, std::ios::trunc);
    for (const auto& l : keep) out << l << "\n";
  }
  return step;
}

void RunDir::remove_endpoints() const {
  fs::remove(hub_endpoint());
  fs::remove(weights_endpoint());
}

FileLock RunDir::lock() const {
  fs::create_directories(root_);
  int64_t holder = 0;
  auto lock = FileLock::try_lock(launcher_lock(), holder);
  RLX_CHECK(lock,
            "run directory {} is in use by another launcher (pid {}); stop it first (SIGINT), then --resume continues "
            "its run",
            string(), holder);
  return std::move(*lock);
}

uint32_t RunDir::scaled_workers(uint32_t fallback) const {
  std::ifstream f(scale_request());
  if (!f) return fallback;
  const auto j = json::parse(f, nullptr, false);
  const auto n = j.is_object() ? j.value("workers", int64_t{0}) : 0;
  if (n < 0 || n > 1024 || !j.is_object() || !j.contains("workers")) {
    log::warn("{}: \"workers\" must be 0 to 1024; keeping {}", scale_request().string(), fallback);
    return fallback;
  }
  return static_cast<uint32_t>(n);
}

void RunDir::request_workers(uint32_t workers) const {
  write_file_atomic(scale_request(), json{{"workers", workers}}.dump() + "\n");
}

}  // namespace rlx::launch
