// The frozen reference model of KL-regularised algorithms: sharded like the policy
// (it costs 1/N of the weights per rank), never updated, no optimizer state, no
// gradients. Its log-probs feed LossInputs::ref_logprobs.
//
//   rlx::ReferenceModel ref(cfg, *comm, learner.options().fsdp);
//   ref.load_from(initial_policy);                          // or load_hf(...) and load_from
//   seq.values["ref_logprobs"] = ...  // from ref.logprobs(micro_batch)
//   rlx::ReferenceModel base(learner.model());              // LoRA: the base, no copy
#pragma once

#include <memory>

#include "rlx/dist/fsdp.hpp"
#include "rlx/learner/batching.hpp"

namespace rlx {

class ReferenceModel {
 public:
  // A model of its own (frozen: its shards in the compute dtype).
  ReferenceModel(const ModelConfig& cfg, dist::Communicator& comm, dist::FsdpOptions options = {});
  // A LoRA policy's base weights: the policy's own model with its adapters switched off
  // for these forwards (no memory of its own).
  explicit ReferenceModel(dist::ShardedTransformer& lora_policy);
  void load_from(const Transformer& full);
  void init_weights(uint64_t seed);
  // log p_ref(target) of every position: [R, T] fp32 (collective, like every forward); with
  // `trained_only`, of the trained positions only (0 elsewhere: loss_positions()).
  at::Tensor logprobs(const MicroBatch& mb, bool trained_only = false);
  // Fills each sequence's `key` value (per token; the first token's is 0), packing them as
  // the learner would. A distillation teacher is a ReferenceModel that fills "teacher_logprobs".
  // `trained_only` as LearnerOptions::head_on_loss_tokens: untrained positions read 0.
  void annotate(std::vector<Sequence>& seqs, const PackOptions& packing, const std::string& key = "ref_logprobs",
                bool trained_only = false);
  // After a failed collective (the group re-forms): ShardedTransformer::abandon().
  void abandon() { model_.abandon(); }

 private:
  std::unique_ptr<dist::ShardedTransformer> owned_;
  dist::ShardedTransformer& model_;
  bool base_of_lora_ = false;
};

}  // namespace rlx
