// The KV-cache interface the transformer's incremental path talks to, the
// attention both paths share, and DenseKVCache (one contiguous buffer per layer).
//
// The model hands each layer's new keys/values to the cache and asks it for the
// attention output, so a cache decides both where K/V live and how attention
// reads them: the rollout engine's paged cache implements the same interface.
//
//   rlx::DenseKVCache cache(cfg, /*batch=*/2, /*capacity=*/256, at::kFloat, at::kCPU);
//   auto logits = model->forward({.tokens = prompt}, &cache);       // prefill
//   logits = model->forward({.tokens = next_token}, &cache);        // one decode step
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "rlx/model/config.hpp"

namespace rlx {

struct RoutingTrace;  // model/moe.hpp

// One forward call's input.
struct ForwardInput {
  at::Tensor tokens;     // [B, T] int64
  at::Tensor positions;  // [B, T] int64 RoPE positions; undefined: derived (per segment, or after the cache)
  at::Tensor segments;   // [B, T] integer; undefined: all 1. 0 marks padding. A token attends only to
                         // earlier tokens of its own segment, so several sequences can be packed in a row.
  at::Tensor prefix;     // [B, T] integer; undefined: all 0. A segment of the same row whose tokens this
                         // token also attends to, all of them: a prompt that several sequences share,
                         // packed once, each sequence's own tokens a segment after it. Needs `positions`
                         // (the own tokens continue the prefix's) and the full-sequence path (no cache).
  // Mixture-of-experts models (model/moe.hpp):
  at::Tensor routing;    // [B, T, S, k] integer, S = the sparse layers: the experts each token uses in
                         // each of them (rollout routing replay); undefined, or a token's row of -1:
                         // the router chooses.
  RoutingTrace* trace = nullptr;  // receives what the sparse layers did
};

// Scaled dot-product attention with grouped-query heads.
// q [B, Tq, Hq, D]; k, v [B, Tk, Hkv, D]; allowed [B, Tq, Tk] bool (every row must allow at
// least one key). Scores and softmax in fp32; returns [B, Tq, Hq, D] in q's dtype.
// `fused` (the full-sequence path): on CUDA with LibTorch >= 2.1, LibTorch's fused kernel,
// which never holds the [Tq, Tk] scores (training memory). The cached paths keep the plain
// one: for their shapes (a few queries against a gathered context) the fused kernel with a
// mask measured 4x slower per decode step (docs/PERF.md).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                     double scale, bool fused = false);

// The mask of the full-sequence path: causal, within a segment, padding masked
// (a padding query sees only itself, so no row is empty); with `prefix` (ForwardInput),
// also every token of the segment each query names there.
at::Tensor segment_causal_mask(const at::Tensor& segments, const at::Tensor& prefix = {});
// Positions that restart at 0 at each segment boundary.
at::Tensor segment_positions(const at::Tensor& segments);

class KVCache {
 public:
  virtual ~KVCache() = default;
  // Before the layers run: the step's tokens and segments (0 = padding; in a cache
  // step the valid tokens of a row come first). Returns the RoPE positions the step
  // uses when the input gives none.
  virtual at::Tensor begin(const ForwardInput& in) = 0;
  // Stores `layer`'s new keys/values ([B, T, Hkv, D], after RoPE) and returns the
  // attention output [B, T, Hq, D] over everything the row has cached.
  virtual at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale) = 0;
  // Optional, for caches that rotate and store keys themselves (the paged cache on CUDA,
  // one kernel): `qkv` [B, T, (q_heads + 2 Hkv) * D] is the fused projection's output before
  // RoPE (and before `norm`, Qwen3's per-head q/k RMSNorm, when its weights are defined),
  // `inv_freq` the model's fp32 RoPE frequencies. Returns attend()'s output, or an undefined
  // tensor when this cache cannot (the caller normalises, rotates and calls attend()).
  struct QkNorm {
    at::Tensor q_weight, k_weight;  // [D] each, or undefined: no norm
    double eps = 1e-6;
  };
  virtual at::Tensor attend_rotating(int64_t layer, const at::Tensor& qkv, const at::Tensor& inv_freq, int64_t q_heads,
                                     double scale, const QkNorm& norm) {
    return {};
  }
  // After the last layer: the step's tokens become part of the cache.
  virtual void end() = 0;
  // Whether the planned step is one a CUDA graph replays (the paged cache's static decode
  // steps): its forward must not read anything back to the host, so sparse layers route
  // without the grouped strategy's host read of the counts.
  virtual bool graph_step() const { return false; }
};

// A [batch, capacity] cache per layer; row b holds one sequence.
class DenseKVCache final : public KVCache {
 public:
  DenseKVCache(const ModelConfig& cfg, int64_t batch, int64_t capacity, at::ScalarType dtype, at::Device device);

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  // Tokens cached in row b.
  int64_t length(int64_t row) const { return lengths_.at(static_cast<size_t>(row)); }
  void reset();

  at::Tensor begin(const ForwardInput& in) override;
  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    double scale) override;
  void end() override;

 private:
  int64_t batch_, capacity_;
  std::vector<at::Tensor> keys_, values_;  // per layer [B, C, Hkv, D]
  std::vector<int64_t> lengths_;
  // Per step:
  std::vector<int64_t> new_tokens_;
  at::Tensor write_rows_, write_slots_, write_mask_, allowed_;
  int64_t span_ = 0;  // slots the step's attention reads
};

}  // namespace rlx
