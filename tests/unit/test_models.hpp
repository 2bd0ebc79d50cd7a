// Small, oddly sized model configurations for tests (sizes that do not divide evenly,
// so sharding needs padding).
#pragma once

#include "rlx/model/config.hpp"

namespace rlx::test {

struct ModelShape {
  int64_t vocab = 19, hidden = 8, layers = 2, heads = 2, kv_heads = 1, head_dim = 4, intermediate = 12;
  bool qwen2 = false;  // q/k/v biases
  bool tied = true;
};

inline ModelConfig test_model(const ModelShape& s) {
  ModelConfig c;
  c.arch = s.qwen2 ? Arch::qwen2 : Arch::llama;
  c.qkv_bias = s.qwen2;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.intermediate_size = s.intermediate;
  c.tie_word_embeddings = s.tied;
  c.max_position_embeddings = 64;
  return c;
}

}  // namespace rlx::test
