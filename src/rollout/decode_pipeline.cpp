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
#include <c10/core/GradMode.h>

#include <algorithm>

#include "rlx/core/error.hpp"
#include "rollout/engine_state.hpp"

namespace rlx {

bool Engine::plain_decode() const {
  if (plan_.empty()) return false;
  for (const auto& [s, n] : plan_)
    if (n != 1 || !s->followers.empty() || s->computed + 1 != static_cast<int64_t>(s->tokens.size())) return false;
#if RLX_WITH_CUDA
  if (graphs_ && static_cast<int64_t>(plan_.size()) <= graphs_->max_seqs()) return true;
#endif
  return cfg_.overlap;
}

bool Engine::try_chain() {
  if (!cfg_.overlap || inflight_.size() != 1 || update_) return false;
  if (!waiting_.empty()) {
    // A waiting sequence that the running batch has room for is admitted by a fresh step.
    const auto group = static_cast<int64_t>(1 + waiting_.front()->followers.size());
    if (static_cast<int64_t>(running_.size()) + group <= cfg_.max_running) return false;
  }
  const auto& prev = inflight_.front();
  if (prev.seqs.size() != running_.size()) return false;
  int64_t blocks = 0;
  for (const Seq* s : prev.seqs) {
    if (s == nullptr || s->done || !s->running) return false;
    // A stop known in advance ends the chain: the length limit once the step in flight lands.
    const auto after = static_cast<int64_t>(s->tokens.size()) + 1;
    if (s->generated() + 1 >= s->req->req.params.max_new_tokens || after >= max_model_len_) return false;
    blocks += reservation(*s, 1).blocks();
  }
  if (blocks > blocks_.num_free()) return false;
  copies_.clear();
  for (Seq* s : prev.seqs) RLX_ASSERT(reserve(*s, 1), "try_chain: a reservation counted as free failed");
  return true;
}

void Engine::launch_decode(bool chained) {
  DecodeLaunch f;
  std::vector<int64_t> tokens;
  if (chained) {
    const auto& prev = inflight_.back();
    f.seqs = prev.seqs;
    f.on_graph = prev.on_graph;
    if (!prev.on_graph) tokens = prev.tokens;  // an eager step's tokens are known at once
  } else {
    for (const auto& [s, n] : plan_) {
      f.seqs.push_back(s);
      tokens.push_back(s->tokens.back());
      if (s->generated() == 0) ++stats_.prefill_tokens;  // a one-token prompt
    }
#if RLX_WITH_CUDA
    // The graphs sample only: a row asking for log-prob alternatives runs the step eager.
    f.on_graph = graphs_ && static_cast<int64_t>(f.seqs.size()) <= graphs_->max_seqs() && !wants_alternatives(f.seqs);
#endif
  }
  std::vector<PagedKVCache::Entry> entries;
  for (Seq* s : f.seqs) {
    entries.push_back({s->blocks, s->computed, 1});
    f.spans.push_back({s, s->computed, 1});
  }
  const auto batch = sampling_batch(f.seqs, chained ? 1 : 0);
  const auto rows = static_cast<int64_t>(f.seqs.size());
  c10::NoGradGuard no_grad;
  cache_.copy_blocks(copies_);
  forgetting_on_error([&] {
#if RLX_WITH_CUDA
    if (f.on_graph) {
      graphs_->launch(entries, chained ? std::span<const int64_t>{} : std::span<const int64_t>(tokens), batch);
      return;
    }
#endif
    cache_.plan(entries);
    auto input = at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).to(model_->device()).view({1, rows});
    RoutingTrace trace;
    const auto hidden = model_->forward_hidden({.tokens = input, .trace = routing_.enabled() ? &trace : nullptr}, &cache_);
    store_routing(trace, f.spans);
    const auto logits = model_->logits(hidden.select(0, 0));
    auto sampled = sample(logits, batch);
    const auto toks = sampled.tokens.to(at::kCPU, at::kLong).contiguous();
    const auto lps = sampled.logprobs.to(at::kCPU, at::kFloat).contiguous();
    f.top = alternatives(logits, f.seqs, toks.data_ptr<int64_t>(), lps.data_ptr<float>());
    f.tokens.assign(toks.data_ptr<int64_t>(), toks.data_ptr<int64_t>() + rows);
    f.logprobs.assign(lps.data_ptr<float>(), lps.data_ptr<float>() + rows);
  });
  for (Seq* s : f.seqs) ++s->computed;
  stats_.forward_tokens += rows;
  if (f.on_graph) ++stats_.graph_steps;
  if (chained) ++stats_.overlapped_steps;
  inflight_.push_back(std::move(f));
}

void Engine::land_decode() {
  DecodeLaunch f = std::move(inflight_.front());
  inflight_.pop_front();
#if RLX_WITH_CUDA
  if (f.on_graph) {
    auto r = graphs_->wait();
    f.tokens = std::move(r.tokens);
    f.logprobs = std::move(r.logprobs);
    if (routing_.enabled()) {
      for (size_t i = 0; i < f.seqs.size(); ++i) f.spans[i].seq = f.seqs[i];  // collect() may have dropped rows
      store_routing(r.routing.data(), f.spans);
    }
  }
#endif
  for (size_t i = 0; i < f.seqs.size(); ++i) {
    Seq* s = f.seqs[i];
    if (s == nullptr || s->done) {
      ++stats_.discarded_rows;
      continue;
    }
    append_token(*s, static_cast<TokenId>(f.tokens[i]), f.logprobs[i],
                 f.top.empty() ? std::vector<TokenLogprob>{} : std::move(f.top[i]));
  }
  std::erase_if(running_, [](const Seq* s) { return s->done; });
  // The step behind this one computed these tokens' keys: its full blocks can be shared now.
  if (!inflight_.empty())
    for (Seq* s : inflight_.front().seqs)
      if (s != nullptr && !s->done) publish_full_blocks(*s, s->computed);
}

}  // namespace rlx
