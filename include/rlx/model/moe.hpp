// Mixture-of-experts layers: the router, dropless top-k routing, the experts run on their
// own tokens, rollout routing replay, and what a forward's routing looked like.
//
// A sparse layer's router scores the experts (softmax in fp32), each token takes its top k
// (renormalised when norm_topk_prob) and its output is the gate-weighted sum of those
// experts' SwiGLU outputs, summed in the order of the top k. There is no capacity limit, so
// a token's output does not depend on the other tokens of its batch.
//
// Routing replay: ForwardInput::routing names, per token and sparse layer, the experts to
// use (the ones the rollout engine's router chose); the gate weights are then the learner's
// own router probabilities of those experts, so the router still trains. A RoutingTrace
// passed with the forward receives what each sparse layer did.
//
//   rlx::RoutingTrace trace;
//   auto logits = model->forward({.tokens = ids, .trace = &trace});
//   at::Tensor used = trace.routing();            // [B, T, S, k]: replay it later
//   auto again = model->forward({.tokens = ids, .routing = used});
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace rlx {

// How a sparse layer computes its experts: each expert's GEMMs over the rows routed to it
// (grouped; the counts are read on the host); every expert over every row weighted by a
// dense [N, E] gate (no host sync, so a CUDA graph can capture it; decode's rows); or each
// (token, slot) through its own expert's matrices, only the chosen experts' weights read
// (gathered: no host sync either; decode at a batch whose N x top-k rows are at most the
// expert count, an engine's stacked weights without adapters).
enum class MoeStrategy { automatic, grouped, dense, gathered };

// What the sparse layers of one forward did, one entry per sparse layer (ModelConfig::
// sparse_layers(); an entry is overwritten when a checkpointed layer runs again in backward).
struct RoutingTrace {
  // Inputs, set by the caller before the forward:
  bool record_experts = true;   // keep `experts` (the engine's record, replay's source)
  double aux_loss_coef = 0.0;   // > 0: backward adds coef * HF's load-balancing loss (see aux_loss())

  // Per sparse layer, filled by the forward:
  std::vector<at::Tensor> experts;     // [B, T, k] int64: the experts each token used
  std::vector<at::Tensor> counts;      // [E] fp32: (valid token, slot) routings to each expert
  std::vector<at::Tensor> mean_prob;   // [E] fp32: the router's mean probability over valid tokens
  std::vector<at::Tensor> entropy;     // scalar fp32: mean router entropy (nats) over valid tokens
  std::vector<at::Tensor> agree;       // scalar fp32: valid tokens whose router top-k set equals the used set
  at::Tensor valid_count;              // scalar: tokens that are not padding (no host sync to set)
  int64_t valid_tokens() const { return valid_count.defined() ? valid_count.item<int64_t>() : 0; }

  // The routing of the whole forward, [B, T, S, k] int64 (S sparse layers): replay's input.
  at::Tensor routing() const;
  // HF's load-balancing loss (transformers' load_balancing_loss_func, over every sparse
  // layer's valid tokens): num_experts * sum_e f_e * P_e, f_e the fraction of routings to e
  // (summed over the k slots), P_e the mean router probability. A value, without gradient.
  double aux_loss() const;
  // The most-loaded expert's routings over the mean, averaged over layers (1: balanced).
  double max_over_mean_load() const;
  double router_entropy() const;     // mean over layers
  // Fraction of (token, layer) routings where the router's own top-k set equals the used
  // experts (1 without replay).
  double agreement() const;
  bool empty() const { return counts.empty(); }
};

}  // namespace rlx
