#include "rlx/learner/reference.hpp"

#include "rlx/learner/learner.hpp"

namespace rlx {

ReferenceModel::ReferenceModel(const ModelConfig& cfg, dist::Communicator& comm, dist::FsdpOptions options)
    : model_(cfg, comm, options) {
  for (auto& u : model_.units()) u.shard.requires_grad_(false);
}

at::Tensor ReferenceModel::logprobs(const MicroBatch& mb) {
  at::NoGradGuard no_grad;
  auto hidden = model_.forward_hidden({.tokens = mb.tokens, .segments = mb.segments});
  auto out = gather_logprobs(model_.logits(hidden), mb.targets.to(hidden.device()));
  model_.release_all();
  return out;
}

void ReferenceModel::annotate(std::vector<Sequence>& seqs, const PackOptions& packing) {
  for (auto& s : seqs) s.values["ref_logprobs"] = std::vector<float>(s.tokens.size(), 0.0f);
  for (const auto& mb : pack_micro_batches(seqs, packing)) {
    auto logp = logprobs(mb).to(at::kFloat).contiguous();
    auto lp = logp.accessor<float, 2>();
    auto sq = mb.sequence.accessor<int64_t, 2>();
    auto seg = mb.segments.accessor<int64_t, 2>();
    for (int64_t r = 0; r < logp.size(0); ++r) {
      int64_t start = 0;  // where the current segment (sequence) begins in the row
      for (int64_t t = 0; t < logp.size(1); ++t) {
        if (t == 0 || seg[r][t] != seg[r][t - 1]) start = t;
        // Position t predicts the token at t + 1 of the same sequence.
        if (sq[r][t] < 0 || t + 1 >= logp.size(1) || seg[r][t + 1] != seg[r][t]) continue;
        seqs[static_cast<size_t>(sq[r][t])].values["ref_logprobs"][static_cast<size_t>(t + 1 - start)] = lp[r][t];
      }
    }
  }
}

}  // namespace rlx
