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
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlx/algo/algorithm.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/core/device_turns.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/learner/algorithm_loss.hpp"

namespace rlx {

struct LoopOptions {
  int64_t steps = 10;               // run until this step (weight version)
  uint32_t groups_per_step = 8;     // groups a batch asks for
  double batch_timeout_s = 600;     // rank 0 waits this long for a batch before failing
  int64_t checkpoint_every = 0;     // steps between checkpoints (0: none inside the loop)
  std::function<void(const std::string&)> status;  // what the loop is doing now
  // Every rank, before the advantages: the rank's rewards in group order (change in place).
  std::function<void(int64_t step, std::vector<double>& rewards, const std::vector<size_t>& group_sizes)> on_rewards;
  // Rank 0, after each step: the step's metrics (rlx's keys; add or write them).
  std::function<void(int64_t step, nlohmann::json& metrics)> on_step;
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
};

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
  LoopOptions o_;
  LoopParts p_;
  bool saved_ = true;
  bool said_no_stats_ = false;
  uint64_t trained_batch_ = 0;
};

}  // namespace rlx
