// Reward-model training from preference pairs (Bradley-Terry): loss -log sigmoid(r_c - r_r)
// per pair, r a sequence's score, the value head at its last token.
//
// Each step scores its pairs without gradients (Learner::annotate), then trains on the
// per-sequence loss w * r with w = -/+ sigmoid(-(r_c - r_r)) / pairs: its gradient is the
// Bradley-Terry loss's exactly, whichever micro-batch or rank holds each side of a pair.
//
//   auto seqs = rlx::preference_sequences(pairs, eos);     // chosen, rejected, chosen, ...
//   learner.annotate(seqs, "", rlx::kPreferenceScore);
//   auto stats = rlx::bradley_terry(seqs);                 // loss, accuracy; writes the weights
//   learner.step(seqs, rlx::bradley_terry_loss());
#pragma once

#include <cstdint>
#include <vector>

#include "rlx/learner/learner.hpp"

namespace rlx {

struct PreferencePair {
  std::vector<int64_t> chosen, rejected;  // whole sequences (prompt + completion)
};

// The per-token value the scores are annotated under, and the weights bradley_terry() writes.
inline constexpr const char* kPreferenceScore = "rm_score";
inline constexpr const char* kPreferenceWeight = "bt_weight";

// Both sides of each pair, chosen first, each with `end_token` appended and trained alone,
// so that the value a learner annotates for it is the score of the sequence before it.
std::vector<Sequence> preference_sequences(const std::vector<PreferencePair>& pairs, int64_t end_token);

struct PreferenceStats {
  double loss = 0;      // mean Bradley-Terry loss
  double accuracy = 0;  // pairs with r_c > r_r (a tie counts half)
  double margin = 0;    // mean r_c - r_r
};
// From annotated scores: the statistics, and each sequence's weight (at its end token).
PreferenceStats bradley_terry(std::vector<Sequence>& seqs);
// The loss whose gradient is the Bradley-Terry loss's (sum of weight x value).
LossFn bradley_terry_loss();

}  // namespace rlx
