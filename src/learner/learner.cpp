#include "rlx/learner/learner.hpp"

#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <algorithm>
#include <cstdlib>

#include "rlx/core/clock.hpp"
#include "rlx/core/device_copy.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/model/logprob_head.hpp"

namespace rlx {

at::Tensor gather_logprobs(const at::Tensor& logits, const at::Tensor& targets) {
  auto lf = logits.to(at::kFloat);
  auto picked = lf.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  return picked - at::logsumexp(lf, -1);
}

Learner::Learner(const ModelConfig& cfg, dist::Communicator& comm, LearnerOptions options)
    : comm_(comm),
      opt_(std::move(options)),
      model_(cfg, comm, opt_.fsdp),
      optimizer_(opt_.optimizer),
      rng_(opt_.seed, static_cast<uint64_t>(comm.rank())) {
  opt_.schedule.validate();
  RLX_CHECK(opt_.max_grad_norm >= 0, "learner.max_grad_norm must be >= 0, got {}", opt_.max_grad_norm);
  RLX_CHECK(opt_.policy_head || opt_.value_head, "a learner needs a policy head, a value head, or both");
  for (auto* u : model_.trained_units()) optimizer_.add(u->shard, u->decay_mask);
  if (opt_.fsdp.lora.enabled()) model_.init_lora(opt_.seed);  // B = 0: the adapted model starts as the base
  if (opt_.value_head) {
    // Zero-initialised: every value starts at 0, and the first gradients come from the returns alone.
    value_head_ = at::zeros({cfg.hidden_size + 1}, at::TensorOptions().dtype(at::kFloat).device(opt_.fsdp.device));
    value_head_.requires_grad_(true);
    optimizer_.add(value_head_, at::zeros_like(value_head_));
  }
}

std::vector<at::Tensor> Learner::trained_tensors() const {
  std::vector<at::Tensor> out;
  for (const auto* u : const_cast<dist::ShardedTransformer&>(model_).trained_units()) out.push_back(u->shard);
  if (value_head_.defined()) out.push_back(value_head_);
  return out;
}

TokenOutputs Learner::outputs(const MicroBatch& mb, bool entropy, bool trained_only, RoutingTrace* trace) {
  auto in = forward_input(mb);
  if (!opt_.routing_replay) in.routing = at::Tensor();
  in.trace = trace;
  auto hidden = model_.forward_hidden(in);
  TokenOutputs out;
  if (opt_.policy_head) {
    // Chunked over tokens: never the step's [tokens, vocab] logits in fp32 (model/logprob_head.hpp).
    auto head = token_logprobs(
        hidden, model_.lm_head_weight(), to_device_async(mb.targets, hidden.device()),
        {.entropy = entropy,
         .chunk_tokens = opt_.logprob_chunk_tokens,
         .positions = trained_only && opt_.head_on_loss_tokens ? loss_positions(mb, hidden.device()) : at::Tensor()});
    out.logprobs = head.logprobs;
    if (entropy) out.entropy = head.entropy;
  }
  if (opt_.value_head) {
    const int64_t h = value_head_.size(0) - 1;
    out.values = at::matmul(hidden.to(at::kFloat), value_head_.narrow(0, 0, h)) + value_head_[h];
  }
  return out;
}

at::Tensor Learner::logprobs(const MicroBatch& mb) {
  RLX_CHECK(opt_.policy_head, "Learner::logprobs: this learner has no policy head");
  c10::NoGradGuard no_grad;
  auto out = outputs(mb, false, /*trained_only=*/false).logprobs;
  model_.release_all();
  return out;
}

void Learner::annotate(std::vector<Sequence>& seqs, const std::string& logprobs_key, const std::string& values_key) {
  RLX_CHECK(logprobs_key.empty() || opt_.policy_head, "Learner::annotate: no policy head for {:?}", logprobs_key);
  RLX_CHECK(values_key.empty() || opt_.value_head, "Learner::annotate: no value head for {:?}", values_key);
  annotate_sequences(seqs, opt_.packing, comm_, [&](const MicroBatch& mb) {
    c10::NoGradGuard no_grad;
    auto out = outputs(mb, false, /*trained_only=*/true);
    model_.release_all();
    std::map<std::string, at::Tensor> named;
    if (!logprobs_key.empty()) named[logprobs_key] = out.logprobs;
    if (!values_key.empty()) named[values_key] = out.values;
    return named;
  });
}

void annotate_sequences(std::vector<Sequence>& seqs, const PackOptions& packing, dist::Communicator& comm,
                        const TokenForward& forward) {
  auto mbs = pack_micro_batches(seqs, packing);
  auto most = at::tensor({static_cast<double>(mbs.size())}, at::kDouble);
  comm.all_reduce(most, dist::ReduceOp::max, "annotate: micro-batch count")->wait();
  const auto n_mbs = static_cast<size_t>(most.item<double>());
  for (size_t i = 0; i < n_mbs; ++i) {
    if (i >= mbs.size()) {
      forward(empty_micro_batch());  // the same collectives as the other ranks; nothing to store
      continue;
    }
    const auto& mb = mbs[i];
    auto sq = mb.sequence.accessor<int64_t, 2>();
    auto pos = mb.positions.accessor<int64_t, 2>();
    for (auto& [name, tensor] : forward(mb)) {
      for (auto i_seq : mb.sequences) {
        auto& v = seqs[static_cast<size_t>(i_seq)].values[name];
        v.assign(seqs[static_cast<size_t>(i_seq)].tokens.size(), 0.0f);
      }
      auto values = tensor.detach().to(at::kCPU, at::kFloat).contiguous();
      auto acc = values.accessor<float, 2>();
      // Position t predicts the token after it in the same sequence (none after its last).
      auto store = [&](int64_t seq, int64_t r, int64_t t) {
        auto& v = seqs[static_cast<size_t>(seq)].values[name];
        const auto at = static_cast<size_t>(pos[r][t] + 1);
        if (at < v.size()) v[at] = acc[r][t];
      };
      for (int64_t r = 0; r < values.size(0); ++r)
        for (int64_t t = 0; t < values.size(1); ++t)
          if (sq[r][t] >= 0) store(sq[r][t], r, t);
      for (const auto& p : mb.shared)  // a shared prompt's values, to each sequence that continues it
        for (int64_t t = p.start; t < p.start + p.length; ++t)
          for (auto m : p.members) store(m, p.row, t);
    }
  }
}

namespace {
// The micro-batch's tensors on the learner's device, so that a loss function combines them
// with the model's outputs there (the host copy keeps serving the bookkeeping and the
// model's input). Queued copies: the host does not wait for the device here.
MicroBatch on_device(const MicroBatch& mb, at::Device device) {
  if (device.is_cpu()) return mb;
  MicroBatch d = mb;
  for (auto* t : {&d.tokens, &d.segments, &d.targets, &d.loss_mask, &d.sequence, &d.positions, &d.prefix, &d.routing})
    *t = to_device_async(*t, device);
  for (auto& [name, v] : d.values) v = to_device_async(v, device);
  return d;
}

// What the model reads of a micro-batch: the device copies, but tokens (their range checked
// on the host), segments, shared prefixes and the loss mask from the host, where attention's
// layout and the trained positions are read.
MicroBatch model_input(const MicroBatch& host, const MicroBatch& dev) {
  MicroBatch in = dev;
  in.tokens = host.tokens;
  in.segments = host.segments;
  in.prefix = host.prefix;
  in.loss_mask = host.loss_mask;
  return in;
}

// RLX_SYNC_DEBUG=warn|error: LibTorch's CUDA sync debug mode (torch.cuda.set_sync_debug_mode)
// over the micro-batches' forwards, losses and backwards, where nothing should make the host
// wait for the device: "error" throws at the operation that would, naming it.
class SyncDebugScope {
 public:
  explicit SyncDebugScope(at::Device device) {
#if RLX_WITH_CUDA
    const char* mode = std::getenv("RLX_SYNC_DEBUG");
    if (!device.is_cuda() || mode == nullptr || *mode == '\0') return;
    const std::string m = mode;
    RLX_CHECK(m == "warn" || m == "error", "RLX_SYNC_DEBUG is {:?}; use warn or error", m);
    previous_ = c10::cuda::warning_state().get_sync_debug_mode();
    c10::cuda::warning_state().set_sync_debug_mode(m == "warn" ? c10::cuda::SyncDebugMode::L_WARN
                                                               : c10::cuda::SyncDebugMode::L_ERROR);
    set_ = true;
#else
    (void)device;
#endif
  }
  ~SyncDebugScope() {
#if RLX_WITH_CUDA
    if (set_) c10::cuda::warning_state().set_sync_debug_mode(previous_);
#endif
  }
  SyncDebugScope(const SyncDebugScope&) = delete;
  SyncDebugScope& operator=(const SyncDebugScope&) = delete;

 private:
#if RLX_WITH_CUDA
  c10::cuda::SyncDebugMode previous_ = c10::cuda::SyncDebugMode::L_DISABLED;
#endif
  bool set_ = false;
};
}  // namespace

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

  const auto trained = trained_tensors();
  model_.wait_reduces();  // none in flight, unless a step before was cut short
  for (auto t : trained) t.mutable_grad() = at::Tensor();
  // Adapter dropout masks: a stream per (seed, rank, step), the same after a resume.
  model_.module().set_lora_dropout_seed(hash_name(fmt::format("lora-dropout/{}/{}", comm_.rank(), ctx.step), opt_.seed));
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(opt_.fsdp.device));
  MetricSums metrics;
  const bool moe = model_.config().num_experts > 0;
  RoutingStats routing;
  for (size_t i = 0; i < n_mbs; ++i) {
    const SyncDebugScope sync_debug(opt_.fsdp.device);
    at::Tensor loss;
    RECORD_USER_SCOPE("rlx::learner::micro_batch");  // a named range for LibTorch's profiler
    // Lives until the micro-batch's backward, which reads it for the load-balancing loss
    // (none for an empty micro-batch: it has no token to balance).
    RoutingTrace trace;
    trace.aux_loss_coef = i < mbs.size() ? opt_.router_aux_loss_coef : 0.0;
    if (i < mbs.size()) {
      const auto& mb = mbs[i];
      const auto dmb = on_device(mb, opt_.fsdp.device);
      loss = loss_fn(dmb, outputs(model_input(mb, dmb), opt_.entropy, /*trained_only=*/true, moe ? &trace : nullptr),
                     ctx, metrics);
      RLX_CHECK(loss.defined() && loss.numel() == 1, "loss function must return a scalar tensor");
      routing.add(trace, mb, opt_.routing_replay);
      r.tokens += (mb.segments > 0).sum().item<int64_t>();
      r.padded_tokens += mb.tokens.numel();
    } else {
      auto out = outputs(empty_micro_batch(), false, false, moe ? &trace : nullptr);  // same collectives, no gradient
      loss = (opt_.policy_head ? out.logprobs : out.values).sum() * 0.0;
    }
    loss_sum += loss.detach().to(at::kDouble);  // read after the last backward: no host wait here
    loss.backward();
    model_.wait_reduces();  // its last units' gradient shards (several ranks)
  }
  model_.finish_backward();
  r.micro_batches = static_cast<int64_t>(mbs.size());
  if (value_head_.defined()) {
    // Replicated: each rank holds its micro-batches' share of the gradient; the sum is the step's.
    auto& g = value_head_.mutable_grad();
    if (!g.defined()) g = at::zeros_like(value_head_);
    comm_.all_reduce(g, dist::ReduceOp::sum, "value head gradient")->wait();
  }

  RECORD_USER_SCOPE("rlx::learner::norm_and_update");
  std::vector<at::Tensor> shards;
  for (auto* u : model_.trained_units()) shards.push_back(u->shard);
  for (const auto& name : metrics.names())
    RLX_CHECK(std::find(metric_names.begin(), metric_names.end(), name) != metric_names.end(),
              "the loss function reported metric {:?}, which is not among the step's metric names", name);
  // The value head is replicated: its norm counts once, from rank 0.
  const double head_sq = value_head_.defined() && comm_.rank() == 0 ? grad_sq_norm({value_head_}) : 0.0;
  std::vector<double> sums_in{grad_sq_norm(shards) + head_sq, loss_sum.item<double>()};
  auto local = metrics.values();
  for (const auto& name : metric_names) sums_in.push_back(local.count(name) ? local[name] : 0.0);
  const auto routing_sums = routing.sums();
  if (moe) sums_in.insert(sums_in.end(), routing_sums.begin(), routing_sums.end());
  auto sums = at::tensor(sums_in, at::kDouble);
  comm_.all_reduce(sums, dist::ReduceOp::sum, "gradient norm and metrics")->wait();
  r.grad_norm = std::sqrt(sums[0].item<double>());
  r.loss = sums[1].item<double>();
  for (size_t i = 0; i < metric_names.size(); ++i) r.metrics[metric_names[i]] = sums[static_cast<int64_t>(i + 2)].item<double>();
  if (moe) {
    const auto from = static_cast<int64_t>(metric_names.size() + 2);
    std::vector<double> v;
    for (size_t i = 0; i < routing_sums.size(); ++i) v.push_back(sums[from + static_cast<int64_t>(i)].item<double>());
    r.routing = RoutingStats::from(v);
  }
  RLX_CHECK(std::isfinite(r.grad_norm), "step {}: the gradient norm is {} (the loss is {})", ctx.step, r.grad_norm,
            r.loss);
  r.clip_factor = clip_factor(r.grad_norm, opt_.max_grad_norm);
  r.lr = opt_.schedule.at(optimizer_.step_count(), opt_.optimizer.lr);
  optimizer_.step(r.lr, r.clip_factor);
  for (auto t : trained) t.mutable_grad() = at::Tensor();
  model_.release_all();
  r.step = optimizer_.step_count();
  r.seconds = now_s() - t0;
  return r;
}

at::Device learner_device(const std::string& model_device, int rank, int world, int cuda_devices) {
  const at::Device d(model_device);
  if (!d.is_cuda() || d.has_index() || world <= 1 || cuda_devices <= 1) return d;
  return {at::kCUDA, static_cast<c10::DeviceIndex>(rank % cuda_devices)};
}

LearnerOptions learner_options(const LearnerSection& s, uint64_t seed, at::Device device) {
  LearnerOptions o;
  o.fsdp.device = device;
  o.optimizer = {.lr = s.lr, .beta1 = s.beta1, .beta2 = s.beta2, .eps = s.eps, .weight_decay = s.weight_decay};
  o.schedule = {.kind = s.schedule, .warmup_steps = s.warmup_steps, .total_steps = s.total_steps, .min_lr_ratio = s.min_lr_ratio};
  o.max_grad_norm = s.max_grad_norm;
  o.packing = {.micro_batch_tokens = s.micro_batch_tokens,
               .row_tokens = s.row_tokens,
               .pack = s.pack,
               .share_prefix = s.share_prefix};
  o.fsdp.compute_dtype = to_scalar_type(s.compute_dtype);
  o.fsdp.reduce_dtype = to_scalar_type(s.reduce_dtype);
  o.fsdp.activation_checkpointing = s.activation_checkpointing;
  o.router_aux_loss_coef = s.router_aux_loss_coef;
  o.seed = seed;
  return o;
}

}  // namespace rlx
