#include "rollout/model_runner.hpp"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx {

ModelRunner::ModelRunner(std::shared_ptr<Transformer> model, const EngineConfig& cfg, int64_t max_model_len,
                         BlockAllocator& blocks, int64_t routing_width)
    : model_(std::move(model)),
      overlap_(cfg.overlap),
      routing_width_(routing_width),
      cache_(model_->config(), blocks.num_blocks(), cfg.block_size, model_->dtype(), model_->device()) {
  model_->fuse_projections();  // one GEMM for q/k/v and one for gate/up; weight updates copy into them
#if RLX_WITH_CUDA
  const auto& mc = model_->config();
  if (cfg.cuda_graphs && model_->device().is_cuda() && (mc.head_dim == 64 || mc.head_dim == 128)) {
    // One block never handed out: padded rows of a graph's batch write and read it.
    const auto pad = blocks.allocate();
    RLX_CHECK(pad.has_value(), "engine: no KV block left to reserve for CUDA graph padding");
    const int64_t max_seqs = std::min<int64_t>(256, cuda::DecodeGraphs::batch_bucket(cfg.max_running));
    cache_.enable_static(max_seqs, (max_model_len + cfg.block_size - 1) / cfg.block_size, *pad);
    graphs_ = std::make_unique<cuda::DecodeGraphs>(*model_, cache_, max_seqs, routing_width_);
    graph_seqs_ = max_seqs;
  }
#else
  (void)max_model_len;
#endif
}

ModelRunner::~ModelRunner() {
  try {
    while (!inflight_.empty()) land_decode();  // the device finishes what it was given
  } catch (...) {
  }
}

int64_t ModelRunner::pool_bytes(int32_t blocks) const {
  return static_cast<int64_t>(blocks) *
         PagedKVCache::block_bytes(model_->config(), cache_.block_size(), model_->dtype());
}

void ModelRunner::check_weights(const std::string& who, const Tensors& tensors) const {
  std::map<std::string, at::Tensor> params;
  for (auto& [name, p] : model_->sync_parameters()) params.emplace(name, p);  // with LoRA: the adapters
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    auto it = params.find(name);
    RLX_CHECK(it != params.end(), "{}: '{}' is not a parameter of the model", who, name);
    RLX_CHECK(seen.emplace(name, i).second, "{}: '{}' is given twice", who, name);
    RLX_CHECK(t.defined() && t.sizes() == it->second.sizes(), "{}: '{}' has shape {}, the model's is {}", who, name,
              t.defined() ? t.sizes() : c10::IntArrayRef{}, it->second.sizes());
    RLX_CHECK(t.is_floating_point(), "{}: '{}' is {}, not a floating-point tensor", who, name,
              c10::toString(t.scalar_type()));
  }
  for (const auto& [name, p] : params)
    RLX_CHECK(seen.contains(name), "{}: '{}' is missing; a full set is required", who, name);
}

ModelRunner::Tensors ModelRunner::staged(const Tensors& tensors) const {
  Tensors out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors)
    out.emplace_back(name, t.detach().to(model_->device(), model_->dtype(), /*non_blocking=*/false, /*copy=*/true));
  return out;
}

int64_t ModelRunner::install_weights(const Tensors& tensors) {
  int64_t bytes = 0;
  c10::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> params;
  for (auto& [name, p] : model_->sync_parameters()) params.emplace(name, p);
  for (const auto& [name, t] : tensors) {
    auto& p = params.at(name);
    p.copy_(t);
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  // Merged adapters: the served weights become base + scale * B A.
  if (model_->lora_merged()) bytes += model_->merge_lora();
  return bytes;
}

void ModelRunner::sleep() {
  RLX_ASSERT(inflight_.empty(), "model runner: sleep() with decode steps in flight");
  compat::synchronize(model_->device());  // nothing queued on any stream still reads the pool
  graphs_.reset();
  cache_.release();
}

void ModelRunner::wake() {
  cache_.restore();
#if RLX_WITH_CUDA
  if (graph_seqs_ > 0) graphs_ = std::make_unique<cuda::DecodeGraphs>(*model_, cache_, graph_seqs_, routing_width_);
#endif
}

ModelRunner::Forward ModelRunner::forward(const StepPlan& plan) {
  std::vector<PagedKVCache::Entry> entries;
  std::vector<int64_t> packed;
  for (const auto& [s, n] : plan.chunks) {
    entries.push_back({s->blocks, s->computed, n});
    packed.insert(packed.end(), s->tokens.begin() + s->computed, s->tokens.begin() + s->computed + n);
  }
  c10::NoGradGuard no_grad;
  cache_.copy_blocks(plan.copies);
  cache_.plan(entries);
  auto tokens = at::tensor(packed, at::TensorOptions().dtype(at::kLong))
                    .to(model_->device())
                    .view({1, static_cast<int64_t>(packed.size())});
  RoutingTrace trace;
  Forward out;
  out.hidden =
      model_->forward_hidden({.tokens = tokens, .trace = routing_width_ > 0 ? &trace : nullptr}, &cache_).select(0, 0);
  if (routing_width_ > 0) out.routing = routing_rows(trace);
  return out;
}

std::vector<int16_t> ModelRunner::routing_rows(const RoutingTrace& trace) const {
  const auto rows = trace.routing().reshape({-1, routing_width_}).to(at::kCPU, at::kShort).contiguous();
  return {rows.data_ptr<int16_t>(), rows.data_ptr<int16_t>() + rows.numel()};
}

at::Tensor ModelRunner::logits(const at::Tensor& hidden, const std::vector<int64_t>& rows,
                               const std::vector<int64_t>& repeat) const {
  c10::NoGradGuard no_grad;
  const auto device = model_->device();
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  auto logits = model_->logits(hidden.index_select(0, at::tensor(rows, long_opts).to(device)));
  if (!repeat.empty()) logits = logits.index_select(0, at::tensor(repeat, long_opts).to(device));
  return logits;
}

ModelRunner::Sampled ModelRunner::sample(const at::Tensor& logits, const SamplingBatch& batch,
                                         const Alternatives& alternatives) const {
  c10::NoGradGuard no_grad;
  auto sampled = rlx::sample(logits, batch);
  const auto toks = sampled.tokens.to(at::kCPU, at::kLong).contiguous();
  const auto lps = sampled.logprobs.to(at::kCPU, at::kFloat).contiguous();
  const auto rows = static_cast<size_t>(toks.numel());
  Sampled out;
  out.top = this->alternatives(logits, alternatives, toks.data_ptr<int64_t>(), lps.data_ptr<float>());
  out.tokens.assign(toks.data_ptr<int64_t>(), toks.data_ptr<int64_t>() + rows);
  out.logprobs.assign(lps.data_ptr<float>(), lps.data_ptr<float>() + rows);
  return out;
}

std::vector<std::vector<TokenLogprob>> ModelRunner::alternatives(const at::Tensor& logits, const Alternatives& alts,
                                                                 const int64_t* tokens, const float* logprobs) const {
  if (alts.empty()) return {};
  std::vector<TokenLogprob> sampled;
  for (size_t i = 0; i < alts.k.size(); ++i) sampled.push_back({static_cast<TokenId>(tokens[i]), logprobs[i]});
  return top_logprobs(logits, alts.temperature, alts.k, sampled);
}

void ModelRunner::prompt_logprobs(const at::Tensor& hidden, const int32_t* targets, int64_t m, double temperature,
                                  int64_t top, float* out, std::vector<TokenLogprob>* out_top) const {
  // Logits of this many rows at a time: a long prompt never holds [prompt, vocab] at once.
  static constexpr int64_t kRows = 256;
  c10::NoGradGuard no_grad;
  for (int64_t p0 = 0; p0 < m; p0 += kRows) {
    const int64_t rows = std::min(kRows, m - p0);
    const auto logits = model_->logits(hidden.narrow(0, p0, rows));
    const std::vector<int64_t> next(targets + p0, targets + p0 + rows);
    const auto lps = target_logprobs(logits, next, temperature);
    std::copy(lps.begin(), lps.end(), out + p0);
    if (top == 0) continue;
    auto alts = top_logprobs(logits, std::vector<double>(static_cast<size_t>(rows), temperature),
                             std::vector<int64_t>(static_cast<size_t>(rows), top));
    std::move(alts.begin(), alts.end(), out_top + p0);
  }
}

}  // namespace rlx
