// Decode steps as CUDA graphs (CUDA builds only). A graph per (batch bucket, context bucket):
// batch 1, 2, 4, ... up to max_seqs, contexts of 512, 1024, ... tokens up to the cache's
// static capacity. A bucket's graph is captured the first time it is needed (after one eager
// warm-up run of the same step) and replayed after. Each step copies its inputs into static
// buffers (pinned host staging: the cache's plan, the input tokens, the sampling
// parameters), replays the model's forward, the decode attention kernel and the sampler,
// and copies tokens and log-probs back in one copy. Padded rows write and read the cache's
// pad block only. launch() and wait() split a step so the engine can enqueue step k+1
// (its input tokens are step k's sampled tokens, still on the device) before reading k's. Weight updates copy into the parameters' storages, which the graphs read:
// nothing is recaptured. All graphs share one memory pool (they never run concurrently).
// A mixture-of-experts model's step also copies back each row's experts (routing_width =
// sparse layers x top-k int16 a row; 0: none), recorded by the forward's RoutingTrace, which
// the graph captures.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "rlx/model/transformer.hpp"
#include "rlx/rollout/paged_kv_cache.hpp"
#include "cuda/ops.hpp"
#include "rollout/sampling_device.hpp"

namespace rlx::cuda {

class DecodeGraphs {
 public:
  // The cache must have enable_static() called; max_seqs <= its static_max_seqs().
  DecodeGraphs(Transformer& model, PagedKVCache& cache, int64_t max_seqs, int64_t routing_width = 0);

  static int64_t batch_bucket(int64_t seqs);  // the next power of two
  int64_t max_seqs() const { return max_seqs_; }
  // Captured graphs, for stats and tests.
  size_t graphs() const { return graphs_.size(); }

  struct Result {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    std::vector<int16_t> routing;  // [rows][routing_width]
  };
  // One decode step of `entries` (one new token each, `tokens` the token each computes).
  Result step(std::span<const PagedKVCache::Entry> entries, std::span<const int64_t> tokens,
              const SamplingBatch& batch);

  // step() in two halves, so the CPU can plan step k+1 while the GPU runs step k. launch()
  // enqueues a step and returns; with `tokens` empty the step's input tokens are the tokens
  // the previous launch samples (same rows, same order), copied on the device. wait() returns
  // the oldest launched step's result. At most two launches wait at once. launch() returns
  // the host seconds it spent capturing the step's graph (its bucket's first step), else 0:
  // a colocated engine's graphs are dropped with the KV pool at every sleep(), so this is
  // what capturing them again costs each round (EngineStats::graph_capture_s).
  double launch(std::span<const PagedKVCache::Entry> entries, std::span<const int64_t> tokens,
                const SamplingBatch& batch);
  Result wait();
  size_t pending() const { return pending_.size(); }

 private:
  void run(int64_t rows);  // the body a graph captures
  int64_t context_bucket(int64_t context) const;

  Transformer& model_;
  PagedKVCache& cache_;
  int64_t max_seqs_, max_context_, routing_width_;
  at::Tensor tokens_host_, tokens_;   // pinned [max_seqs], device [1, max_seqs] int64
  SamplingParamsBuffer params_;
  at::Tensor out_;                    // [max_seqs] int64 tokens, [max_seqs] fp32 log-probs, [max_seqs, routing_width]
                                      // int16 experts, as bytes
  at::Tensor out_tokens_, out_logprobs_, out_routing_;
  // Two pinned copies of out_, taken in turn, each with the event after its copy; the host
  // staging (tokens_host_, the cache's plan, the sampling parameters) is rewritten only
  // after `staged_` says the last launch's copies of it have run.
  std::array<at::Tensor, 2> out_host_;
  std::array<std::unique_ptr<at::cuda::CUDAEvent>, 2> copied_;
  std::unique_ptr<at::cuda::CUDAEvent> staged_;
  struct Pending {
    int buffer;
    int64_t seqs;
  };
  std::deque<Pending> pending_;
  int next_buffer_ = 0;
  int64_t last_rows_ = 0;  // rows of the last launch (a chained launch keeps them)
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<at::cuda::CUDAGraph>> graphs_;
  decltype(at::cuda::graph_pool_handle()) pool_;  // shared by every graph
};

}  // namespace rlx::cuda
