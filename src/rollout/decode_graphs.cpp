#include "rollout/decode_graphs.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstring>

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx::cuda {

namespace {
constexpr int64_t kMinContextBucket = 512;
}

DecodeGraphs::DecodeGraphs(Transformer& model, PagedKVCache& cache, int64_t max_seqs, int64_t routing_width)
    : model_(model),
      cache_(cache),
      max_seqs_(max_seqs),
      max_context_(cache.static_enabled() ? cache.static_max_context() : 0),
      routing_width_(routing_width),
      params_(max_seqs, model.device()),
      pool_(at::cuda::graph_pool_handle()) {
  RLX_ASSERT(cache.static_enabled() && max_seqs >= 1 && max_seqs <= cache.static_max_seqs(),
             "DecodeGraphs: max_seqs {} for a cache of {} static rows", max_seqs, cache.static_max_seqs());
  const auto device = model.device();
  tokens_host_ = at::zeros({max_seqs}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  tokens_ = at::zeros({1, max_seqs}, at::TensorOptions().dtype(at::kLong).device(device));
  const int64_t out_bytes = max_seqs * (12 + 2 * routing_width);
  out_ = at::zeros({out_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  for (size_t b = 0; b < out_host_.size(); ++b) {
    out_host_[b] = at::zeros({out_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    copied_[b] = std::make_unique<at::cuda::CUDAEvent>();
  }
  staged_ = std::make_unique<at::cuda::CUDAEvent>();
  out_tokens_ = out_.narrow(0, 0, max_seqs * 8).view(at::kLong);
  out_logprobs_ = out_.narrow(0, max_seqs * 8, max_seqs * 4).view(at::kFloat);
  if (routing_width_ > 0)
    out_routing_ = out_.narrow(0, max_seqs * 12, max_seqs * routing_width_ * 2).view(at::kShort).view({max_seqs, routing_width_});
}

int64_t DecodeGraphs::batch_bucket(int64_t seqs) {
  int64_t b = 1;
  while (b < seqs) b *= 2;
  return b;
}

int64_t DecodeGraphs::context_bucket(int64_t context) const {
  int64_t b = kMinContextBucket;
  while (b < context) b *= 2;
  return std::min(b, max_context_);
}

void DecodeGraphs::run(int64_t rows) {
  c10::NoGradGuard no_grad;
  RoutingTrace trace;  // its recording has no host sync: the graph captures it
  auto hidden = model_.forward_hidden({.tokens = tokens_.narrow(1, 0, rows), .trace = routing_width_ > 0 ? &trace : nullptr},
                                      &cache_);
  if (routing_width_ > 0) out_routing_.narrow(0, 0, rows).copy_(trace.routing().view({rows, routing_width_}));
  auto logits = model_.logits(hidden.select(0, 0));
  auto tokens = out_tokens_.narrow(0, 0, rows), logprobs = out_logprobs_.narrow(0, 0, rows);
  params_.sample(logits, tokens, logprobs);
}

DecodeGraphs::Result DecodeGraphs::step(std::span<const PagedKVCache::Entry> entries, std::span<const int64_t> tokens,
                                        const SamplingBatch& batch) {
  RLX_ASSERT(pending_.empty() && !tokens.empty(), "DecodeGraphs::step with {} launches pending", pending_.size());
  launch(entries, tokens, batch);
  return wait();
}

double DecodeGraphs::launch(std::span<const PagedKVCache::Entry> entries, std::span<const int64_t> tokens,
                            const SamplingBatch& batch) {
  const int64_t seqs = static_cast<int64_t>(entries.size());
  const bool chained = tokens.empty();
  RLX_ASSERT(seqs >= 1 && seqs <= max_seqs_ && (chained || tokens.size() == entries.size()) &&
                 batch.size() == entries.size() && pending_.size() < 2,
             "DecodeGraphs::launch: {} entries, {} tokens, {} sampling rows, {} pending", entries.size(), tokens.size(),
             batch.size(), pending_.size());
  const c10::cuda::CUDAGuard guard(model_.device());
  const int64_t rows = std::min(batch_bucket(seqs), max_seqs_);
  RLX_ASSERT(!chained || (!pending_.empty() && rows == last_rows_),
             "DecodeGraphs::launch: a chained launch of {} rows follows a launch of {} rows", rows, last_rows_);
  int64_t context = 1;
  for (const auto& e : entries) context = std::max(context, e.cached + 1);
  const int64_t context_cap = context_bucket(context);
  auto stream = c10::cuda::getCurrentCUDAStream();

  // The host staging buffers are rewritten only once the last launch's copies of them ran.
  staged_->synchronize();
  if (chained) {
    // The previous launch's sampled tokens are this step's inputs: a copy on the device,
    // after that launch's replay and its copy back.
    tokens_.narrow(1, 0, rows).copy_(out_tokens_.narrow(0, 0, rows).view({1, rows}), /*non_blocking=*/true);
  } else {
    auto* t = tokens_host_.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) t[r] = r < seqs ? tokens[static_cast<size_t>(r)] : 0;
    tokens_.copy_(tokens_host_.view({1, max_seqs_}), /*non_blocking=*/true);
  }
  cache_.plan_static(entries, rows, context_cap);
  params_.stage(batch, rows);
  staged_->record(stream);

  const auto key = std::pair{rows, context_cap};
  auto it = graphs_.find(key);
  double capture_s = 0;
  if (it == graphs_.end()) {
    const double t0 = now_s();
    // Capture on a side stream (capture cannot run on the legacy default stream), after one
    // eager run of the same step there: it initialises cuBLAS and the allocator's blocks, and
    // its writes are the ones the replay below repeats.
    auto side = c10::cuda::getStreamFromPool();
    at::cuda::CUDAEvent ready;
    ready.record(stream);
    ready.block(side);
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      run(rows);
      // Thread-local capture: the colocated learner shares this process and may allocate or
      // copy to the host on its own thread while a graph is captured here (global mode, the
      // default, would invalidate the capture). LibTorch before 2.1 has global mode only.
#if RLX_TORCH_AT_LEAST(2, 1)
      graph->capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
#else
      graph->capture_begin(pool_);
#endif
      run(rows);
      graph->capture_end();
    }
    at::cuda::CUDAEvent captured;
    captured.record(side);
    captured.block(stream);
    it = graphs_.emplace(key, std::move(graph)).first;
    capture_s = now_s() - t0;
  }
  it->second->replay();
  // Two host buffers in turn: wait() has read this one's last result (at most two pending).
  const int b = next_buffer_;
  next_buffer_ ^= 1;
  out_host_[static_cast<size_t>(b)].copy_(out_, /*non_blocking=*/true);
  copied_[static_cast<size_t>(b)]->record(stream);
  pending_.push_back({b, seqs});
  last_rows_ = rows;
  return capture_s;
}

DecodeGraphs::Result DecodeGraphs::wait() {
  RLX_ASSERT(!pending_.empty(), "DecodeGraphs::wait with no launch pending");
  const auto p = pending_.front();
  pending_.pop_front();
  copied_[static_cast<size_t>(p.buffer)]->synchronize();
  Result r;
  r.tokens.resize(static_cast<size_t>(p.seqs));
  r.logprobs.resize(static_cast<size_t>(p.seqs));
  const auto* h = out_host_[static_cast<size_t>(p.buffer)].data_ptr<uint8_t>();
  std::memcpy(r.tokens.data(), h, static_cast<size_t>(p.seqs) * 8);
  std::memcpy(r.logprobs.data(), h + max_seqs_ * 8, static_cast<size_t>(p.seqs) * 4);
  r.routing.resize(static_cast<size_t>(p.seqs * routing_width_));
  if (routing_width_ > 0) std::memcpy(r.routing.data(), h + max_seqs_ * 12, r.routing.size() * 2);
  return r;
}

}  // namespace rlx::cuda
