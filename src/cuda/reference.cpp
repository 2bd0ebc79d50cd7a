#include "rlx/cuda/reference.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "rlx/cuda/attention_math.hpp"

namespace rlx::cuda::reference {

void decode_attention(const float* q, const float* k_pool, const float* v_pool, const int32_t* block_tables,
                      const int32_t* context_lens, float* out, const AttentionShape& s) {
  const int d = s.head_dim, group = s.q_heads / s.kv_heads;
  const hd::PagedLayout layout{s.block_size, s.kv_heads, d};
  std::vector<float> acc(static_cast<size_t>(d)), split_out(static_cast<size_t>(d));
  for (int b = 0; b < s.batch; ++b) {
    const int32_t* table = block_tables + static_cast<int64_t>(b) * s.max_blocks;
    const int len = context_lens[b];
    for (int h = 0; h < s.q_heads; ++h) {
      const float* qh = q + (static_cast<int64_t>(b) * s.q_heads + h) * d;
      const int kv_head = h / group;
      hd::SoftmaxState total = hd::softmax_empty();
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int split = 0; split < hd::decode_splits(len); ++split) {
        hd::SoftmaxState st = hd::softmax_empty();
        std::fill(split_out.begin(), split_out.end(), 0.0f);
        const int end = std::min(len, (split + 1) * hd::kDecodeSplitTokens);
        for (int t = split * hd::kDecodeSplitTokens; t < end; ++t) {
          const int64_t at = hd::paged_token_offset(layout, table, t, kv_head);
          float score = 0.0f;
          for (int i = 0; i < d; ++i) score += qh[i] * k_pool[at + i];
          float scale_old, p;
          hd::softmax_add(st, score * s.scale * hd::kLog2e, scale_old, p);
          for (int i = 0; i < d; ++i) split_out[i] = split_out[i] * scale_old + p * v_pool[at + i];
        }
        float sa, sb;
        hd::softmax_merge(total, st, sa, sb);
        for (int i = 0; i < d; ++i) acc[i] = acc[i] * sa + split_out[i] * sb;
      }
      float* o = out + (static_cast<int64_t>(b) * s.q_heads + h) * d;
      for (int i = 0; i < d; ++i) o[i] = total.l > 0.0f ? acc[i] / total.l : 0.0f;
    }
  }
}

void add_rms_norm(float* residual, const float* x, const float* weight, float* out, int rows, int hidden, float eps) {
  for (int r = 0; r < rows; ++r) {
    float* h = residual + static_cast<int64_t>(r) * hidden;
    double squares = 0;
    for (int i = 0; i < hidden; ++i) {
      if (x) h[i] += x[static_cast<int64_t>(r) * hidden + i];
      squares += static_cast<double>(h[i]) * h[i];
    }
    const float inv_rms = 1.0f / std::sqrt(static_cast<float>(squares / hidden) + eps);
    for (int i = 0; i < hidden; ++i) out[static_cast<int64_t>(r) * hidden + i] = weight[i] * (h[i] * inv_rms);
  }
}

void silu_mul(const float* gate_up, float* out, int rows, int inter) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate_up[r * 2 * inter + i], u = gate_up[r * 2 * inter + inter + i];
      out[r * inter + i] = g / (1.0f + std::exp(-g)) * u;
    }
}

void rope_append(const float* qkv, const int64_t* positions, const int64_t* slots, const float* inv_freq, float* q_out,
                 float* k_pool, float* v_pool, int rows, int q_heads, int kv_heads, int head_dim, int block_size,
                 const float* q_norm, const float* k_norm, float eps) {
  const int d = head_dim, half = d / 2;
  const hd::PagedLayout layout{block_size, kv_heads, d};
  std::vector<float> head(static_cast<size_t>(d));
  for (int r = 0; r < rows; ++r) {
    const float* src = qkv + static_cast<int64_t>(r) * (q_heads + 2 * kv_heads) * d;
    for (int h = 0; h < q_heads + kv_heads; ++h) {
      float* dst = h < q_heads ? q_out + (static_cast<int64_t>(r) * q_heads + h) * d
                               : k_pool + hd::paged_slot_offset(layout, slots[r], h - q_heads);
      std::copy_n(src + h * d, d, head.data());
      if (q_norm != nullptr) {
        double squares = 0;
        for (float x : head) squares += double{x} * x;
        const float inv = static_cast<float>(1.0 / std::sqrt(squares / d + eps));
        const float* w = h < q_heads ? q_norm : k_norm;
        for (int i = 0; i < d; ++i) head[static_cast<size_t>(i)] = w[i] * (head[static_cast<size_t>(i)] * inv);
      }
      for (int i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[r]) * inv_freq[i];
        const float c = std::cos(angle), s = std::sin(angle);
        const float x1 = head[static_cast<size_t>(i)], x2 = head[static_cast<size_t>(i + half)];
        dst[i] = x1 * c - x2 * s;
        dst[i + half] = x2 * c + x1 * s;
      }
    }
    for (int h = 0; h < kv_heads; ++h)
      std::copy_n(src + (q_heads + kv_heads + h) * d, d, v_pool + hd::paged_slot_offset(layout, slots[r], h));
  }
}

}  // namespace rlx::cuda::reference
