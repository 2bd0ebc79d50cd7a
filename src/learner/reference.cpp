#include "rlx/learner/reference.hpp"

#include "rlx/learner/learner.hpp"
#include "rlx/model/logprob_head.hpp"
#include <c10/core/GradMode.h>

#include "rlx/core/error.hpp"

namespace rlx {

namespace {
dist::FsdpOptions frozen(dist::FsdpOptions o) {
  o.frozen = true;
  o.lora = {.rank = 0};
  return o;
}
}  // namespace

ReferenceModel::ReferenceModel(const ModelConfig& cfg, dist::Communicator& comm, dist::FsdpOptions options)
    : owned_(std::make_unique<dist::ShardedTransformer>(cfg, comm, frozen(options))), model_(*owned_) {}

ReferenceModel::ReferenceModel(dist::ShardedTransformer& lora_policy) : model_(lora_policy), base_of_lora_(true) {
  RLX_CHECK(lora_policy.lora().enabled(), "ReferenceModel: the policy has no adapters to switch off");
}

void ReferenceModel::load_from(const Transformer& full) {
  RLX_CHECK(owned_, "ReferenceModel: the base of a LoRA policy is the policy's own weights");
  model_.load_from(full);
}

void ReferenceModel::init_weights(uint64_t seed) {
  RLX_CHECK(owned_, "ReferenceModel: the base of a LoRA policy is the policy's own weights");
  model_.init_weights(seed);
}

at::Tensor ReferenceModel::logprobs(const MicroBatch& mb, bool trained_only) {
  c10::NoGradGuard no_grad;
  // The adapters off for this forward only (the policy's next forward has them again).
  struct Base {
    dist::ShardedTransformer* m;
    ~Base() {
      if (m) m->set_lora_active(true);
    }
  } base{base_of_lora_ ? &model_ : nullptr};
  if (base.m) model_.set_lora_active(false);
  auto in = forward_input(mb);
  in.routing = at::Tensor();  // the rollout's routing is the policy's: the reference routes itself
  auto hidden = model_.forward_hidden(in);
  auto out = token_logprobs(hidden, model_.lm_head_weight(), mb.targets.to(hidden.device()),
                            {.positions = trained_only ? loss_positions(mb, hidden.device()) : at::Tensor()})
                 .logprobs;
  model_.release_all();
  return out;
}

void ReferenceModel::annotate(std::vector<Sequence>& seqs, const PackOptions& packing, const std::string& key,
                              bool trained_only) {
  annotate_sequences(seqs, packing, model_.comm(), [&](const MicroBatch& mb) {
    return std::map<std::string, at::Tensor>{{key, logprobs(mb, trained_only)}};
  });
}

}  // namespace rlx
