// The frozen reference model of KL-regularised algorithms: sharded like the policy
// (it costs 1/N of the weights per rank), never updated, no optimizer state, no
// gradients. Its log-probs feed LossInputs::ref_logprobs.
//
//   rlx::ReferenceModel ref(cfg, *comm, learner.options().fsdp);
//   ref.load_from(initial_policy);                          // or load_hf(...) and load_from
//   seq.values["ref_logprobs"] = ...  // from ref.logprobs(micro_batch)
#pragma once

#include "rlx/dist/fsdp.hpp"
#include "rlx/learner/batching.hpp"

namespace rlx {

class ReferenceModel {
 public:
  ReferenceModel(const ModelConfig& cfg, dist::Communicator& comm, dist::FsdpOptions options = {});
  void load_from(const Transformer& full) { model_.load_from(full); }
  void init_weights(uint64_t seed) { model_.init_weights(seed); }
  // log p_ref(target) of every position: [R, T] fp32 (collective, like every forward).
  at::Tensor logprobs(const MicroBatch& mb);
  // Fills each sequence's `key` value (per token; the first token's is 0), packing them as
  // the learner would. A distillation teacher is a ReferenceModel that fills "teacher_logprobs".
  void annotate(std::vector<Sequence>& seqs, const PackOptions& packing, const std::string& key = "ref_logprobs");

 private:
  dist::ShardedTransformer model_;
};

}  // namespace rlx
