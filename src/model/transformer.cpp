#include "rlx/model/transformer.hpp"

#include <unistd.h>

#include <c10/core/GradMode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <cmath>
#include <numbers>
#include <thread>
#include <tuple>

#include "rlx/core/device_copy.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/model/fused_ops.hpp"
#include "model/modules.hpp"
#if RLX_WITH_CUDA
#include "cuda/ops.hpp"
#endif

namespace rlx {

at::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::float32: return at::kFloat;
    case DType::bfloat16: return at::kBFloat16;
    case DType::float16: return at::kHalf;
  }
  RLX_ASSERT(false, "unknown DType");
  return at::kFloat;
}

DType dtype_from_scalar_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::float32;
    case at::kBFloat16: return DType::bfloat16;
    case at::kHalf: return DType::float16;
    default: throw Error(fmt::format("unsupported model dtype {}", c10::toString(t)));
  }
}

at::Tensor rope_inv_freq(const ModelConfig& cfg) {
  // As HF computes it: 1 / theta^(2i/d) in fp32.
  auto idx = at::arange(0, cfg.head_dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat);
  auto inv = 1.0 / at::pow(cfg.rope_theta, idx / static_cast<double>(cfg.head_dim));
  const auto& rs = cfg.rope_scaling;
  if (rs.type == RopeType::linear) {
    inv = inv / rs.factor;
  } else if (rs.type == RopeType::llama3) {
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor, high_wavelen = old_ctx / rs.high_freq_factor;
    auto wavelen = 2 * std::numbers::pi / inv;
    auto scaled = at::where(wavelen > low_wavelen, inv / rs.factor, inv);
    auto smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
    inv = at::where(medium, smoothed, scaled);
  }
  return inv.contiguous();
}

std::pair<at::Tensor, at::Tensor> rope_tables(const ModelConfig& cfg, const at::Tensor& inv_freq,
                                              const at::Tensor& positions) {
  auto freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq.to(positions.device());  // [B, T, D/2]
  auto emb = at::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}


namespace {
// Attention of the full-sequence path: q [B, T, Hq, D], k and v [B, T, Hkv, D].
at::Tensor sequence_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ForwardState& st,
                              double scale) {
  if (!st.varlen.defined()) return attention(q, k, v, st.mask, scale, /*fused=*/true);
  const int64_t B = q.size(0), T = q.size(1), D = q.size(3);
  return varlen_attention(q.reshape({B * T, q.size(2), D}), k.reshape({B * T, k.size(2), D}),
                          v.reshape({B * T, v.size(2), D}), st.varlen, scale)
      .view({B, T, q.size(2), D});
}

}  // namespace

Transformer::Transformer(const ModelConfig& cfg, at::ScalarType dtype, at::Device device)
    : cfg_(cfg), dtype_(dtype), device_(device) {
  cfg_.validate();
  dtype_from_scalar_type(dtype);  // rejects non-float dtypes
  if (device.is_cpu()) {  // a shape that cannot fit is refused before the allocator is asked
    const double need = static_cast<double>(cfg_.num_parameters()) * static_cast<double>(c10::elementSize(dtype));
    const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
    RLX_CHECK(have <= 0 || need <= have, "the model's {} parameters need {:.1f} GB in {}, more than this machine's {:.1f} GB of memory",
              cfg_.num_parameters(), need / 1e9, c10::toString(dtype), have / 1e9);
  }
  auto o = at::TensorOptions().dtype(dtype).device(device);
  body_ = register_module("model", std::make_shared<detail::Body>(cfg_, o));
  if (!cfg_.tie_word_embeddings)
    lm_head_ = register_module("lm_head", std::make_shared<detail::Projection>(cfg_.hidden_size, cfg_.vocab_size, false, o));
  inv_freq_ = register_buffer("inv_freq", rope_inv_freq(cfg_).to(device));
}

ForwardState Transformer::begin_forward(const ForwardInput& in, KVCache* cache) {
  RLX_CHECK(in.tokens.defined() && in.tokens.dim() == 2, "forward: tokens must be a [batch, time] tensor");
  ForwardState st;
  st.batch = in.tokens.size(0);
  st.time = in.tokens.size(1);
  st.cache = cache;
  st.lora_key = lora_forwards_++;
  st.train = c10::GradMode::is_enabled();
  st.tokens = to_device_async(in.tokens, device_).to(at::kLong);
  if (in.segments.defined())
    RLX_CHECK(in.segments.sizes() == in.tokens.sizes(), "forward: segments shape {} differs from tokens shape {}",
              in.segments.sizes(), in.tokens.sizes());
  if (in.positions.defined())
    RLX_CHECK(in.positions.sizes() == in.tokens.sizes(), "forward: positions shape {} differs from tokens shape {}",
              in.positions.sizes(), in.tokens.sizes());
  if (in.prefix.defined())
    RLX_CHECK(in.prefix.sizes() == in.tokens.sizes() && in.segments.defined() && in.positions.defined() && !cache,
              "forward: a shared prefix (prefix {}) needs segments and positions of the tokens' shape {} and no cache",
              in.prefix.sizes(), in.tokens.sizes());
  if (in.tokens.is_cpu()) {
    // A token id outside the vocabulary would index out of bounds in the embedding. (Inputs
    // already on a device are the engine's own and skip this host read.)
    const auto& t = in.tokens;
    auto lo = t.numel() ? t.min().item<int64_t>() : 0, hi = t.numel() ? t.max().item<int64_t>() : 0;
    RLX_CHECK(lo >= 0 && hi < cfg_.vocab_size, "forward: token ids must be in [0, {}), got range [{}, {}]",
              cfg_.vocab_size, lo, hi);
  }

  at::Tensor positions;
  if (cache) {
    positions = cache->begin(in);
  } else {
    // Segments may come from the host (the learner's): the varlen layout is read there, and
    // the device copy made only where positions or a mask need it.
    const bool varlen = flash_varlen_supported(device_, dtype_, cfg_.head_dim);
    at::Tensor segments;
    if (!in.positions.defined() || !varlen)
      segments = in.segments.defined() ? to_device_async(in.segments, device_)
                                       : at::ones({st.batch, st.time}, st.tokens.options());
    if (!in.positions.defined()) positions = segment_positions(segments);
    if (!varlen) {
      st.mask = segment_causal_mask(segments, to_device_async(in.prefix, device_));
    } else if (in.segments.defined()) {
      st.varlen = varlen_from_segments(in.segments, device_, in.prefix);
    } else {
      const std::vector<int64_t> rows(static_cast<size_t>(st.batch), st.time);
      st.varlen = varlen_seqs(rows, rows, device_);
    }
  }
  if (in.positions.defined()) positions = to_device_async(in.positions, device_).to(at::kLong);
  if (cfg_.num_experts > 0) begin_routing(in, st);
  st.positions = positions;
  if (!cache) rope_of(st);  // a sharded learner's blocks save them for their backward
  return st;
}

const ForwardState& Transformer::rope_of(const ForwardState& st) const {
  if (!st.cos.defined()) {
    auto [cos, sin] = rope_tables(cfg_, inv_freq_, st.positions);
    st.cos = cos.to(dtype_);
    st.sin = sin.to(dtype_);
  }
  return st;
}

void Transformer::begin_routing(const ForwardInput& in, ForwardState& st) const {
  if (in.segments.defined()) st.valid = (to_device_async(in.segments, device_) != 0).reshape({-1});
  if (in.routing.defined()) {
    const int64_t slots = static_cast<int64_t>(cfg_.sparse_layers().size());
    RLX_CHECK(in.routing.dim() == 4 && in.routing.size(0) == st.batch && in.routing.size(1) == st.time &&
                  in.routing.size(2) == slots && in.routing.size(3) == cfg_.num_experts_per_tok,
              "forward: routing has shape {}; this model's is [{}, {}, {} sparse layers, top {}]", in.routing.sizes(),
              st.batch, st.time, slots, cfg_.num_experts_per_tok);
    st.routing = to_device_async(in.routing, device_).to(at::kLong);
  }
  st.trace = in.trace;
  if (st.trace) {
    st.trace->valid_count = st.valid.defined() ? st.valid.sum() : at::scalar_tensor(st.batch * st.time, at::kLong);
  }
}

at::Tensor Transformer::sparse_mlp(const detail::Block& blk, const at::Tensor& x, const ForwardState& st,
                                   uint64_t site) const {
  at::Tensor forced;
  if (st.routing.defined()) forced = st.routing.select(2, blk.sparse_slot);
  auto strategy = moe_strategy_;
  const bool lora = lora_on();
  // Decode on CUDA: no host sync, so the step's graph can be captured; the chosen experts
  // alone while the batch's routings are fewer than the experts, else every expert.
  if (strategy == MoeStrategy::automatic && x.is_cuda() && st.cache && (st.time == 1 || st.cache->graph_step())) {
    const bool gather = blk.moe->gate_up_all.defined() && !lora && !blk.moe->experts[0]->gate_proj->lora_A &&
                        st.batch * st.time * cfg_.num_experts_per_tok <= cfg_.num_experts;
    strategy = gather ? MoeStrategy::gathered : MoeStrategy::dense;
  }
  detail::LoraHook hook = [&](const at::Tensor& y, std::initializer_list<const detail::Projection*> ps,
                              const at::Tensor& in, uint64_t s) { return lora ? with_lora(y, ps, in, st, s) : y; };
  return detail::moe_forward(*blk.moe, cfg_, x, st.valid, forced, st.trace, blk.sparse_slot, strategy, hook, site);
}

at::Tensor Transformer::qk_normed(const detail::Attention& att, const at::Tensor& qkv, const ForwardState& st) const {
  if (!att.q_norm) return qkv;
  const int64_t B = st.batch, T = st.time, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  auto parts = qkv.split_with_sizes({Hq * D, Hkv * D, Hkv * D}, -1);
  auto q = (*att.q_norm)(parts[0].reshape({B, T, Hq, D})).reshape({B, T, Hq * D});
  auto k = (*att.k_norm)(parts[1].reshape({B, T, Hkv, D})).reshape({B, T, Hkv * D});
  return at::cat({q, k, parts[2]}, -1);
}

at::Tensor Transformer::embed(const ForwardState& st) { return at::embedding(body_->embed_tokens->weight, st.tokens); }

void Transformer::fuse_projections() {
  if (fused_) return;
  c10::NoGradGuard no_grad;
  for (auto& blk : body_->blocks) {
    auto& a = *blk->self_attn;
    a.qkv_weight = detail::fuse({&a.q_proj->weight, &a.k_proj->weight, &a.v_proj->weight});
    if (cfg_.qkv_bias) a.qkv_bias = detail::fuse({&a.q_proj->bias, &a.k_proj->bias, &a.v_proj->bias});
    if (blk->moe) {
      // Every expert's gate and up rows in one tensor, and every down, each expert's views of them.
      auto& moe = *blk->moe;
      std::vector<at::Tensor*> gate_up, down;
      for (auto& e : moe.experts) {
        gate_up.insert(gate_up.end(), {&e->gate_proj->weight, &e->up_proj->weight});
        down.push_back(&e->down_proj->weight);
      }
      const int64_t E = cfg_.num_experts, I = cfg_.moe_intermediate_size, H = cfg_.hidden_size;
      moe.gate_up_all = detail::fuse(gate_up).view({E, 2 * I, H});
      moe.down_all = detail::fuse(down).view({E, H, I});
      for (int64_t e = 0; e < E; ++e) moe.experts[static_cast<size_t>(e)]->gate_up_weight = moe.gate_up_all[e];
      continue;
    }
    auto& m = *blk->mlp;
    m.gate_up_weight = detail::fuse({&m.gate_proj->weight, &m.up_proj->weight});
    if (cfg_.mlp_bias) m.gate_up_bias = detail::fuse({&m.gate_proj->bias, &m.up_proj->bias});
  }
  fused_ = true;
}

namespace {
// A fused (no-grad) layer's projection: on a GPU cuda::linear (cuBLAS, or with RLX_GEMV=1 the
// engine's GEMV kernel at small batch, with RLX_DECODE_GEMM=1 its tensor-core GEMM to 256 rows).
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
#if RLX_WITH_CUDA
  if (x.is_cuda()) return cuda::linear(x, w, b);
#endif
  return at::linear(x, w, b);
}
}  // namespace

at::Tensor Transformer::fused_layer(const detail::Block& blk, int64_t index, const at::Tensor& h_in,
                                    const ForwardState& st) {
  const int64_t B = st.batch, T = st.time, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto& att = *blk.self_attn;
  // Unmerged adapters add to each GEMM's output, as in layer().
  const bool lora = lora_on();
  const uint64_t site = static_cast<uint64_t>(index) * 4;
  // h_res: the residual stream with the previous layer's MLP output added (that output waits in
  // st.pending to be added by this norm).
  at::Tensor x, qkv, h_res = h_in;
#if RLX_WITH_CUDA
  // rlx's GEMV at small batch (RLX_GEMV=1) or its decode GEMM (RLX_DECODE_GEMM=1): the add and
  // norm inside the qkv projection.
  const bool fold = h_in.is_cuda() && !lora && (cuda::gemv_enabled() || cuda::decode_gemm_enabled());
  if (fold) {
    const auto& norm = *blk.input_layernorm;
    std::tie(qkv, h_res) = cuda::norm_linear(h_in, st.pending, norm.weight, norm.eps, att.qkv_weight, att.qkv_bias);
    if (qkv.defined())
      st.pending = at::Tensor();
    else
      h_res = h_in;
  }
  if (!qkv.defined() && h_in.is_cuda() && h_in.scalar_type() == blk.input_layernorm->weight.scalar_type()) {
    // The previous layer's MLP output added here, with this norm: one kernel.
    const auto& norm = *blk.input_layernorm;
    if (st.pending.defined()) {
      x = cuda::add_rms_norm(const_cast<at::Tensor&>(h_in), st.pending, norm.weight, norm.eps);
      st.pending = at::Tensor();
    } else {
      x = cuda::rms_norm(h_in, norm.weight, norm.eps);
    }
  }
#endif
  if (!qkv.defined()) {
    if (!x.defined()) {
      if (st.pending.defined()) {  // a CUDA norm weight of another dtype: the sum in tensor ops
        h_res = h_in + st.pending;
        st.pending = at::Tensor();
      }
      x = (*blk.input_layernorm)(h_res);
    }
    qkv = project(x, att.qkv_weight, att.qkv_bias);
    if (lora) qkv = with_lora(qkv, {att.q_proj.get(), att.k_proj.get(), att.v_proj.get()}, x, st, site);
  }
  // A cache that rotates and stores keys itself (q/k norms + RoPE + KV append in one kernel)
  // takes qkv as it is.
  KVCache::QkNorm qk_norm;
  if (att.q_norm) qk_norm = {.q_weight = att.q_norm->weight, .k_weight = att.k_norm->weight, .eps = att.q_norm->eps};
  at::Tensor a = st.cache ? st.cache->attend_rotating(index, qkv, inv_freq_, Hq, scale, qk_norm) : at::Tensor();
  if (!a.defined()) {
    qkv = qk_normed(att, qkv, st);
    auto parts = qkv.split_with_sizes({Hq * D, Hkv * D, Hkv * D}, -1);
    rope_of(st);
    auto q = fused::rope(parts[0].view({B, T, Hq, D}), st.cos, st.sin);
    auto k = fused::rope(parts[1].view({B, T, Hkv, D}), st.cos, st.sin);
    auto v = parts[2].view({B, T, Hkv, D});
    a = st.cache ? st.cache->attend(index, q, k, v, scale) : sequence_attention(q, k, v, st, scale);
  }
  a = a.reshape({B, T, Hq * D});
  auto attn_out = project(a, att.o_proj->weight, att.o_proj->bias);
  if (lora) attn_out = with_lora(attn_out, {att.o_proj.get()}, a, st, site + 1);
  at::Tensor h, normed;
#if RLX_WITH_CUDA
  if (fold && !blk.moe) {
    // The add and norm inside the gate/up projection, SiLU-mul inside the down projection.
    const auto& mlp = *blk.mlp;
    const auto& post = *blk.post_attention_layernorm;
    at::Tensor gu;
    std::tie(gu, h) = cuda::norm_linear(attn_out, h_res, post.weight, post.eps, mlp.gate_up_weight, mlp.gate_up_bias);
    if (gu.defined()) {
      st.pending = cuda::silu_linear(gu, mlp.down_proj->weight, mlp.down_proj->bias);
      if (!st.pending.defined()) st.pending = project(cuda::silu_mul(gu), mlp.down_proj->weight, mlp.down_proj->bias);
      return h;  // st.pending added by the next norm
    }
  }
  if (h_in.is_cuda()) {
    // h = h_res + attn_out, in attn_out's storage; normed = RMSNorm(h): one kernel.
    normed =
        cuda::add_rms_norm(attn_out, h_res, blk.post_attention_layernorm->weight, blk.post_attention_layernorm->eps);
    h = attn_out;
    if (blk.moe) {
      st.pending = sparse_mlp(blk, normed, st, site);  // added by the next norm
      return h;
    }
    const auto& mlp = *blk.mlp;
    auto gu = project(normed, mlp.gate_up_weight, mlp.gate_up_bias);
    if (lora) gu = with_lora(gu, {mlp.gate_proj.get(), mlp.up_proj.get()}, normed, st, site + 2);
    if (fold) {  // SiLU-mul inside the down projection where rlx's GEMV or decode GEMM takes it
      st.pending = cuda::silu_linear(gu, mlp.down_proj->weight, mlp.down_proj->bias);
      if (st.pending.defined()) return h;  // added by the next norm
    }
    auto act = cuda::silu_mul(gu);
    st.pending = project(act, mlp.down_proj->weight, mlp.down_proj->bias);  // added by the next norm
    if (lora) st.pending = with_lora(st.pending, {mlp.down_proj.get()}, act, st, site + 3);
    return h;
  }
#endif
  h = h_res + attn_out;
  normed = (*blk.post_attention_layernorm)(h);
  if (blk.moe) return h + sparse_mlp(blk, normed, st, site);
  const auto& mlp = *blk.mlp;
  auto gu = at::linear(normed, mlp.gate_up_weight, mlp.gate_up_bias);
  if (lora) gu = with_lora(gu, {mlp.gate_proj.get(), mlp.up_proj.get()}, normed, st, site + 2);
  auto act = fused::silu_mul(gu);
  auto down = (*mlp.down_proj)(act);
  if (lora) down = with_lora(down, {mlp.down_proj.get()}, act, st, site + 3);
  return h + down;
}

at::Tensor Transformer::layer(int64_t index, const at::Tensor& h_in, const ForwardState& st) {
  RLX_ASSERT(index >= 0 && index < static_cast<int64_t>(body_->blocks.size()), "layer index out of range");
  const int64_t B = st.batch, T = st.time, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto& blk = *body_->blocks[static_cast<size_t>(index)];
  if (fused_ && !c10::GradMode::is_enabled()) return fused_layer(blk, index, h_in, st);
  const auto& att = *blk.self_attn;
  // q, k and v in one GEMM, gate and up in another (their weights joined for it), and the
  // attention scale folded into the rotation of q where no cache takes it.
  // Adapters (trained mode) add to each GEMM's output; `site` keys their dropout masks.
  const bool lora = lora_on();
  const uint64_t site = static_cast<uint64_t>(index) * 4;
  auto x = (*blk.input_layernorm)(h_in);
  auto qkv = at::linear(x, fused::join_rows({att.q_proj->weight, att.k_proj->weight, att.v_proj->weight}),
                        fused::join_rows({att.q_proj->bias, att.k_proj->bias, att.v_proj->bias}));
  if (lora) qkv = with_lora(qkv, {att.q_proj.get(), att.k_proj.get(), att.v_proj.get()}, x, st, site);
  qkv = qk_normed(att, qkv, st);
  auto parts = qkv.split_with_sizes({Hq * D, Hkv * D, Hkv * D}, -1);
  rope_of(st);
  auto q = fused::rope(parts[0].view({B, T, Hq, D}), st.cos, st.sin, st.cache ? 1.0 : scale);
  auto k = fused::rope(parts[1].view({B, T, Hkv, D}), st.cos, st.sin);
  auto v = parts[2].view({B, T, Hkv, D});
  auto a = (st.cache ? st.cache->attend(index, q, k, v, scale) : sequence_attention(q, k, v, st, 1.0))
               .reshape({B, T, Hq * D});
  auto o = (*att.o_proj)(a);
  if (lora) o = with_lora(o, {att.o_proj.get()}, a, st, site + 1);
  auto h = h_in + o;
  auto normed = (*blk.post_attention_layernorm)(h);
  if (blk.moe) return h + sparse_mlp(blk, normed, st, site);
  const auto& mlp = *blk.mlp;
  auto gu = at::linear(normed, fused::join_rows({mlp.gate_proj->weight, mlp.up_proj->weight}),
                       fused::join_rows({mlp.gate_proj->bias, mlp.up_proj->bias}));
  if (lora) gu = with_lora(gu, {mlp.gate_proj.get(), mlp.up_proj.get()}, normed, st, site + 2);
  auto act = fused::silu_mul(gu);
  auto down = (*mlp.down_proj)(act);
  if (lora) down = with_lora(down, {mlp.down_proj.get()}, act, st, site + 3);
  return h + down;
}

at::Tensor Transformer::with_lora(const at::Tensor& y, std::initializer_list<const detail::Projection*> projections,
                                  const at::Tensor& x, const ForwardState& st, uint64_t site) const {
  bool any = false;
  for (const auto* p : projections) any = any || p->lora_A != nullptr;
  if (!any) return y;
  at::Tensor in = x;
  if (lora_.dropout > 0 && st.train) {
    // Inverted dropout, its mask drawn on the host by a generator seeded from (seed, forward
    // key, layer and site): the same mask when a checkpointed block runs again in backward.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(
        hash_name(fmt::format("lora-dropout/{}/{}", st.lora_key, site), lora_seed_));
    const double keep = 1.0 - lora_.dropout;
    auto mask = at::empty(x.sizes(), at::TensorOptions().dtype(at::kFloat)).bernoulli_(keep, gen).div_(keep);
    in = x * to_device_async(mask.to(x.scalar_type()), x.device());
  }
  const double s = lora_.scale();
  std::vector<at::Tensor> parts;
  for (const auto* p : projections) {
    if (p->lora_A) {
      parts.push_back(at::linear(at::linear(in, p->lora_A->weight), p->lora_B->weight) * s);
    } else {
      auto shape = y.sizes().vec();
      shape.back() = p->weight.size(0);
      parts.push_back(at::zeros(shape, y.options()));
    }
  }
  return y + (parts.size() == 1 ? parts[0] : at::cat(parts, -1));
}

void Transformer::add_lora(const LoraSpec& spec, LoraMode mode) {
  spec.validate();
  RLX_CHECK(spec.enabled(), "add_lora: the rank must be at least 1");
  RLX_CHECK(!lora_.enabled(), "add_lora: the model already has adapters");
  lora_ = spec;
  lora_mode_ = mode;
  c10::NoGradGuard no_grad;
  for (auto& blk : body_->blocks) {
    for (const auto& t : spec.targets) {
      for (auto* p : blk->projections(t)) {
        p->add_lora(spec.rank);
        if (mode == LoraMode::merged) p->base = p->weight.detach().clone();
      }
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::lora_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : named_parameters(/*recurse=*/true))
    if (is_lora_parameter(item.key())) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::sync_parameters() const {
  return lora_.enabled() ? lora_parameters() : hf_parameters();
}

void Transformer::init_lora(uint64_t seed) { init_lora_weights(lora_parameters(), seed); }

void init_lora_weights(const std::vector<std::pair<std::string, at::Tensor>>& adapters, uint64_t seed) {
  c10::NoGradGuard no_grad;
  for (const auto& [name, p] : adapters) {
    if (name.find(".lora_B.") != std::string::npos) {
      p.zero_();
      continue;
    }
    // kaiming_uniform_(a = sqrt(5)) as PEFT draws it: bound sqrt(6 / ((1 + 5) fan_in)).
    const double bound = 1.0 / std::sqrt(static_cast<double>(p.size(1)));
    auto host = at::empty({p.numel()}, at::TensorOptions().dtype(at::kFloat));
    float* data = host.data_ptr<float>();
    RngStream rng(seed, hash_name(name));
    for (int64_t i = 0; i < p.numel(); ++i) data[i] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
    p.copy_(host.view(p.sizes()));
  }
}

int64_t Transformer::merge_lora() {
  RLX_CHECK(lora_.enabled() && lora_mode_ == LoraMode::merged, "merge_lora: the model has no merged adapters");
  c10::NoGradGuard no_grad;
  int64_t bytes = 0;
  const double s = lora_.scale();
  for (auto& blk : body_->blocks) {
    for (const auto& t : lora_.targets) {
      for (auto* p : blk->projections(t)) {
        // One pass writing the weight (base + s * B A, GEMM-accumulated in fp32 on every
        // device LibTorch has); the kept base is not written.
        at::addmm_out(p->weight, p->base, p->lora_B->weight, p->lora_A->weight, /*beta=*/1, /*alpha=*/s);
        bytes += p->weight.numel() * static_cast<int64_t>(p->weight.element_size());
      }
    }
  }
  return bytes;
}

at::Tensor Transformer::end_forward(const at::Tensor& h, const ForwardState& st) {
  if (st.cache) st.cache->end();
#if RLX_WITH_CUDA
  if (st.pending.defined()) {  // the last layer's MLP output, added with the final norm
    auto out = cuda::add_rms_norm(const_cast<at::Tensor&>(h), st.pending, body_->norm->weight, body_->norm->eps);
    st.pending = at::Tensor();
    return out;
  }
#endif
  return (*body_->norm)(h);
}

at::Tensor Transformer::forward_hidden(const ForwardInput& in, KVCache* cache) {
  auto st = begin_forward(in, cache);
  auto h = embed(st);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) h = layer(l, h, st);
  return end_forward(h, st);
}

const at::Tensor& Transformer::lm_head_weight() const {
  return lm_head_ ? lm_head_->weight : body_->embed_tokens->weight;
}

at::Tensor Transformer::logits(const at::Tensor& hidden) {
  return lm_head_ ? (*lm_head_)(hidden) : at::linear(hidden, body_->embed_tokens->weight);
}

void Transformer::init_weights(uint64_t seed, bool on_device) {
  c10::NoGradGuard no_grad;
  if (on_device) at::manual_seed(seed);
  for (auto& [name, p] : hf_parameters()) {
    const bool is_norm = name.find("norm.weight") != std::string::npos;
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_norm) {
      p.fill_(1.0);
      continue;
    }
    if (is_bias) {
      p.zero_();
      continue;
    }
    if (on_device) {
      p.normal_(0.0, cfg_.initializer_range);
      continue;
    }
    auto host = at::empty({p.numel()}, at::TensorOptions().dtype(at::kFloat));
    float* data = host.data_ptr<float>();
    // Fixed-size chunks, each with its own stream: the values do not depend on the thread count.
    // Threads of their own, every core: a role's LibTorch pool may have one thread (a GPU
    // learner's did: 494M draws took 30 s, the whole start of a run).
    constexpr int64_t kChunk = 1 << 16;
    const uint64_t base = hash_name(name);
    const int64_t n = p.numel(), chunks = (n + kChunk - 1) / kChunk;
    const float std = static_cast<float>(cfg_.initializer_range);
    std::atomic<int64_t> next{0};
    auto fill = [&] {
      for (int64_t c = next++; c < chunks; c = next++) {
        RngStream stream(seed, base + static_cast<uint64_t>(c));
        const int64_t lo = c * kChunk, len = std::min(kChunk, n - lo);
        stream.fill_normal(data + lo, static_cast<size_t>(len), 0.0f, std);
      }
    };
    const auto helpers = std::min<int64_t>(chunks, std::max(1u, std::thread::hardware_concurrency())) - 1;
    std::vector<std::thread> threads;
    for (int64_t t = 0; t < helpers; ++t) threads.emplace_back(fill);
    fill();
    for (auto& t : threads) t.join();
    p.copy_(host.view(p.sizes()));
  }
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::hf_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : named_parameters(/*recurse=*/true))
    if (!is_lora_parameter(item.key())) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace rlx
