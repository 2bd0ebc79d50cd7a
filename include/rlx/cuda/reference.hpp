// CPU references of the rollout kernels (kernels.hpp), in fp32 over host arrays with the
// kernels' layouts: what the [cuda] tests hold each kernel to, and, run on CPU, the check
// that the shared math (paged addressing, split merge) computes attention at all.
// (The sampler's reference is the CPU sampler itself: rlx::sample_row.)
//
//   rlx::cuda::reference::decode_attention(q, kp, vp, tables, lens, out, shape);
#pragma once

#include <cstdint>

namespace rlx::cuda::reference {

struct AttentionShape {
  int batch = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int block_size = 16, max_blocks = 0;
  float scale = 0;
};

// out[b, h] = softmax(q[b, h] . K[b, :len]) V[b, :len] over the paged pools, by splits of
// hd::kDecodeSplitTokens merged in order, as the kernel does.
void decode_attention(const float* q, const float* k_pool, const float* v_pool, const int32_t* block_tables,
                      const int32_t* context_lens, float* out, const AttentionShape& s);

void add_rms_norm(float* residual, const float* x, const float* weight, float* out, int rows, int hidden, float eps);

void silu_mul(const float* gate_up, float* out, int rows, int inter);

// With q_norm and k_norm ([head_dim] each): every q and k head RMS-normalised first (Qwen3).
void rope_append(const float* qkv, const int64_t* positions, const int64_t* slots, const float* inv_freq, float* q_out,
                 float* k_pool, float* v_pool, int rows, int q_heads, int kv_heads, int head_dim, int block_size,
                 const float* q_norm = nullptr, const float* k_norm = nullptr, float eps = 1e-6f);

}  // namespace rlx::cuda::reference
