// The roles of a run (the launcher that starts them: launcher.hpp; a run as many tasks
// under Slurm or Kubernetes: tasks.hpp).
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
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "rlx/dist/weight_sync.hpp"
#include "rlx/launch/config.hpp"
#include "rlx/launch/role.hpp"
#include "rlx/launch/run_dir.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/model/transformer.hpp"

namespace rlx::launch {

struct RoleContext {
  RunConfig cfg;
  RunDir run_dir;
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
// Set (to 1) for learner ranks whose launcher restarts a dead rank other than 0 alone:
// the group re-forms around its replacement (dist::ReformableGroup) instead of the run restarting.
inline constexpr const char* kLearnerReformEnv = "RLX_LEARNER_REFORM";
// The run step a learner checkpoint holds (the weights version the learner role saved in its
// references); the checkpoint's own step counts optimizer steps, algorithm.epochs x
// algorithm.mini_batches of them per run step.
inline int64_t checkpoint_run_step(const nlohmann::json& references, int64_t optimizer_step) {
  return references.value("weights_version", optimizer_step);
}

// The tokenizer of a run: tokenizer.path, else the model directory's, else (a preset
// model) the character tokenizer of toy tasks.
std::shared_ptr<const Tokenizer> run_tokenizer(const RunConfig& cfg);
// The policy's starting weights: model.path, else the preset (vocabulary sized to the
// tokenizer) initialised from run.seed. Every role builds the same one.
// Writes the run's tokenizer as tokenizer.json (env servers and exported models load it).
void write_tokenizer(const RunConfig& cfg, const std::filesystem::path& file);
// `device`: where it goes (default model.device; a learner rank's own GPU, learner_device).
std::shared_ptr<Transformer> initial_model(const RunConfig& cfg, const Tokenizer& tokenizer,
                                           std::optional<at::Device> device = std::nullopt);
// A rollout engine's model: with model.lora, `model` gets its adapters (zero: the base
// model, version 0), merged or not as rollout.lora_merged says; the weight updates then
// carry only the adapters.
void add_engine_adapters(Transformer& model, const RunConfig& cfg);

// A role's heartbeat: a thread rewrites run_dir/heartbeats/ROLE-INDEX every 0.5 s while
// the process runs (a SIGSTOPped or frozen process stops beating; the launcher notices),
// with what the role is doing (rlx::status) as one JSON line.
// True when RLX_LAUNCHER_PID (set by the launcher for its roles) is no longer this
// process's parent: the launcher died.
bool launcher_gone();
void start_heartbeat(const RunDir& run_dir, Role role, int index);
// With trace.enabled, a role writes its spans (wait, train, publish, rollout, generate,
// env steps, ...) to run_dir/traces/ROLE-INDEX.PID.json; the launcher merges every
// process's file into run_dir/trace.json (ui.perfetto.dev opens it) when the run ends.
void start_trace(const RoleContext& ctx, Role role);
// Merges run_dir/traces/*.json (also those a killed process left unterminated) into
// run_dir/trace.json. Returns the number of events.
size_t merge_traces(const RunDir& run_dir);
// A heartbeat as the launcher reads it.
struct RoleBeat {
  double beat = -1;     // the file's mtime (wall clock); -1: no heartbeat yet
  int64_t pid = 0;
  std::string status;   // what the role was doing (rlx::status)
  double since = 0;     // since when (wall clock)
  bool ready = false;   // its start-up was over
};
RoleBeat read_heartbeat(const RunDir& run_dir, Role role, int index);

// A role that cannot run (a FatalError: an env server that cannot start, ...) writes why to
// run_dir/failures/ROLE-INDEX and exits with kExitCannotRun; the launcher then stops the run
// with that message rather than restarting the role.
inline constexpr int kExitCannotRun = 78;  // EX_CONFIG of sysexits.h

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

// `rlx rm`: trains a reward model (the model's body and a scalar head) from preference pairs
// (rm.data, or pairs from the environment's tasks) with the Bradley-Terry loss, then writes
// an HF sequence classifier to run_dir/final. Prints the held-out pairwise accuracy before
// and after.
int run_rm(const RunConfig& cfg);

// Greedy held-out accuracy (mean episode reward) of `cfg`'s model on sft.eval_tasks tasks
// drawn from the environment's generator with a seed disjoint from training's.
double evaluate(const RunConfig& cfg);
// `rlx eval`'s report: {"accuracy" (the greedy mean reward), "tasks", "greedy_acc" (the share
// correct), and with validation.samples = n > 0 "mean@n", "pass@k" for each validation.k <= n,
// "maj@n", "sampled_tasks"}.
nlohmann::json evaluate_report(const RunConfig& cfg);

}  // namespace rlx::launch
