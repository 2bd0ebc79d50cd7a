// The roles of a run and the launcher that starts them (`rlx run CONFIG`).
//
// Every role is a process of the same binary (`rlx role NAME ...`):
//   hub      the replay hub: prompts (the dataset, or tasks the environment
//            generates), leases, the replay buffer, trajectories.h5
//   learner  takes batches from the hub, trains with the configured algorithm
//            (train_on_batch), publishes each new version through weight sync
//            (shared memory), writes metrics.jsonl and a checkpoint at the end
//   worker   takes leases, runs each sample's episode against the environment with
//            the rollout engine, applies new weight versions between leases, and
//            sends trajectory groups (exact tokens, masks, behaviour log-probs,
//            versions, rewards) to the hub
// The launcher writes the run directory (config.yaml, logs/), starts the roles, and
// watches them: when the learner finishes, the others are stopped; when any role
// fails, the run stops and the error names the role, its index and how it ended.
//
//   rlx::RunConfig cfg = rlx::config::load_file<rlx::RunConfig>("grpo.yaml", overrides);
//   return rlx::launch::launch(cfg, "/proc/self/exe");
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "rlx/dist/weight_sync.hpp"
#include "rlx/launch/config.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/model/transformer.hpp"

namespace rlx::launch {

struct RoleContext {
  RunConfig cfg;
  std::filesystem::path run_dir;
  std::string weights;  // the weight-sync segment's name
  std::string exe;      // this binary (env servers are started from it)
  int index = 0;        // worker index or learner rank
  bool tcp = false;     // tcp transport: the hub listens on tcp://, weights travel over tcp
  // The hub's endpoint: ipc://RUN_DIR/hub.sock, or (tcp) what the hub wrote to
  // RUN_DIR/hub.endpoint once it listens (waited for, bounded by train.batch_timeout_s).
  std::string hub_address() const;
  // train.weight_sync, auto resolved by the transport.
  WeightSync weight_sync() const;
  // The weight-sync ends of this run (learner rank 0; rollout workers).
  std::unique_ptr<dist::WeightPublisher> weight_publisher(const dist::WeightLayout& layout) const;
  // give_up: asked while the subscriber waits for its first weights; true ends the wait (an Error).
  std::unique_ptr<dist::WeightSubscriber> weight_subscriber(std::function<bool()> give_up = {}) const;
};
// Where a run's unix sockets go (hub.sock, env-sockets/): the run directory, or, where it is
// too deep for a socket's path (107 bytes), /tmp/rlx-NAME-HASH (run.name, a hash of the path).
std::filesystem::path socket_dir(const std::filesystem::path& run_dir);
// The files a tcp run's hub and learner rank 0 write their endpoints to.
inline constexpr const char* kHubEndpointFile = "hub.endpoint";
inline constexpr const char* kWeightsEndpointFile = "weights.endpoint";
// Where learner rank 0 writes the broadcast path's control endpoint (train.weight_sync = broadcast).
inline constexpr const char* kBroadcastEndpointFile = "weights.bcast";

// The tokenizer of a run: tokenizer.path, else the model directory's, else (a preset
// model) the character tokenizer of toy tasks.
std::shared_ptr<const Tokenizer> run_tokenizer(const RunConfig& cfg);
// The policy's starting weights: model.path, else the preset (vocabulary sized to the
// tokenizer) initialised from run.seed. Every role builds the same one.
// Writes the run's tokenizer as tokenizer.json (env servers and exported models load it).
void write_tokenizer(const RunConfig& cfg, const std::filesystem::path& file);
std::shared_ptr<Transformer> initial_model(const RunConfig& cfg, const Tokenizer& tokenizer);

// A role's heartbeat: a thread rewrites run_dir/heartbeats/ROLE-INDEX every 0.5 s while
// the process runs (a SIGSTOPped or frozen process stops beating; the launcher notices),
// with what the role is doing (rlx::status) as one JSON line.
// True when RLX_LAUNCHER_PID (set by the launcher for its roles) is no longer this
// process's parent: the launcher died.
bool launcher_gone();
void start_heartbeat(const std::filesystem::path& run_dir, const std::string& role, int index);
// With trace.enabled, a role writes its spans (wait, train, publish, rollout, generate,
// env steps, ...) to run_dir/traces/ROLE-INDEX.PID.json; the launcher merges every
// process's file into run_dir/trace.json (ui.perfetto.dev opens it) when the run ends.
void start_trace(const RoleContext& ctx, const std::string& role);
// Merges run_dir/traces/*.json (also those a killed process left unterminated) into
// run_dir/trace.json. Returns the number of events.
size_t merge_traces(const std::filesystem::path& run_dir);
std::filesystem::path heartbeat_file(const std::filesystem::path& run_dir, const std::string& role, int index);
// A heartbeat as the launcher reads it.
struct RoleBeat {
  double beat = -1;     // the file's mtime (wall clock); -1: no heartbeat yet
  int64_t pid = 0;
  std::string status;   // what the role was doing (rlx::status)
  double since = 0;     // since when (wall clock)
  bool ready = false;   // its start-up was over
};
RoleBeat read_heartbeat(const std::filesystem::path& run_dir, const std::string& role, int index);

// A role that cannot run (a FatalError: an env server that cannot start, ...) writes why to
// run_dir/failures/ROLE-INDEX and exits with kExitCannotRun; the launcher then stops the run
// with that message rather than restarting the role.
inline constexpr int kExitCannotRun = 78;  // EX_CONFIG of sysexits.h
std::filesystem::path failure_file(const std::filesystem::path& run_dir, const std::string& role, int index);

// Tries the env server of this run once, as a rollout worker would start it (its sandbox,
// paths and limits): "" when it works, else why (the sandbox's message, the path, the limit).
// `rlx run` does this before it starts any role when env.servers > 0.
std::string check_env_server(const RoleContext& ctx, double timeout_s);

// The roles. Their process calls bus::keep_frame_memory() first, before any thread starts
// (`rlx role` does, in trainer_main): its one-arena setting binds only threads yet to allocate.
int run_hub(const RoleContext& ctx);
int run_learner(const RoleContext& ctx);
int run_worker(const RoleContext& ctx);

// `rlx sft`: warm-starts the model on the environment's generated tasks and their
// reference completions (task "completion", else "answer" as text and a newline), then
// writes an HF directory to run_dir/final. Prints the held-out accuracy before and after.
int run_sft(const RunConfig& cfg);

// Greedy held-out accuracy (mean episode reward) of `cfg`'s model on sft.eval_tasks tasks
// drawn from the environment's generator with a seed disjoint from training's.
double evaluate(const RunConfig& cfg);

struct LaunchOptions {
  bool resume = false;  // continue the run directory from its newest checkpoint
  bool force = false;   // start over in a run directory that holds a run
  // SIGHUP to the launcher reads the config again through this (the file and the command
  // line's overrides, validated): a changed rollout.workers scales the workers as `rlx
  // scale` does; other changed keys are named and left as they are (they need a restart,
  // --resume). A config that no longer loads is reported and the run goes on unchanged.
  std::function<RunConfig()> reload;
};

// `rlx run`: the run directory, the roles as processes of `exe`, and their watch.
// Returns the exit code (128 + signal when SIGINT/SIGTERM stopped it after a checkpoint).
int launch(const RunConfig& cfg, const std::string& exe, const LaunchOptions& options = {});

// A run as many tasks: under Slurm (`srun -n T rlx run CONFIG`, T > 1, by SLURM_PROCID
// and SLURM_NTASKS) or as a Kubernetes Indexed Job (`rlx k8s render`: RLX_TASK_INDEX,
// RLX_NUM_TASKS, RLX_TASK_GROUP), each task is one role of the plan: 0 the hub (it also
// prepares the run directory, hosts the learner group's store and prints the progress),
// 1..L the learner ranks (train.learner_ranks), then the W rollout workers
// (rollout.workers): T must be 1 + L + W. Each task runs its role as a child with the local
// launcher's policies (heartbeats; a worker is restarted up to rollout.max_restarts times);
// a dead hub or learner rank fails the whole group with an error naming it, and `--resume`
// (or a requeued job) continues from the last checkpoint. The tasks coordinate through
// files in run_dir/tasks/GROUP/, so the run directory must be shared (NFS, Lustre) when
// they span nodes; weights go through /dev/shm on one node, over tcp across nodes
// (train.transport).
struct RoleTask {
  int procid = 0, ntasks = 1;
  std::string group;  // names this start of the tasks (slurm-JOB.STEP.RESTARTS, or RLX_TASK_GROUP)
  std::string role;   // hub, learner or worker
  int index = 0;      // learner rank or worker index
  bool tcp = false;   // train.transport: tcp (or auto, and the tasks span nodes)
};
// The task of this process, or none (a single process launches every role). A plan that
// does not fit the tasks is a ConfigError naming the keys.
std::optional<RoleTask> task_from_env(const RunConfig& cfg);

// `rlx k8s render`: a headless Service, a ConfigMap with the resolved config, and an
// Indexed Job of 1 + L + W pods, each running `rlx run` as one task of the plan. The pods
// share one node (pod affinity), its network and /dev/shm, and the run directory
// (a hostPath, or a ReadWriteMany claim).
struct K8sOptions {
  std::string image = "rlx:latest";
  std::string namespace_;      // empty: the current one
  std::string host_path = "/var/lib/rlx/runs";  // the run directories on the node
  std::string claim;           // a PersistentVolumeClaim instead of the hostPath
  bool resume = false;         // the pods run `rlx run --resume`
};
std::string render_k8s(const RunConfig& cfg, const K8sOptions& options);

// `rlx scale RUN_DIR N`: asks the running launcher of RUN_DIR for N rollout workers. New
// workers join at once (they catch up to the current weights); surplus ones finish and
// send the leases they hold, then exit. Nothing is lost or repeated either way.
void scale(const std::filesystem::path& run_dir, uint32_t workers);

}  // namespace rlx::launch
