// The parts the learner role is built from (internal; learner_role.cpp composes them): the
// learner group, the models, their checkpoints (with the hub's state), rank 0's link to the
// hub and its weight publisher, and its reports (metrics.jsonl, TensorBoard, samples).
#pragma once

#include <atomic>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "rlx/algo/algorithm.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/core/tensorboard.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/launch/roles.hpp"
#include "role_common.hpp"
#include "rlx/learner/algorithm_loss.hpp"
#include "rlx/learner/checkpoint.hpp"
#include "rlx/learner/learner.hpp"
#include "rlx/learner/reference.hpp"

namespace rlx::launch {

// This rank's place in the learner group: a re-formable group when the launcher restarts
// a dead rank > 0 alone (RLX_LEARNER_REFORM), else a plain one (one rank: single process).
struct LearnerGroup {
  std::unique_ptr<dist::Communicator> comm;
  dist::ReformableGroup* reformable = nullptr;
  bool finished = false;  // a replacement started as the others ended: nothing left to train
};
// This learner rank's device (learner_device over the launcher's rank and world size).
at::Device learner_rank_device(const RunConfig& cfg);
// `device`: the rank's (learner_rank_device), made current before NCCL connects.
LearnerGroup join_learner_group(const RunConfig& cfg, at::Device device);

// The models a learner trains and scores with, built from the starting model `start`.
struct LearnerModels {
  std::unique_ptr<algo::Algorithm> algorithm;
  LearnerOptions options;
  bool value_head = false;  // the critic is a head on the policy (algorithm.critic = head)
  std::unique_ptr<Learner> policy, critic;
  std::unique_ptr<ReferenceModel> reference, teacher;

  TrainModels train() const {
    return {.policy = *policy, .critic = critic.get(), .reference = reference.get(), .teacher = teacher.get()};
  }
  // After a collective failed (a rank died): every model lets go of the broken group.
  void abandon();
};
// Checks the memory plan against the device first (the starting model, already there on the
// rank's device, stays as a colocated engine's weights). The learners train on start's device.
LearnerModels build_models(const RunConfig& cfg, const Transformer& start, dist::Communicator& comm);

// The policy's (and critic's) checkpoints under run_dir/checkpoints[-critic], each with the
// hub's state saved by the hub at the same moment (rank 0 asks it).
class Checkpointer {
 public:
  Checkpointer(const RoleContext& ctx, LearnerModels& models, bool lead);
  // The newest verified checkpoint loaded into every model (collective), or nullopt.
  // `who` names the caller in the error for a critic that does not match.
  std::optional<LoadedCheckpoint> restore(const char* who);
  // Saves `step` (collective); rank 0 asks the hub through `client` to save its state
  // with it, confirming `trained_batch`, then runs the hooks' on_checkpoint.
  void save(int64_t step, uint64_t trained_batch, bus::Client* client);

 private:
  const RoleContext& ctx_;
  LearnerModels& m_;
  bool lead_;
  CheckpointOptions policy_, critic_;
};
inline int64_t run_step(const LoadedCheckpoint& c) { return checkpoint_run_step(c.references, c.step); }

// Rank 0's outputs: a line a step in metrics.jsonl (and TensorBoard with log.tensorboard),
// samples as text every log.samples_every steps (samples.jsonl).
class LearnerReports {
 public:
  LearnerReports(const RoleContext& ctx, bool lead);
  void step(int64_t step, const nlohmann::json& line);
  void samples(int64_t step, const bus::BatchView& batch, const Tokenizer& tok);

 private:
  const RunConfig& cfg_;
  std::ofstream metrics_, samples_;
  std::optional<TensorBoardWriter> tensorboard_;  // a new events file per process: TensorBoard merges them
};

// Busy fractions of the rollout workers: each worker keeps run_dir/stats/worker-N.json
// (its pid, seconds alive, seconds rolling out); the learner reports each worker's busy
// share since the previous step (busy_worker_N) and their mean (busy_rollout).
class RolloutBusy {
 public:
  explicit RolloutBusy(const RunDir& run_dir) : dir_(run_dir.stats()) {}
  void add_to(nlohmann::json& line);

 private:
  struct Seen {
    int64_t pid = -1;
    double wall = 0, busy = 0;
  };
  std::filesystem::path dir_;
  std::map<std::string, Seen> last_;
};

}  // namespace rlx::launch
