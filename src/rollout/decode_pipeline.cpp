// The engine's decode steps as a two-deep pipeline: while the device runs decode step k,
// the CPU plans step k+1 of the same rows and enqueues it, its input tokens being step k's
// sampled tokens, still on the device (a CUDA graph reads them from the buffer the sampler
// wrote). Only then are step k's tokens read back and appended. A row whose sequence
// stops at step k (a stop token or string: a stop known in advance, the length limit, ends
// the chain instead) is computed once more at k+1 and thrown away. Prefix blocks that
// step k+1 fills are published when its input tokens are known, at step k's landing.
//
// The chain holds while nothing else would change the batch: no waiting request the
// running batch has room for, no weight update staged, every running sequence in the step, blocks free for
// every row without preemption. Otherwise the pipeline drains and the next step schedules
// afresh. Tokens and log-probs are those of the unpipelined engine: each row's sampling
// uniform depends on its request, sample and position only. A mixture-of-experts step's
// routing goes to its rows' KV slots when the step's result is known: at once for an eager
// step, when it lands for a graph's (a row whose sequence has finished by then is skipped).
//
// The EngineCore decides (try_chain: whether to chain; which rows) and appends; the
// ModelRunner launches and lands (graphs or eager).
#include <c10/core/GradMode.h>

#include <algorithm>

#include "rlx/core/error.hpp"
#include "rollout/engine_core.hpp"

namespace rlx {

// --- the core: which rows, and their tokens ----------------------------------------------

bool EngineCore::plain_decode() const {
  if (!plan_.decode_only()) return false;
  if (runner_.graphs_fit(plan_.chunks.size())) return true;
  return cfg_.overlap;
}

bool EngineCore::try_chain() {
  if (!cfg_.overlap || runner_.in_flight() != 1 || update_) return false;
  // A waiting sequence that the running batch has room for is admitted by a fresh step.
  if (scheduler_.room_for_waiting()) return false;
  const auto& rows = runner_.oldest_rows();
  if (rows.size() != scheduler_.running().size()) return false;
  for (const Sequence* s : rows) {
    if (s == nullptr || s->done || !s->running) return false;
    // A stop known in advance ends the chain: the length limit once the step in flight lands.
    const auto after = static_cast<int64_t>(s->tokens.size()) + 1;
    if (s->generated() + 1 >= as_seq(*s).req->req.params.max_new_tokens || after >= max_model_len_) return false;
  }
  auto plan = scheduler_.chain(rows);
  if (!plan) return false;
  plan_ = std::move(*plan);
  for (const auto& [src, dst] : plan_.copies) routing_.copy(src, dst);
  return true;
}

void EngineCore::launch_decode(bool chained) {
  std::vector<Sequence*> rows;
  for (const auto& [s, n] : plan_.chunks) {
    rows.push_back(s);
    // A one-token prompt (a chained row's last token is not appended yet).
    if (!chained && s->generated() == 0) ++stats_.prefill_tokens;
  }
  std::vector<RoutedSpan> spans;
  for (Sequence* s : rows) spans.push_back({s, s->computed, 1});
  const auto launched = forgetting_on_error([&] {
    auto l =
        runner_.launch_decode(rows, plan_.copies, sampling_batch(rows, chained ? 1 : 0), alternatives(rows), chained);
    if (!l.on_graph) store_routing(l.routing, spans);
    return l;
  });
  for (Sequence* s : rows) ++s->computed;
  stats_.forward_tokens += static_cast<int64_t>(rows.size());
  if (launched.on_graph) ++stats_.graph_steps;
  if (launched.capture_s > 0) {
    ++stats_.graph_captures;
    stats_.graph_capture_s += launched.capture_s;
  }
  if (chained) ++stats_.overlapped_steps;
}

void EngineCore::land_decode() {
  auto f = runner_.land_decode();
  if (f.on_graph) {
    std::vector<RoutedSpan> spans;
    for (size_t i = 0; i < f.rows.size(); ++i) spans.push_back({f.rows[i], f.positions[i], 1});
    store_routing(f.routing, spans);
  }
  append_rows(f.rows, f.tokens, f.logprobs, f.top);
  // The step behind this one computed these tokens' keys: its full blocks can be shared now.
  if (runner_.in_flight() > 0)
    for (Sequence* s : runner_.oldest_rows())
      if (s != nullptr && !s->done) scheduler_.publish_full_blocks(*s, s->computed);
}

void EngineCore::land_all() {
  while (runner_.in_flight() > 0) land_decode();
}

// --- the runner: launch, land ------------------------------------------------------------

bool ModelRunner::graphs_fit(size_t rows) const {
#if RLX_WITH_CUDA
  return graphs_ && static_cast<int64_t>(rows) <= graphs_->max_seqs();
#else
  (void)rows;
  return false;
#endif
}

ModelRunner::Launched ModelRunner::launch_decode(std::vector<Sequence*> rows,
                                                 const std::vector<std::pair<BlockId, BlockId>>& copies,
                                                 const SamplingBatch& batch, const Alternatives& alternatives,
                                                 bool chained) {
  DecodeLaunch f;
  f.rows = std::move(rows);
  std::vector<int64_t> tokens;
  if (chained) {
    const auto& prev = inflight_.back();
    f.on_graph = prev.on_graph;
    if (!prev.on_graph) tokens = prev.tokens;  // an eager step's tokens are known at once
  } else {
    for (const Sequence* s : f.rows) tokens.push_back(s->tokens.back());
    // The graphs sample only: a row asking for log-prob alternatives runs the step eager.
    f.on_graph = graphs_fit(f.rows.size()) && alternatives.empty();
  }
  std::vector<PagedKVCache::Entry> entries;
  for (const Sequence* s : f.rows) {
    entries.push_back({s->blocks, s->computed, 1});
    f.positions.push_back(s->computed);
  }
  Launched out;
  out.on_graph = f.on_graph;
  c10::NoGradGuard no_grad;
  cache_.copy_blocks(copies);
#if RLX_WITH_CUDA
  if (f.on_graph) {
    out.capture_s =
        graphs_->launch(entries, chained ? std::span<const int64_t>{} : std::span<const int64_t>(tokens), batch);
    inflight_.push_back(std::move(f));
    return out;
  }
#endif
  auto sampled = eager_decode(entries, tokens, batch, alternatives, out.routing);
  f.tokens = std::move(sampled.tokens);
  f.logprobs = std::move(sampled.logprobs);
  f.top = std::move(sampled.top);
  inflight_.push_back(std::move(f));
  return out;
}

ModelRunner::Sampled ModelRunner::eager_decode(std::span<const PagedKVCache::Entry> entries,
                                               const std::vector<int64_t>& tokens, const SamplingBatch& batch,
                                               const Alternatives& alternatives, std::vector<int16_t>& routing) {
  cache_.plan(entries);
  const auto rows = static_cast<int64_t>(tokens.size());
  auto input = at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).to(model_->device()).view({1, rows});
  RoutingTrace trace;
  const auto hidden =
      model_->forward_hidden({.tokens = input, .trace = routing_width_ > 0 ? &trace : nullptr}, &cache_);
  if (routing_width_ > 0) routing = routing_rows(trace);
  return sample(model_->logits(hidden.select(0, 0)), batch, alternatives);
}

ModelRunner::Landed ModelRunner::land_decode() {
  DecodeLaunch f = std::move(inflight_.front());
  inflight_.pop_front();
  Landed out{.rows = std::move(f.rows),
             .positions = std::move(f.positions),
             .on_graph = f.on_graph,
             .tokens = std::move(f.tokens),
             .logprobs = std::move(f.logprobs),
             .top = std::move(f.top)};
#if RLX_WITH_CUDA
  if (f.on_graph) {
    auto r = graphs_->wait();
    out.tokens = std::move(r.tokens);
    out.logprobs = std::move(r.logprobs);
    out.routing = std::move(r.routing);
  }
#endif
  return out;
}

}  // namespace rlx
