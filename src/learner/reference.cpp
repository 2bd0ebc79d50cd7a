#include "rlx/learner/reference.hpp"

#include "rlx/learner/learner.hpp"
#include "rlx/model/logprob_head.hpp"
#include <c10/core/GradMode.h>

namespace rlx {

ReferenceModel::ReferenceModel(const ModelConfig& cfg, dist::Communicator& comm, dist::FsdpOptions options)
    : model_(cfg, comm, options) {
  for (auto& u : model_.units()) u.shard.requires_grad_(false);
}

at::Tensor ReferenceModel::logprobs(const MicroBatch& mb) {
  c10::NoGradGuard no_grad;
  auto hidden = model_.forward_hidden({.tokens = mb.tokens, .segments = mb.segments});
  auto out = token_logprobs(hidden, model_.lm_head_weight(), mb.targets.to(hidden.device())).logprobs;
  model_.release_all();
  return out;
}

void ReferenceModel::annotate(std::vector<Sequence>& seqs, const PackOptions& packing, const std::string& key) {
  annotate_sequences(seqs, packing, model_.comm(),
                     [&](const MicroBatch& mb) { return std::map<std::string, at::Tensor>{{key, logprobs(mb)}}; });
}

}  // namespace rlx
