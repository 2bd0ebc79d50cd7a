// An algorithm (rlx/algo) as the learner's loss function. The per-token inputs come
// from each sequence's values: "advantages", "old_logprobs", "ref_logprobs" and
// "behaviour_logprobs" (each optional; the algorithm says what it needs).
//
//   auto algo = rlx::algo::make_algorithm({.name = "grpo"});
//   rlx::set_advantage(seq, adv);                       // per sample, spread over its tokens
//   learner.step(seqs, rlx::algorithm_loss(*algo), algo->metric_names());
#pragma once

#include "rlx/algo/algorithm.hpp"
#include "rlx/learner/learner.hpp"

namespace rlx {

LossFn algorithm_loss(const algo::Algorithm& algorithm);

// Sets the sequence's "advantages" value to `advantage` on every token.
void set_advantage(Sequence& seq, double advantage);

}  // namespace rlx
