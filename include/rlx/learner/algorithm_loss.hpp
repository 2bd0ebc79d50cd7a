// An algorithm (rlx/algo) driving the learner: its loss as the learner's loss
// function, and one whole batch of trajectory groups trained the way the algorithm
// asks (old log-probs, reference log-probs, critic values, advantages, then epochs
// x mini-batches of optimizer steps). The per-token inputs live in each sequence's
// values: "advantages", "returns", "old_logprobs", "old_values", "ref_logprobs" and
// "behaviour_logprobs" (each optional; the algorithm says what it needs).
//
//   auto algo = rlx::algo::make_algorithm({.name = "grpo"});
//   auto m = rlx::train_on_batch(*algo, {.policy = learner, .reference = &ref}, seqs, rewards, group_sizes);
//   // m["reward_mean"], m["clip_fraction"], m["kl"], m["grad_norm"], ...
#pragma once

#include "rlx/algo/algorithm.hpp"
#include "rlx/learner/learner.hpp"
#include "rlx/learner/reference.hpp"

namespace rlx {

// The algorithm's loss as a learner's loss function. `on_policy`: a micro-batch without
// "old_logprobs" takes the step's own log-probs, detached, as the old policy's.
LossFn algorithm_loss(const algo::Algorithm& algorithm, bool on_policy = false);
// A separate critic's loss function (the algorithm's value loss on the critic's values).
LossFn critic_loss(const algo::Algorithm& algorithm);

// Sets the sequence's "advantages" value to `advantage` on every token.
void set_advantage(Sequence& seq, double advantage);

struct TrainModels {
  Learner& policy;                       // with a value head when algorithm critic = head
  Learner* critic = nullptr;             // critic = separate: a learner with only a value head
  ReferenceModel* reference = nullptr;   // when the algorithm needs_reference()
  ReferenceModel* teacher = nullptr;     // when the algorithm needs_teacher(): frozen, like the reference
};

// Trains on this rank's part of a batch (collective: every rank calls it, with the
// same number of mini-batches). `seqs` are grouped: the first group_sizes[0] share a
// prompt, then the next group_sizes[1], ...; rewards[i] is sequence i's. Fills the
// sequences' values, then runs options().epochs passes of options().mini_batches
// steps each, in a fixed shuffled order from the policy's random stream. Returns the
// batch's metrics (algo::batch_metrics), the means of the steps' loss metrics
// (algo::Algorithm::means, critic's prefixed "critic_"), "loss", "grad_norm", "lr",
// "kl_coef", "optimizer_steps" and a mixture-of-experts policy's moe/ metrics
// (RoutingStats). Updates an adaptive KL coefficient. `truncated` (empty: none) marks the
// sequences whose sample was cut by max_new_tokens: with options().mask_truncated their
// tokens get no loss (their loss masks are cleared after the advantages, which still count
// their rewards).
algo::Metrics train_on_batch(algo::Algorithm& algorithm, const TrainModels& models, std::vector<Sequence>& seqs,
                             const std::vector<double>& rewards, const std::vector<size_t>& group_sizes,
                             const std::vector<uint8_t>& truncated = {});

}  // namespace rlx
