// One rank of a learner group: a sharded model, AdamW on its shards, the
// learning-rate schedule, gradient accumulation over micro-batches and clipping
// by the global norm. Algorithms plug in as a loss function over token log-probs.
//
//   rlx::Learner learner(cfg, *comm, {.optimizer = {.lr = 1e-5}, .max_grad_norm = 1.0});
//   learner.init_weights(seed);
//   auto r = learner.step(my_sequences, [](const rlx::MicroBatch& mb, const rlx::TokenOutputs& out,
//                                          const rlx::StepContext& ctx, rlx::MetricSums&) {
//     return -(out.logprobs * mb.loss_mask).sum() / ctx.global_loss_tokens;   // SFT
//   });
//
// Every rank must call step() the same number of times; a rank with fewer
// micro-batches than another runs empty ones, so the collectives always match.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "rlx/core/metric_sums.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/dist/fsdp.hpp"
#include "rlx/learner/batching.hpp"
#include "rlx/learner/options.hpp"
#include "rlx/learner/routing_stats.hpp"
#include "rlx/learner/optimizer.hpp"

namespace rlx {

struct LearnerOptions {
  AdamWOptions optimizer;
  LrSchedule schedule;
  double max_grad_norm = 1.0;  // clip by the global norm; 0 = no clipping
  PackOptions packing;
  dist::FsdpOptions fsdp;
  bool entropy = false;        // compute TokenOutputs::entropy (costs a pass over the logits)
  int64_t logprob_chunk_tokens = 1024;  // tokens whose logits exist at once in the policy head
  // step() and annotate() run the policy head at trained positions only (loss_mask > 0): a
  // prompt's positions cost no logits; TokenOutputs::logprobs and entropy read 0 there.
  bool head_on_loss_tokens = true;
  bool policy_head = true;     // the LM head's log-probs (false: a critic that only needs values)
  bool value_head = false;     // a scalar value per position from the last hidden state (PPO's critic)
  uint64_t seed = 0;           // the learner's random stream (per rank: stream = rank)
  // Mixture-of-experts models:
  bool routing_replay = false;       // forwards use the experts the sampler recorded (Sequence::routing)
  double router_aux_loss_coef = 0;   // > 0: step() adds coef x HF's load-balancing loss to the gradient
};

// What a loss function knows about the whole step.
struct StepContext {
  int64_t step = 0;                // optimizer steps taken before this one
  double global_loss_tokens = 0;   // trained tokens over every rank's batch
  double global_sequences = 0;     // sequences over every rank's batch
  int rank = 0, world_size = 1;
};

// What the model computed for a micro-batch, aligned with MicroBatch::targets.
struct TokenOutputs {
  at::Tensor logprobs;  // [R, T] fp32: log p(target) (0 where untrained, with LearnerOptions::head_on_loss_tokens)
  at::Tensor entropy;   // [R, T] fp32 entropy of the next-token distribution (when LearnerOptions::entropy)
  at::Tensor values;    // [R, T] fp32 V(prefix up to and including the position) (when LearnerOptions::value_head)
};

// Named sums a loss function reported, summed over micro-batches and ranks.
using Metrics = std::map<std::string, double>;

// Loss of one micro-batch, already normalised for the whole step (gradients of all
// micro-batches and ranks are summed). It may add to the sums under the names passed
// to Learner::step, as tensors that stay on the device (read once, after the step's
// last backward).
using LossFn = std::function<at::Tensor(const MicroBatch&, const TokenOutputs&, const StepContext&, MetricSums&)>;

struct StepResult {
  int64_t step = 0;          // optimizer steps taken after this one
  double loss = 0;           // summed over micro-batches and ranks
  double grad_norm = 0;      // before clipping
  double clip_factor = 1;
  double lr = 0;
  int64_t tokens = 0;        // this rank's tokens (padding excluded)
  int64_t padded_tokens = 0; // this rank's tokens including padding
  int64_t micro_batches = 0;
  double seconds = 0;
  Metrics metrics;           // the loss function's sums, over micro-batches and ranks
  RoutingStats routing;      // mixture-of-experts models: over micro-batches and ranks
};

class Learner {
 public:
  Learner(const ModelConfig& cfg, dist::Communicator& comm, LearnerOptions options);

  void init_weights(uint64_t seed) { model_.init_weights(seed); }
  void load_from(const Transformer& full) { model_.load_from(full); }

  // `metric_names`: what the loss function may report (every rank passes the same list).
  StepResult step(const std::vector<Sequence>& batch, const LossFn& loss,
                  const std::vector<std::string>& metric_names = {});
  // log p(target) of every position of a micro-batch, without gradients: [R, T] fp32.
  at::Tensor logprobs(const MicroBatch& mb);
  // Stores per-token values in each sequence (collective): the policy's log-probs under
  // `logprobs_key` and the value head's values under `values_key` (an empty key: skip).
  void annotate(std::vector<Sequence>& seqs, const std::string& logprobs_key, const std::string& values_key = "");

  int64_t step_count() const { return optimizer_.step_count(); }
  void set_step_count(int64_t s) { optimizer_.set_step_count(s); }
  RngStream& rng() { return rng_; }
  dist::ShardedTransformer& model() { return model_; }
  AdamW& optimizer() { return optimizer_; }
  dist::Communicator& comm() { return comm_; }
  const LearnerOptions& options() const { return opt_; }
  // The value head, [hidden + 1] fp32 (weights, then the bias), replicated on every
  // rank; undefined without LearnerOptions::value_head.
  at::Tensor& value_head() { return value_head_; }
  // Every tensor the optimizer updates: the units' shards, then the value head.
  std::vector<at::Tensor> trained_tensors() const;

 private:
  // `trained_only`: the policy head at the micro-batch's trained positions only. A mixture-of-
  // experts model's forward replays mb.routing (with routing_replay) and fills `trace`.
  TokenOutputs outputs(const MicroBatch& mb, bool entropy, bool trained_only, RoutingTrace* trace = nullptr);

  dist::Communicator& comm_;
  LearnerOptions opt_;
  dist::ShardedTransformer model_;
  AdamW optimizer_;
  RngStream rng_;
  at::Tensor value_head_;
};

// Runs `forward` over the sequences packed as `packing` says, the same number of times
// on every rank of `comm` (a rank with fewer micro-batches runs empty ones), and stores
// each returned [R, T] tensor, aligned with MicroBatch::targets, as the per-token value
// of that name in its sequences (token k's value comes from position k - 1; the first
// token's is 0).
using TokenForward = std::function<std::map<std::string, at::Tensor>(const MicroBatch&)>;
void annotate_sequences(std::vector<Sequence>& seqs, const PackOptions& packing, dist::Communicator& comm,
                        const TokenForward& forward);

// log softmax(logits)[target] in fp32 without materialising the fp32 log-softmax of
// the whole vocabulary at once: logits [.., V], targets [..] -> [..].
at::Tensor gather_logprobs(const at::Tensor& logits, const at::Tensor& targets);

// The options a run config's `learner:` section describes, on `device` (learner_device), the
// learner's random stream keyed by `seed`.
LearnerOptions learner_options(const LearnerSection& section, uint64_t seed, at::Device device);

// The device of learner rank `rank` of `world` for a config's `model.device`: as written,
// except that "cuda" without an index spreads a group of several ranks over the GPUs this
// process sees (rank r on cuda:r mod count, the local rank where ranks fill each node's GPUs
// in order, as torchrun's LOCAL_RANK does).
at::Device learner_device(const std::string& model_device, int rank, int world, int cuda_devices);

}  // namespace rlx
