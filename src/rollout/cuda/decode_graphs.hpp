// Decode steps as CUDA graphs (CUDA builds only). A graph per (batch bucket, context bucket):
// batch 1, 2, 4, ... up to max_seqs, contexts of 512, 1024, ... tokens up to the cache's
// static capacity. A bucket's graph is captured the first time it is needed (after one eager
// warm-up run of the same step) and replayed after. Each step copies its inputs into static
// buffers (pinned host staging: the cache's plan, the input tokens, the sampling
// parameters), replays the model's forward, the decode attention kernel and the sampler,
// and copies tokens and log-probs back in one copy. Padded rows write and read the cache's
// pad block only. Weight updates copy into the parameters' storages, which the graphs read:
// nothing is recaptured. All graphs share one memory pool (they never run concurrently).
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>

#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "rlx/model/transformer.hpp"
#include "rlx/rollout/paged_kv_cache.hpp"
#include "rollout/cuda/glue.hpp"

namespace rlx::cuda {

class DecodeGraphs {
 public:
  // The cache must have enable_static() called; max_seqs <= its static_max_seqs().
  DecodeGraphs(Transformer& model, PagedKVCache& cache, int64_t max_seqs);

  static int64_t batch_bucket(int64_t seqs);  // the next power of two
  int64_t max_seqs() const { return max_seqs_; }
  // Captured graphs, for stats and tests.
  size_t graphs() const { return graphs_.size(); }

  struct Result {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
  };
  // One decode step of `entries` (one new token each, `tokens` the token each computes).
  Result step(std::span<const PagedKVCache::Entry> entries, std::span<const int64_t> tokens,
              const SamplingBatch& batch);

 private:
  void run(int64_t rows);  // the body a graph captures
  int64_t context_bucket(int64_t context) const;

  Transformer& model_;
  PagedKVCache& cache_;
  int64_t max_seqs_, max_context_;
  at::Tensor tokens_host_, tokens_;   // pinned [max_seqs], device [1, max_seqs] int64
  SamplingParamsBuffer params_;
  at::Tensor out_, out_host_;         // [max_seqs] int64 tokens then [max_seqs] fp32 log-probs, as bytes
  at::Tensor out_tokens_, out_logprobs_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<at::cuda::CUDAGraph>> graphs_;
  decltype(at::cuda::graph_pool_handle()) pool_;  // shared by every graph
};

}  // namespace rlx::cuda
