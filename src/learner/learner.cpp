#include "rlx/learner/learner.hpp"

#include <algorithm>

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"

namespace rlx {

at::Tensor gather_logprobs(const at::Tensor& logits, const at::Tensor& targets) {
  auto lf = logits.to(at::kFloat);
  auto picked = lf.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  return picked - at::logsumexp(lf, -1);
}

at::Tensor entropy_from_logits(const at::Tensor& logits) {
  auto lf = logits.to(at::kFloat);
  auto logp = at::log_softmax(lf, -1);
  return -(logp.exp() * logp).sum(-1);
}

Learner::Learner(const ModelConfig& cfg, dist::Communicator& comm, LearnerOptions options)
    : comm_(comm),
      opt_(std::move(options)),
      model_(cfg, comm, opt_.fsdp),
      optimizer_(opt_.optimizer),
      rng_(opt_.seed, static_cast<uint64_t>(comm.rank())) {
  opt_.schedule.validate();
  RLX_CHECK(opt_.max_grad_norm >= 0, "learner.max_grad_norm must be >= 0, got {}", opt_.max_grad_norm);
  for (auto& u : model_.units()) optimizer_.add(u.shard, u.decay_mask);
}

TokenOutputs Learner::outputs(const MicroBatch& mb, bool entropy) {
  auto hidden = model_.forward_hidden({.tokens = mb.tokens, .segments = mb.segments});
  auto logits = model_.logits(hidden);
  TokenOutputs out;
  out.logprobs = gather_logprobs(logits, mb.targets.to(hidden.device()));
  if (entropy) out.entropy = entropy_from_logits(logits);
  return out;
}

at::Tensor Learner::logprobs(const MicroBatch& mb) {
  at::NoGradGuard no_grad;
  auto out = outputs(mb, false).logprobs;
  model_.release_all();
  return out;
}

StepResult Learner::step(const std::vector<Sequence>& batch, const LossFn& loss_fn,
                         const std::vector<std::string>& metric_names) {
  const double t0 = now_s();
  StepResult r;
  auto mbs = pack_micro_batches(batch, opt_.packing);

  // Step-wide counts, and the micro-batch count every rank runs.
  int64_t local_tokens = 0;
  for (const auto& mb : mbs) local_tokens += mb.loss_tokens;
  auto counts = at::tensor({static_cast<double>(local_tokens), static_cast<double>(batch.size())}, at::kDouble);
  comm_.all_reduce(counts, dist::ReduceOp::sum, "step token counts")->wait();
  auto most = at::tensor({static_cast<double>(mbs.size())}, at::kDouble);
  comm_.all_reduce(most, dist::ReduceOp::max, "micro-batch count")->wait();
  const auto n_mbs = static_cast<size_t>(most.item<double>());

  StepContext ctx;
  ctx.step = optimizer_.step_count();
  ctx.global_loss_tokens = counts[0].item<double>();
  ctx.global_sequences = counts[1].item<double>();
  ctx.rank = comm_.rank();
  ctx.world_size = comm_.size();

  for (auto& u : model_.units()) u.shard.mutable_grad() = at::Tensor();
  double loss_sum = 0;
  Metrics metrics;
  for (size_t i = 0; i < n_mbs; ++i) {
    at::Tensor loss;
    if (i < mbs.size()) {
      const auto& mb = mbs[i];
      loss = loss_fn(mb, outputs(mb, opt_.entropy), ctx, metrics);
      RLX_CHECK(loss.defined() && loss.numel() == 1, "loss function must return a scalar tensor");
      r.tokens += (mb.segments > 0).sum().item<int64_t>();
      r.padded_tokens += mb.tokens.numel();
    } else {
      loss = outputs(empty_micro_batch(), false).logprobs.sum() * 0.0;  // same collectives, no gradient
    }
    loss_sum += loss.item<double>();
    loss.backward();
  }
  model_.finish_backward();
  r.micro_batches = static_cast<int64_t>(mbs.size());

  std::vector<at::Tensor> shards;
  for (auto& u : model_.units()) shards.push_back(u.shard);
  for (const auto& [name, value] : metrics)
    RLX_CHECK(std::find(metric_names.begin(), metric_names.end(), name) != metric_names.end(),
              "the loss function reported metric {:?}, which is not among the step's metric names", name);
  std::vector<double> sums_in{grad_sq_norm(shards), loss_sum};
  for (const auto& name : metric_names) sums_in.push_back(metrics.count(name) ? metrics[name] : 0.0);
  auto sums = at::tensor(sums_in, at::kDouble);
  comm_.all_reduce(sums, dist::ReduceOp::sum, "gradient norm and metrics")->wait();
  r.grad_norm = std::sqrt(sums[0].item<double>());
  r.loss = sums[1].item<double>();
  for (size_t i = 0; i < metric_names.size(); ++i) r.metrics[metric_names[i]] = sums[static_cast<int64_t>(i + 2)].item<double>();
  RLX_CHECK(std::isfinite(r.grad_norm), "step {}: the gradient norm is {} (the loss is {})", ctx.step, r.grad_norm,
            r.loss);
  if (opt_.max_grad_norm > 0) r.clip_factor = clip_grads(shards, r.grad_norm, opt_.max_grad_norm);
  r.lr = opt_.schedule.at(optimizer_.step_count(), opt_.optimizer.lr);
  optimizer_.step(r.lr);
  for (auto& u : model_.units()) u.shard.mutable_grad() = at::Tensor();
  model_.release_all();
  r.step = optimizer_.step_count();
  r.seconds = now_s() - t0;
  return r;
}

}  // namespace rlx
