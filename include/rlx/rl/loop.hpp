// The learner's step loop as a part: next batch (rank 0, from the hub) -> every rank's
// share of its groups (balanced by tokens) as sequences -> train_on_batch -> weights
// published (rank 0) -> the step's metrics -> a checkpoint every K steps. It works
// in-process with any Learner, algorithm, hub client and weight publisher; the launcher's
// learner role (src/launch/learner_role.cpp) loads models and checkpoints, and writes
// metrics.jsonl and the progress line, around it.
//
//   rlx::LearnerLoop loop({.steps = 100, .groups_per_step = 8}, {.models = {.policy = learner},
//                          .algorithm = *algo, .comm = *comm, .client = &client, .publisher = &pub});
//   loop.run(step, stop);   // from `step` (a resumed run's) to options.steps
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlx/algo/algorithm.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/core/device_turns.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/learner/algorithm_loss.hpp"

namespace rlx::rl {

struct LoopOptions {
  int64_t steps = 10;               // run until this step (weight version)
  uint32_t groups_per_step = 8;     // groups a batch asks for
  double batch_timeout_s = 600;     // rank 0 waits this long for a batch before failing
  int64_t checkpoint_every = 0;     // steps between checkpoints (0: none inside the loop)
  std::function<void(const std::string&)> status;  // what the loop is doing now
  // Every rank, before the advantages: the rank's rewards in group order (change in place).
  std::function<void(int64_t step, std::vector<double>& rewards, const std::vector<size_t>& group_sizes)> on_rewards;
  // Rank 0, before training each step (step = the one it makes): the batch (samples to log).
  std::function<void(int64_t step, const bus::BatchView& batch)> on_batch;
  // Rank 0, after a step's weights were gathered and published (a colocated learner still
  // holding the device): the weights (the publisher's names; with LoRA the adapters), and
  // metrics to add to the step's line (validation, learner_role.cpp). Its seconds are not
  // counted in sync_s.
  std::function<void(int64_t step, const std::vector<std::pair<std::string, at::Tensor>>& weights,
                     nlohmann::json& metrics)>
      on_weights;
  // Rank 0, after each step: the step's metrics (rlx's keys; add or write them).
  std::function<void(int64_t step, nlohmann::json& metrics)> on_step;
  // The dtype a step's weights are gathered in for the publisher and on_weights: the
  // engines' (the publisher converts to it anyway; a bf16 gather is half an fp32 copy).
  at::ScalarType weights_dtype = at::kFloat;
};

struct LoopParts {
  TrainModels models;
  algo::Algorithm& algorithm;
  dist::Communicator& comm;
  bus::Client* client = nullptr;                // rank 0: batches from the hub, versions to it
  dist::WeightPublisher* publisher = nullptr;   // rank 0: the weights after each step
  // A device shared with a rollout engine in this process (colocated): the loop holds its
  // train turn from training to the publish of the step's weights.
  DeviceTurns* turns = nullptr;
  // Collective: saves the step (the hub's id of the last batch trained is given to confirm).
  std::function<void(int64_t step, uint64_t trained_batch)> checkpoint;
  // After a collective of the learner group failed (a rank died): re-forms the group and
  // restores every rank from the newest checkpoint, returning its step (collective, with
  // the dead rank's replacement, which resumes from the same checkpoint as it starts);
  // rethrows the error when the group cannot re-form. Rank 0 then trains the steps after
  // that checkpoint again from the batches it kept since (never more than checkpoint_every
  // + 1), without publishing their versions or metrics again: no batch is trained twice
  // or skipped, and the hub and the rollout workers go on. Empty: a CommError ends the loop.
  std::function<int64_t(const dist::CommError&)> recover;
};

// The indices of a batch's groups in prompt order (epoch, prompt index): the order a step
// trains them in, whichever worker finished first.
std::vector<size_t> prompt_order(const bus::BatchView& batch);

class LearnerLoop {
 public:
  LearnerLoop(LoopOptions options, LoopParts parts);
  enum class End { steps, exhausted, stopped };  // options.steps reached; the hub's data done; `stop`
  // Trains from `step` (advanced in place) until an end; `stop` (rank 0's view counts) is
  // honoured between steps. Collective: every rank calls it.
  End run(int64_t& step, const std::atomic<bool>& stop);
  // Whether the last step run was checkpointed (a stop need not save it again).
  bool saved() const { return saved_; }
  uint64_t trained_batch() const { return trained_batch_; }

 private:
  void say(const std::string& what) const;
  // Rank 0: the hub's errors so far, by kind, into a step's line (errors_infra, errors_data,
  // errors_filtered: groups given up; errors_worker_reported; errors_rejected: frames refused).
  void add_error_counts(nlohmann::json& line);
  // One step: the next batch (rank 0: a kept one while replaying, else the hub's), trained,
  // published, checkpointed, reported. A value: the loop ends.
  std::optional<End> step_once(int64_t& step, const std::atomic<bool>& stop);
  // Rank 0's word to every rank for a step.
  enum Decision : int64_t { kTrain = 0, kStop = 1, kEnd = 2 };
  // Rank 0: the step's batch into `batch` (a kept one while replaying, else the hub's,
  // waited for in slices since `t0` so that `stop` is noticed), and what to do with it.
  Decision take_batch(int64_t step, const std::atomic<bool>& stop, double t0, bus::BatchView& batch);
  using Weights = std::vector<std::pair<std::string, at::Tensor>>;
  struct Published {
    int64_t sync_bytes = 0;                           // what the publisher wrote
    nlohmann::json extra = nlohmann::json::object();  // on_weights' metrics
    double hook_s = 0;                                // seconds in on_weights
  };
  // Rank 0: the step's weights to the publisher and its version to the hub, on_weights
  // between (none again for a step trained again); `turn` is released before a colocated
  // engine hears of the version.
  Published publish_weights(int64_t step, const Weights& params, DeviceTurns::Turn& turn);
  // Every checkpoint_every steps: the collective checkpoint, and the kept batches it holds dropped.
  void checkpoint_if_due(int64_t step);
  // After a CommError: the group re-formed and restored (p_.recover); the kept batches after
  // the restored step are trained again.
  void recover(int64_t& step, const dist::CommError& e);
  // Rank 0: reports the pending step's line, its checkpoint having taken `t_ckpt` seconds.
  void report(double t_ckpt);
  LoopOptions o_;
  LoopParts p_;
  // Rank 0: the batches trained (or in training) since the last checkpoint, by step.
  struct Kept {
    int64_t step = 0;
    bus::BatchView batch;
  };
  std::deque<Kept> kept_;
  size_t replay_ = 0;          // kept_[replay_] is the next batch to train again
  int64_t published_ = -1;     // the newest version rank 0 published (not published again)
  int64_t reported_ = -1;      // the newest step whose metrics were reported
  // Rank 0: the line of a step trained and published but not yet reported (its checkpoint
  // runs). A group that breaks after that checkpoint committed still reports it (recover).
  struct Pending {
    int64_t step = 0;
    nlohmann::json line;
    double t0 = 0, busy_s = 0;  // when the step began; its time training and publishing
    double tokens = 0;
  };
  std::optional<Pending> pending_;
  double t_start_ = 0;  // when run() began
  bool saved_ = true;
  bool said_no_stats_ = false;
  uint64_t trained_batch_ = 0;
};

}  // namespace rlx::rl
