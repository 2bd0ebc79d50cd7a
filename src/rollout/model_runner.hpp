// The rollout engine's model runner: it carries out what the Scheduler planned, and decides
// nothing about which sequence runs. It owns the model's device side: the paged KV pool,
// the forward of a step's packed chunks, logits and sampling (with log-prob alternatives
// and prompt log-probs), CUDA graphs for decode steps, and the two-deep decode pipeline
// (src/rollout/decode_pipeline.cpp documents the overlap). Sequences' tokens and block
// tables are read from the plan; sampled tokens come back to the engine, which appends them.
//
//   ModelRunner runner(model, cfg, max_model_len, scheduler.blocks(), routing_width);
//   auto fwd = runner.forward(plan);                 // hidden [tokens, H]
//   auto out = runner.sample(runner.logits(rows), batch, {});
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "rlx/rollout/engine.hpp"
#include "rlx/rollout/scheduler.hpp"
#if RLX_WITH_CUDA
#include "rollout/decode_graphs.hpp"
#else
namespace rlx::cuda {
class DecodeGraphs {};  // CUDA builds only
}  // namespace rlx::cuda
#endif

namespace rlx {

// Per row of a sampled step, what its log-prob alternatives ask (k = 0: none). Empty when
// no row asks.
struct Alternatives {
  std::vector<double> temperature;
  std::vector<int64_t> k;
  bool empty() const { return k.empty(); }
};

class ModelRunner {
 public:
  using Tensors = std::vector<std::pair<std::string, at::Tensor>>;
  // `blocks` is the scheduler's: with CUDA graphs one block is taken from it for padding.
  // `routing_width`: per token, the experts recorded (sparse layers x top-k; 0: none).
  ModelRunner(std::shared_ptr<Transformer> model, const EngineConfig& cfg, int64_t max_model_len,
              BlockAllocator& blocks, int64_t routing_width);
  ~ModelRunner();  // the device finishes the decode steps it was given

  Transformer& model() const { return *model_; }
  // The KV pool's bytes for `blocks` blocks (allocated or not).
  int64_t pool_bytes(int32_t blocks) const;

  // Throws unless `tensors` is a complete set of the model's parameters (names, shapes).
  void check_weights(const std::string& who, const Tensors& tensors) const;
  // Copies of `tensors` on the model's device, in its dtype (staged for a later install).
  Tensors staged(const Tensors& tensors) const;
  // Copies a checked set of weights into the model; returns the bytes copied.
  int64_t install_weights(const Tensors& tensors);

  // Frees the KV pool and the CUDA graphs that captured its addresses (nothing in flight);
  // wake() allocates them again.
  void sleep();
  void wake();

  // A prefill or mixed step: the plan's chunks packed into one forward (copy-on-write
  // copies first). The hidden states [tokens, H] in plan order, and with routing recorded,
  // each token's experts ([tokens][routing_width]).
  struct Forward {
    at::Tensor hidden;
    std::vector<int16_t> routing;
  };
  Forward forward(const StepPlan& plan);
  // The logits of hidden rows `rows`; with `repeat`, row i of the result is row repeat[i]
  // of those (a group's samples share their leader's row).
  at::Tensor logits(const at::Tensor& hidden, const std::vector<int64_t>& rows,
                    const std::vector<int64_t>& repeat) const;
  struct Sampled {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<TokenLogprob>> top;  // empty when no row asks for alternatives
  };
  Sampled sample(const at::Tensor& logits, const SamplingBatch& batch, const Alternatives& alternatives) const;
  // Prompt log-probs of positions [0, m) of a chunk: hidden rows [m, H] predict `targets`
  // (m of them); with `top` > 0 also their alternatives.
  void prompt_logprobs(const at::Tensor& hidden, const int32_t* targets, int64_t m, double temperature, int64_t top,
                       float* out, std::vector<TokenLogprob>* out_top) const;

  // Decode steps (decode_pipeline.cpp). Whether a decode step of `rows` replays a graph.
  bool graphs_fit(size_t rows) const;
  // Enqueues a decode step of `rows`, one token each at position rows[i]->computed:
  // their last tokens, or (chained) the tokens the newest step in flight samples, still on
  // the device. Returns whether it runs on a graph, and an eager step's routing.
  struct Launched {
    bool on_graph = false;
    double capture_s = 0;          // host seconds capturing its graph (0: replayed, or eager)
    std::vector<int16_t> routing;  // eager, with routing recorded: [rows][routing_width]
  };
  Launched launch_decode(std::vector<Sequence*> rows, const std::vector<std::pair<BlockId, BlockId>>& copies,
                         const SamplingBatch& batch, const Alternatives& alternatives, bool chained);
  // The oldest step in flight, its result known. A row set to null since is skipped.
  struct Landed {
    std::vector<Sequence*> rows;
    std::vector<int64_t> positions;  // the position each row computed
    bool on_graph = false;
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<TokenLogprob>> top;
    std::vector<int16_t> routing;  // a graph's, with routing recorded: [rows][routing_width]
  };
  Landed land_decode();
  size_t in_flight() const { return inflight_.size(); }
  // The rows of the oldest / newest decode step in flight.
  const std::vector<Sequence*>& oldest_rows() const { return inflight_.front().rows; }
  // Rows of steps in flight whose sequence is `pred` are computed and thrown away.
  template <class P>
  void drop_rows(P&& pred) {
    for (auto& f : inflight_)
      for (auto& s : f.rows)
        if (s != nullptr && pred(*s)) s = nullptr;
  }

 private:
  // An eager decode step (no graph): plan, forward, sample; an MoE step's experts into `routing`.
  Sampled eager_decode(std::span<const PagedKVCache::Entry> entries, const std::vector<int64_t>& tokens,
                       const SamplingBatch& batch, const Alternatives& alternatives, std::vector<int16_t>& routing);
  // A forward's recorded experts, [tokens][routing_width] on the host.
  std::vector<int16_t> routing_rows(const RoutingTrace& trace) const;
  std::vector<std::vector<TokenLogprob>> alternatives(const at::Tensor& logits, const Alternatives& alts,
                                                      const int64_t* tokens, const float* logprobs) const;

  std::shared_ptr<Transformer> model_;
  bool overlap_;
  int64_t routing_width_;
  PagedKVCache cache_;
  std::unique_ptr<cuda::DecodeGraphs> graphs_;  // CUDA decode steps (null: eager)
  int64_t graph_seqs_ = 0;  // CUDA graphs' batch bound (0: eager), to capture them again after wake()
  // Decode steps launched whose tokens are not returned yet (at most two), oldest first.
  struct DecodeLaunch {
    std::vector<Sequence*> rows;
    std::vector<int64_t> positions;
    bool on_graph = false;        // the result waits in graphs_
    std::vector<int64_t> tokens;  // eager: the result
    std::vector<float> logprobs;
    std::vector<std::vector<TokenLogprob>> top;
  };
  std::deque<DecodeLaunch> inflight_;
};

}  // namespace rlx
