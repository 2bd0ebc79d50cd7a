// The rollout worker: leases from the hub -> episodes in environments -> trajectory groups
// back to the hub, with weights taken from a subscriber at step boundaries and unfinished
// multi-turn episodes checkpointed so that another worker continues them. It works
// in-process with any Engine, environment source, hub client and weight subscriber; the
// launcher's worker role (src/launch/worker_role.cpp) adds signals, env servers, status
// and statistics around it.
//
//   rlx::rl::EnvSource envs{.make = [&] { return registry.make("arithmetic", context); }};
//   rlx::rl::Worker worker({.who = "worker-0", .rollout = {.max_turns = 1, .sampling = {...}}},
//                               engine, envs, client, subscriber);
//   worker.run(stop, leave);   // until the hub has no more leases, or stop / leave is set
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rlx/bus/client.hpp"
#include "rlx/core/device_turns.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/env/env.hpp"
#include "rlx/rollout/engine.hpp"

namespace rlx::rl {

// Where a worker's environments come from: one instance per sample, and the sampler's
// stop sequences (an in-process instance's stop_strings()).
struct EnvSource {
  std::function<std::unique_ptr<env::Env>()> make;
  std::vector<std::string> stop_strings;
};

// How episodes are rolled out: turns, sampling, and the seed sampling is keyed by (with
// the prompt, epoch, sample and turn, so a re-issued lease samples the same tokens).
struct RolloutOptions {
  int max_turns = 1;
  SamplingParams sampling;  // n is set per group
  uint64_t seed = 0;
};

// The episodes of one lease (a group), stepped in lockstep with the other leases of a
// grant so that every turn is one batched engine call.
struct GroupRollout {
  bus::Lease lease;
  std::vector<std::unique_ptr<env::Env>> envs;
  std::vector<env::Episode> episodes;
  std::vector<std::vector<int64_t>> versions;  // per token: the weight version, -1 outside actions
  std::vector<uint8_t> truncated;              // per episode: its last action was cut by max_new_tokens
  // Mixture-of-experts engines (Engine::routing()): per episode and token, each sparse
  // layer's experts as the engine routed it, [tokens][layers][top_k], -1 where not recorded
  // (an observation not yet forwarded, an episode's last token). Empty for a dense model.
  std::vector<std::vector<int16_t>> routing;
  uint16_t routing_layers = 0, routing_top_k = 0;
  std::string error;                           // an error ends the group (reported to the hub)
  std::string error_kind = "infra";            // infra: retried elsewhere; data: the task is bad
  int start_turn = 0;                          // > 0: continued from an episode checkpoint
  // Scored by a reward model: per episode, the environment's reward and the model's score
  // (sent as each trajectory's metadata {"reward_env", "reward_model"}).
  std::vector<std::pair<double, double>> reward_parts;
};

// Checkpoints of unfinished multi-turn episodes, one file per lease in `dir`
// (p{prompt}.e{epoch}), replaced atomically every `every` turns and removed when the group
// is sent. Whoever takes the lease next continues from it: each sample's tokens, masks,
// log-probs, versions, expert routing and reward so far, and its environment's saved
// state. The file is the xxh64 of its body (16 hex digits), a newline, then the body (JSON,
// format rlx-episodes/2; routing as hex, four digits an int16, little-endian; /1 files,
// without routing, continue with none recorded for their tokens so far).
class EpisodeCheckpoints {
 public:
  EpisodeCheckpoints(std::filesystem::path dir, uint32_t every) : dir_(std::move(dir)), every_(every) {}
  bool due(int finished_turns) const { return every_ > 0 && finished_turns % static_cast<int>(every_) == 0; }
  void save(const GroupRollout& g, int next_turn);
  // Continues `g` from its lease's checkpoint, if there is one that matches the lease. A
  // damaged or mismatched checkpoint is reported and removed; the group starts over.
  bool restore(GroupRollout& g, const EnvSource& envs);
  void remove(const bus::Lease& l);
  uint64_t saved() const { return saved_; }

 private:
  std::filesystem::path file(const bus::Lease& l) const;
  std::filesystem::path dir_;
  uint32_t every_;
  uint64_t saved_ = 0;
};

// Runs every lease's group to the end: turn 0 samples each group's shared prompt once with
// n = group size (the samples share its KV blocks); later turns continue each unfinished
// episode. An environment that fails (InfraError) ends its group as an infra error (the
// lease is retried), a task it rejects as a data error; a FatalError ends the call.
// `stop` set: the groups are cut short and marked as errors (nothing of them may be sent).
std::vector<GroupRollout> rollout_groups(Engine& engine, const EnvSource& envs, const std::vector<bus::Lease>& leases,
                                         const RolloutOptions& options, EpisodeCheckpoints* checkpoints = nullptr,
                                         const std::function<void()>& after_checkpoint = {},
                                         const std::atomic<bool>* stop = nullptr);

// A finished group as the trajectories the hub takes (its episodes are moved out). A
// trajectory's finish is "length" when its last action was cut by max_new_tokens (DAPO's
// overlong samples: algorithm.mask_truncated), else "stop" when the environment ended the
// episode, else "turns" (env.max_turns reached). Its metadata is a JSON object:
//   "env":  each number (or bool, as 0/1) of the environment's step info, summed over the
//           episode's turns (counters such as errors_unparsed; at most kMaxEnvCounters)
//   "info": the last turn's text values (the extracted answer, ...; at most kMaxInfoTexts, each
//           cut to kMaxInfoText bytes)
//   "reward_env", "reward_model": with a reward model, the two parts of the reward
// Each part is there only when it has something.
inline constexpr size_t kMaxEnvCounters = 32;
inline constexpr size_t kMaxInfoTexts = 8;
inline constexpr size_t kMaxInfoText = 512;
bus::TrajectoryGroup to_trajectory_group(GroupRollout& group, const std::string& worker);

struct WorkerOptions {
  std::string who = "worker";
  RolloutOptions rollout;
  uint32_t leases_per_request = 4;
  double weights_timeout_s = 600;  // a lease's min_version must arrive within this
  std::filesystem::path episode_dir;  // episode checkpoints (with episode_checkpoint_turns > 0)
  uint32_t episode_checkpoint_turns = 0;
  std::function<void(uint64_t saved)> after_episode_checkpoint;  // after a round of checkpoints (a test's fault)
  std::function<void(const std::string&)> status;  // what the worker is doing now
  std::function<void()> after_round;               // after each grant's groups were sent (statistics)
  // A device shared with a learner in this process (colocated): the worker holds its
  // generate turn while it rolls out a grant.
  DeviceTurns* turns = nullptr;
  // A reward model: one call per grant scores every finished episode's tokens (prompt,
  // actions, observations); reward = env_coef * the environment's + score_coef * its score.
  std::function<std::vector<double>(const std::vector<std::vector<int64_t>>&)> score;
  double score_coef = 1.0, env_coef = 1.0;
};

// Adds a reward model's scores to the episodes of the groups without errors (as
// WorkerOptions::score says). A failure of the scorer ends the groups as infra errors.
void score_episodes(std::vector<GroupRollout>& groups, const WorkerOptions& options);

class Worker {
 public:
  Worker(WorkerOptions options, Engine& engine, EnvSource envs, bus::Client& client, dist::WeightSubscriber& weights);
  // Leases -> groups until the hub has no lease left (the run's data is done), `end` is
  // set (stop now: groups in flight are not sent; the hub re-issues their leases) or
  // `leave` is set (finish and send the leases held, then return). Weights are applied
  // between grants; with the engine's update_policy continue, also while a grant rolls out
  // (partial rollouts: samples in flight go on under the new weights, each token recording
  // the version that sampled it). A lease's min_version is waited for. Returns the groups sent.
  int64_t run(const std::atomic<bool>& end, const std::atomic<bool>& leave);
  int64_t groups_sent() const { return groups_sent_; }
  double busy_s() const { return busy_s_; }  // seconds spent rolling out

 private:
  void apply_weights();
  void say(const std::string& what) const;
  WorkerOptions o_;
  Engine& engine_;
  EnvSource envs_;
  bus::Client& client_;
  dist::WeightSubscriber& weights_;
  EpisodeCheckpoints episodes_;
  int64_t groups_sent_ = 0;
  double busy_s_ = 0;
};

}  // namespace rlx::rl
