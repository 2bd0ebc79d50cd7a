// The policy head without a [tokens, vocab] fp32 tensor: the log-prob of each target token
// (and, when asked, the entropy) from hidden states and the LM-head weight, chunk by chunk
// over tokens. Each chunk's logits are made in the compute dtype, turned into fp32 for the
// log-sum-exp and dropped; backward makes them again per chunk. Peak extra memory is one
// chunk's logits, not the step's.
//
//   auto out = rlx::token_logprobs(hidden, model.lm_head_weight(), targets, {.entropy = true});
//   out.logprobs;  // [..., ] fp32, differentiable with respect to hidden and weight
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace rlx {

struct LogprobHeadOptions {
  bool entropy = false;          // also -sum p log p per token
  int64_t chunk_tokens = 1024;   // tokens per chunk (their logits exist at once)
  // int64 flat positions (into targets' elements, on hidden's device): the head runs at these
  // only; every other position reads 0 and passes no gradient. Undefined: every position.
  at::Tensor positions;
};

struct HeadOutputs {
  at::Tensor logprobs;  // fp32, hidden's leading shape
  at::Tensor entropy;   // fp32, the same shape; undefined unless asked
};

// hidden [..., H] (any float dtype), weight [V, H] (hidden's dtype), targets int64 [...]
// in [0, V). Gradients flow to hidden and weight.
HeadOutputs token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                           const LogprobHeadOptions& options = {});

}  // namespace rlx
