// A scalar-head reward model in HF's `*ForSequenceClassification` layout: a transformer body
// (`model.*`, no LM head) and `score.weight` [1, hidden], the score of a sequence being the
// head applied to the final-norm hidden state of its last token (as transformers takes the
// last non-padding token). `rlx rm` trains one from preference pairs (Bradley-Terry); a run
// scores its episodes with one on the rollout side (`reward_model.path`).
//
//   auto rm = rlx::RewardModel::load("runs/rm/final", {.dtype = at::kBFloat16});
//   std::vector<double> r = rm.score({prompt_and_completion_a, prompt_and_completion_b});
//   rlx::save_hf_reward_model(body, score, "out/");   // config.json (architectures
//                                                     // Qwen2ForSequenceClassification) + weights
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "rlx/model/hf.hpp"
#include "rlx/model/transformer.hpp"

namespace rlx {

class RewardModel {
 public:
  // `score`: the head's weights [hidden] (any float dtype; kept in fp32).
  RewardModel(std::shared_ptr<Transformer> body, at::Tensor score);
  // An HF sequence-classification directory with one label; anything else is an error
  // naming the directory and what is wrong.
  static RewardModel load(const std::filesystem::path& dir, HfLoadOptions options = {});

  // One score per sequence (each non-empty), in padded batches of at most
  // `max_batch_tokens` (rows x longest row), without gradients.
  std::vector<double> score(const std::vector<std::vector<int64_t>>& sequences, int64_t max_batch_tokens = 8192) const;
  const Transformer& body() const { return *body_; }
  const at::Tensor& head() const { return score_; }

 private:
  std::shared_ptr<Transformer> body_;
  at::Tensor score_;  // fp32 [hidden], on the body's device
};

// Writes `body` (its LM head left out) and `score` [hidden] as an HF sequence-classification
// directory that transformers' AutoModelForSequenceClassification loads.
void save_hf_reward_model(const Transformer& body, const at::Tensor& score, const std::filesystem::path& dir);

}  // namespace rlx
