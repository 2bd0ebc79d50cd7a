// The run directory's layout: every file and folder `rlx run` and its roles keep in
// run.out_dir/run.name is named here, and only here.
//
//   rlx::launch::RunDir dir = rlx::launch::RunDir::of(cfg);   // absolute(out_dir / name)
//   std::ofstream metrics(dir.metrics(), std::ios::app);     // RUN/metrics.jsonl
//   auto beat = dir.heartbeat(rlx::launch::Role::worker, 3);  // RUN/heartbeats/worker-3
//
//   RUN/config.yaml             the resolved config          tokenizer.json   the run's tokenizer
//   RUN/metrics.jsonl           one line per step            samples.jsonl    samples as text
//   RUN/checkpoints/step_N/     the learner's (-critic/: the critic's)
//   RUN/hub.state               the hub's state; hub-step_N.state: saved with checkpoint N
//   RUN/trajectories.h5         every trajectory group       episodes/        episode checkpoints
//   RUN/final/                  the trained model (HF; adapter/ with LoRA)
//   RUN/logs/ROLE-I[.K]/        each process's stdout/stderr; logs/plots/: the plotter's
//   RUN/heartbeats/ROLE-I       each role's heartbeat        failures/ROLE-I  why it cannot run
//   RUN/stats/worker-I.json     a worker's busy seconds      scale.json       `rlx scale`'s request
//   RUN/traces/*.json           each process's trace         trace.json       merged at the end
//   RUN/tasks/GROUP/            a many-task run's shared state (TaskFiles)
//   RUN/launcher.pid, .lock     the launcher running it      plots/, tensorboard/
//   RUN/hub.endpoint, weights.endpoint, weights.bcast        a tcp run's endpoints
//   SOCKETS/hub.sock, env-sockets/NAME/env.sock              SOCKETS: socket_dir()
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "rlx/core/files.hpp"
#include "rlx/launch/role.hpp"

namespace rlx {
struct RunConfig;
}

namespace rlx::launch {

class RunDir {
 public:
  using path = std::filesystem::path;
  RunDir() = default;
  explicit RunDir(path root) : root_(std::move(root)) {}
  // run.out_dir/run.name, absolute.
  static RunDir of(const RunConfig& cfg);

  const path& root() const { return root_; }
  std::string string() const { return root_.string(); }
  bool empty() const { return root_.empty(); }

  path config() const { return root_ / "config.yaml"; }
  path tokenizer() const { return root_ / "tokenizer.json"; }
  path metrics() const { return root_ / "metrics.jsonl"; }
  path samples() const { return root_ / "samples.jsonl"; }
  path checkpoints() const { return root_ / "checkpoints"; }
  path critic_checkpoints() const { return root_ / "checkpoints-critic"; }
  path hub_state() const { return root_ / "hub.state"; }
  // The hub's state saved with the checkpoint of `step`: its name (a checkpoint's
  // references hold it) and its file.
  static std::string hub_state_name(int64_t step);
  path hub_state_file(const std::string& name) const { return root_ / name; }
  // Every hub-step_N.state in the directory.
  std::vector<path> hub_states() const;
  path trajectories() const { return root_ / "trajectories.h5"; }
  path episodes() const { return root_ / "episodes"; }
  path final_model() const { return root_ / "final"; }
  path final_adapter() const { return final_model() / "adapter"; }
  path final_tokenizer() const { return final_model() / "tokenizer.json"; }
  path logs() const { return root_ / "logs"; }
  // A process's log folder: logs/ROLE-INDEX, and .RESTART for a restart (RESTART > 0).
  path role_logs(Role role, int index, int restart = 0) const;
  path plot_logs() const { return logs() / "plots"; }
  path plots() const { return root_ / "plots"; }
  path tensorboard() const { return root_ / "tensorboard"; }
  path heartbeats() const { return root_ / "heartbeats"; }
  path heartbeat(Role role, int index) const;
  path failure(Role role, int index) const;
  path stats() const { return root_ / "stats"; }
  path worker_stats(int index) const;
  // The prefix of worker_stats' file names ("worker-"): the index follows it.
  static constexpr const char* kWorkerStatsPrefix = "worker-";
  path scale_request() const { return root_ / "scale.json"; }
  path traces() const { return root_ / "traces"; }
  path trace(Role role, int index, int64_t pid) const;
  path merged_trace() const { return root_ / "trace.json"; }
  path fault_marker() const { return root_ / "fault-injected"; }
  path launcher_pid() const { return root_ / "launcher.pid"; }
  path launcher_lock() const { return root_ / "launcher.lock"; }
  // A file that proves the directory can be written (removed at once).
  path write_probe(int64_t pid) const;
  path hub_endpoint() const { return root_ / "hub.endpoint"; }
  path weights_endpoint() const { return root_ / "weights.endpoint"; }
  path broadcast_endpoint() const { return root_ / "weights.bcast"; }

  // Where the run's unix sockets go: the run directory, or, where it is too deep for a
  // socket's path (107 bytes), /tmp/rlx-NAME-HASH (run.name, a hash of the path).
  path socket_dir() const;
  path hub_socket() const { return socket_dir() / "hub.sock"; }
  path env_sockets() const { return socket_dir() / "env-sockets"; }
  // An env server's own folder (worker-W.S, check) and its socket and tokenizer in it.
  path env_server_dir(const std::string& name) const { return env_sockets() / name; }
  static path env_socket(const path& server_dir) { return server_dir / "env.sock"; }
  static path env_tokenizer(const path& server_dir) { return server_dir / "tokenizer.json"; }

  // The shared state of one start of a many-task run (Slurm, k8s): tasks/GROUP/.
  struct TaskFiles {
    path dir;
    path ready() const { return dir / "ready"; }    // task 0 prepared the run; the store's address
    path stop() const { return dir / "stop"; }      // SIGINT/SIGTERM reached task 0
    path failed() const { return dir / "failed"; }  // the first failure
    path learner_done() const { return dir / "learner-done"; }
    path done() const { return dir / "done"; }
    path worker_ended(int index) const;
  };
  path tasks() const { return root_ / "tasks"; }
  TaskFiles task_files(const std::string& group) const { return {tasks() / group}; }

  // A previous run is here (a hub state, checkpoints or metrics).
  bool holds_run() const;
  // Removes what a run wrote. `logs`: false keeps the logs and the fault-injection marker
  // (a run restarted before its first checkpoint).
  void clear(bool logs = true) const;
  // --resume, and a restart: the hub as it was at the newest verified checkpoint, the
  // metrics and samples up to it, no episodes past it. Returns its run step; 0 when there
  // is no checkpoint (then the run is cleared, its logs kept).
  int64_t prepare_resume() const;
  // The endpoint files of a tcp run (written again by each start of the hub and learner).
  void remove_endpoints() const;
  // The launcher's lock on the directory (created if missing), held while it lives: a
  // second launcher is refused, naming the PID of the one running it.
  FileLock lock() const;
  // The number of rollout workers asked for by `rlx scale` (scale.json), else `fallback`.
  uint32_t scaled_workers(uint32_t fallback) const;
  // `rlx scale`'s request (scale.json).
  void request_workers(uint32_t workers) const;

 private:
  path root_;
};

}  // namespace rlx::launch
