#include "rlx/model/kv_cache.hpp"

#include <limits>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx {

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                     double scale, bool fused) {
  const int64_t B = q.size(0), Tq = q.size(1), Hq = q.size(2), D = q.size(3);
  const int64_t Tk = k.size(1), Hkv = k.size(2), G = Hq / Hkv;
  RLX_ASSERT(Hq % Hkv == 0 && k.size(0) == B && v.sizes() == k.sizes(), "attention: bad shapes");
#if RLX_TORCH_AT_LEAST(2, 1)
  if (fused && q.is_cuda()) {
    // LibTorch's fused attention (the memory-efficient kernel takes a boolean mask) never
    // materialises the [Tq, Tk] scores per head; the K/V heads are repeated for it, which
    // costs [B, Tk, Hq, D], small next to the scores.
    auto kq = G == 1 ? k : k.repeat_interleave(G, 2);
    auto vq = G == 1 ? v : v.repeat_interleave(G, 2);
    return at::scaled_dot_product_attention(q.transpose(1, 2), kq.transpose(1, 2), vq.transpose(1, 2),
                                            allowed.view({B, 1, Tq, Tk}), 0.0, false, scale)
        .transpose(1, 2);
  }
#endif
  // The G query heads of a K/V head as G * Tq rows of one product with that head's keys:
  // [B, Hkv, G * Tq, D] x [B, Hkv, D, Tk], no repeated keys, half as many (or fewer) small
  // GEMMs as one per query head.
  auto qh = q.view({B, Tq, Hkv, G, D}).permute({0, 2, 3, 1, 4}).reshape({B, Hkv, G * Tq, D});
  auto kh = k.permute({0, 2, 3, 1});
  auto vh = v.permute({0, 2, 1, 3});
  auto scores = at::matmul(qh, kh).to(at::kFloat);
  if (scale != 1.0) scores.mul_(scale);
  // The mask as an additive bias (0 or -inf) made once for every head: adding it is a vector
  // pass, where masked_fill_ with a broadcast boolean mask ran element by element on a CPU (5 ms a
  // layer on the `small` preset's step), and its backward passes the gradient through unchanged.
  const auto bias =
      at::zeros({B, 1, 1, Tq, Tk}, scores.options())
          .masked_fill_(allowed.logical_not().view({B, 1, 1, Tq, Tk}), -std::numeric_limits<float>::infinity());
  scores.view({B, Hkv, G, Tq, Tk}).add_(bias);
  auto probs = at::softmax(scores, -1).to(v.scalar_type());
  return at::matmul(probs, vh).view({B, Hkv, G, Tq, D}).permute({0, 3, 1, 2, 4}).reshape({B, Tq, Hq, D});
}

at::Tensor segment_causal_mask(const at::Tensor& segments, const at::Tensor& prefix) {
  const int64_t T = segments.size(1);
  auto causal = at::ones({T, T}, segments.options().dtype(at::kBool)).tril();
  auto same = segments.unsqueeze(2) == segments.unsqueeze(1);           // [B, T, T]
  auto valid_key = (segments != 0).unsqueeze(1);                         // [B, 1, T]
  auto eye = at::eye(T, segments.options().dtype(at::kBool)).unsqueeze(0);
  auto allowed = (causal.unsqueeze(0) & same & valid_key) | eye;
  if (prefix.defined()) {
    auto p = prefix.to(segments.device(), segments.scalar_type());
    allowed |= (p.unsqueeze(2) == segments.unsqueeze(1)) & (p != 0).unsqueeze(2);  // the shared prefix, whole
  }
  return allowed;
}

at::Tensor segment_positions(const at::Tensor& segments) {
  const int64_t B = segments.size(0), T = segments.size(1);
  auto idx = at::arange(T, segments.options().dtype(at::kLong)).expand({B, T});
  if (T == 0) return idx.contiguous();
  auto starts = at::ones({B, T}, segments.options().dtype(at::kBool));
  if (T > 1) starts.narrow(1, 1, T - 1).copy_(segments.narrow(1, 1, T - 1) != segments.narrow(1, 0, T - 1));
  auto start_of = std::get<0>(at::cummax(at::where(starts, idx, at::zeros_like(idx)), 1));
  return idx - start_of;
}

DenseKVCache::DenseKVCache(const ModelConfig& cfg, int64_t batch, int64_t capacity, at::ScalarType dtype,
                           at::Device device)
    : batch_(batch), capacity_(capacity), lengths_(static_cast<size_t>(batch), 0) {
  RLX_CHECK(batch >= 1 && capacity >= 1, "DenseKVCache: batch ({}) and capacity ({}) must be >= 1", batch, capacity);
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    // Zero-filled: a padding query may read an unused slot, which must not hold NaN.
    keys_.push_back(at::zeros({batch, capacity, cfg.num_kv_heads, cfg.head_dim}, opts));
    values_.push_back(at::zeros({batch, capacity, cfg.num_kv_heads, cfg.head_dim}, opts));
  }
}

void DenseKVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

at::Tensor DenseKVCache::begin(const ForwardInput& in) {
  const int64_t B = in.tokens.size(0), T = in.tokens.size(1);
  RLX_CHECK(B == batch_, "DenseKVCache: step has {} rows, cache has {}", B, batch_);
  at::Tensor seg = in.segments.defined() ? (in.segments != 0).to(at::kCPU)
                                         : at::ones({B, T}, at::TensorOptions().dtype(at::kBool));
  auto seg_a = seg.accessor<bool, 2>();
  new_tokens_.assign(static_cast<size_t>(B), 0);
  std::vector<int64_t> rows, slots, positions(static_cast<size_t>(B * T), 0);
  span_ = 1;
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (!seg_a[b][t]) continue;
      RLX_CHECK(n == t, "DenseKVCache: row {} has a padding token before a real one; valid tokens come first", b);
      ++n;
    }
    const int64_t len = lengths_[static_cast<size_t>(b)];
    RLX_CHECK(len + n <= capacity_, "DenseKVCache: row {} needs {} slots, capacity is {}", b, len + n, capacity_);
    new_tokens_[static_cast<size_t>(b)] = n;
    for (int64_t t = 0; t < n; ++t) {
      rows.push_back(b);
      slots.push_back(len + t);
    }
    for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(b * T + t)] = len + t;
    span_ = std::max(span_, len + n);
  }
  const auto device = keys_.front().device();
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  write_rows_ = at::tensor(rows, long_opts).to(device);
  write_slots_ = at::tensor(slots, long_opts).to(device);
  write_mask_ = seg.reshape({B * T}).to(device);
  // allowed[b, t, s]: s <= len_b + t for a real query; a padding query sees slot 0 only.
  auto pos = at::tensor(positions, long_opts).view({B, T});
  auto s = at::arange(span_, long_opts).view({1, 1, span_});
  auto allowed = s <= pos.unsqueeze(2);
  allowed = at::where(seg.unsqueeze(2), allowed, s == 0);
  allowed_ = allowed.to(device);
  return pos.to(device);
}

at::Tensor DenseKVCache::attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                double scale) {
  auto& kb = keys_.at(static_cast<size_t>(layer));
  auto& vb = values_.at(static_cast<size_t>(layer));
  const int64_t B = k.size(0), T = k.size(1);
  if (write_rows_.numel() > 0) {
    auto flat_k = k.reshape({B * T, k.size(2), k.size(3)}).index({write_mask_});
    auto flat_v = v.reshape({B * T, v.size(2), v.size(3)}).index({write_mask_});
    kb.index_put_({write_rows_, write_slots_}, flat_k.to(kb.scalar_type()));
    vb.index_put_({write_rows_, write_slots_}, flat_v.to(vb.scalar_type()));
  }
  return attention(q, kb.narrow(1, 0, span_), vb.narrow(1, 0, span_), allowed_, scale);
}

void DenseKVCache::end() {
  for (size_t b = 0; b < lengths_.size(); ++b) lengths_[b] += new_tokens_[b];
}

}  // namespace rlx
