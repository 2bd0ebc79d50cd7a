// Sparse layers: routing, the experts over their own rows, replay, and the routing trace.
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/modules.hpp"
#include "rlx/core/torch_compat.hpp"
#if RLX_WITH_CUDA
#include "cuda/ops.hpp"
#endif

namespace rlx {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

at::Tensor RoutingTrace::routing() const {
  RLX_CHECK(!experts.empty(), "RoutingTrace::routing: the forward recorded no experts");
  return at::stack(experts, 2);
}

namespace {
// Sum over layers of a per-layer [E] statistic, and the layer count.
at::Tensor layer_sum(const std::vector<at::Tensor>& per_layer) {
  at::Tensor s = per_layer.at(0).to(at::kCPU, at::kDouble).clone();
  for (size_t i = 1; i < per_layer.size(); ++i) s += per_layer[i].to(at::kCPU, at::kDouble);
  return s;
}
double layer_mean(const std::vector<at::Tensor>& scalars) {
  if (scalars.empty()) return 0.0;
  return layer_sum(scalars).item<double>() / static_cast<double>(scalars.size());
}
}  // namespace

double RoutingTrace::aux_loss() const {
  const int64_t valid = valid_tokens();
  if (empty() || valid == 0) return 0.0;
  const double rows = static_cast<double>(counts.size()) * static_cast<double>(valid);
  auto f = layer_sum(counts) / rows;                                      // routings per expert, over the k slots
  auto p = layer_sum(mean_prob) / static_cast<double>(mean_prob.size());  // mean probability
  return static_cast<double>(f.size(0)) * (f * p).sum().item<double>();
}

double RoutingTrace::max_over_mean_load() const {
  double sum = 0;
  for (const auto& c : counts) {
    auto d = c.to(at::kCPU, at::kDouble);
    const double mean = d.mean().item<double>();
    sum += mean > 0 ? d.max().item<double>() / mean : 1.0;
  }
  return counts.empty() ? 1.0 : sum / static_cast<double>(counts.size());
}

double RoutingTrace::router_entropy() const { return layer_mean(entropy); }
double RoutingTrace::agreement() const { return agree.empty() ? 1.0 : layer_mean(agree); }

namespace detail {
namespace {

// Passes a sparse layer's output through unchanged and, in backward, adds the gradient of
// coef * HF's load-balancing loss to the layer's router probabilities. The loss couples
// every sparse layer (its routing fractions are over all of them), and by the time backward
// reaches a layer the forward has filled the trace's counts of all of them. This keeps the
// loss out of the block's outputs, so a sharded or checkpointed block needs nothing else.
struct AuxLossGrad : torch::autograd::Function<AuxLossGrad> {
  static Variable forward(AutogradContext* ctx, Variable y, Variable probs, const RoutingTrace* trace, Variable valid) {
    ctx->saved_data["trace"] = reinterpret_cast<int64_t>(trace);
    ctx->saved_data["valid"] = valid;
    return y.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto* trace = reinterpret_cast<const RoutingTrace*>(ctx->saved_data["trace"].toInt());
    const auto valid = ctx->saved_data["valid"].toTensor();
    const double rows = static_cast<double>(trace->counts.size()) * static_cast<double>(std::max<int64_t>(1, trace->valid_tokens()));
    at::Tensor f = trace->counts.at(0).clone();
    for (size_t i = 1; i < trace->counts.size(); ++i) f += trace->counts[i];
    f = f / rows;
    // d(E * sum_e f_e P_e) / d p[t, e] = E * f_e / rows, for valid tokens t.
    const double scale = trace->aux_loss_coef * static_cast<double>(f.size(0)) / rows;
    auto g = (f * scale).unsqueeze(0) * valid.unsqueeze(1);
    return {grad[0], g, Variable(), Variable()};
  }
};

// The expert's SwiGLU over its rows x [n, H], with its adapters (gate and up as one GEMM).
at::Tensor run_expert(const Mlp& m, const at::Tensor& x, const LoraHook& lora, uint64_t site) {
  auto w = m.gate_up_weight.defined() ? m.gate_up_weight : fused::join_rows({m.gate_proj->weight, m.up_proj->weight});
  auto gu = lora(at::linear(x, w), {m.gate_proj.get(), m.up_proj.get()}, x, site);
  auto act = fused::silu_mul(gu);
  return lora(at::linear(act, m.down_proj->weight), {m.down_proj.get()}, act, site + 1);
}

// LoRA dropout sites of expert e: after every layer's four.
uint64_t expert_site(const ModelConfig& cfg, uint64_t site, int64_t e) {
  return site + static_cast<uint64_t>(4 * cfg.num_layers * (e + 1));
}

// Each expert over the rows routed to it; the outputs back in (token, slot) order [N, k, H].
at::Tensor grouped_experts(const SparseMoe& moe, const ModelConfig& cfg, const at::Tensor& x, const at::Tensor& idx,
                           const LoraHook& lora, uint64_t site) {
  const int64_t N = x.size(0), k = idx.size(1), E = cfg.num_experts;
  auto flat = idx.reshape({-1});
  auto [sorted, order] = at::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  auto counts = at::bincount(flat, {}, E).cpu();
  const auto* n = counts.data_ptr<int64_t>();
  auto xs = x.index_select(0, at::div(order, k, "floor"));
  std::vector<at::Tensor> outs;
  int64_t at = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (n[e] == 0) continue;
    outs.push_back(run_expert(*moe.experts[static_cast<size_t>(e)], xs.narrow(0, at, n[e]), lora, expert_site(cfg, site, e)));
    at += n[e];
  }
  auto ys = at::cat(outs, 0);
  auto inverse = at::empty_like(order).scatter_(0, order, at::arange(N * k, order.options()));
  return ys.index_select(0, inverse).view({N, k, x.size(1)});
}

// Every expert over every row, [N, k, H] by gathering each row's chosen experts' outputs:
// no host sync (a CUDA graph captures it), E times the GEMM rows (decode has few).
at::Tensor dense_experts(const SparseMoe& moe, const ModelConfig& cfg, const at::Tensor& x, const at::Tensor& idx,
                         const LoraHook& lora, uint64_t site) {
  const int64_t N = x.size(0), E = cfg.num_experts, H = x.size(1);
  at::Tensor all;  // [E, N, H]
  if (moe.gate_up_all.defined() && !moe.experts[0]->gate_proj->lora_A) {
    auto gu = at::matmul(x.unsqueeze(0), moe.gate_up_all.transpose(1, 2));  // [E, N, 2I]
    all = at::matmul(fused::silu_mul(gu), moe.down_all.transpose(1, 2));      // [E, N, H]
  } else {
    std::vector<at::Tensor> outs;
    for (int64_t e = 0; e < E; ++e)
      outs.push_back(run_expert(*moe.experts[static_cast<size_t>(e)], x, lora, expert_site(cfg, site, e)));
    all = at::stack(outs, 0);
  }
  // Row n, slot j: all[idx[n, j], n].
  auto rows = at::arange(N, idx.options()).unsqueeze(1).expand_as(idx);
  return all.index({idx, rows}).view({N, idx.size(1), H});
}

// x [N, K] against the experts' stacked weights w_all [E, n, K] at idx [N, k]: [N, k, n], each
// (token, slot) row with its own expert's matrix. On CUDA the expert-indexed GEMV (only the
// chosen experts' weights read); elsewhere the same products by gathering the matrices.
at::Tensor expert_linear(const at::Tensor& x, const at::Tensor& w_all, const at::Tensor& idx) {
#if RLX_WITH_CUDA
  if (auto out = cuda::expert_linear(x, w_all, idx); out.defined()) return out;
#endif
  const int64_t N = x.size(0), k = idx.size(1);
  auto w = w_all.index_select(0, idx.reshape({-1}));                           // [N k, n, K]
  auto xs = x.unsqueeze(1).expand({N, k, x.size(1)}).reshape({N * k, -1, 1});  // [N k, K, 1]
  return at::bmm(w, xs).view({N, k, w_all.size(1)});
}

// Each (token, slot) through its own expert, only those experts' weights read: no host sync
// (a CUDA graph captures it) and none of dense_experts' E-fold GEMM rows. Decode at small
// batch (the engine's fused weights, no adapters), where few experts are chosen.
at::Tensor gathered_experts(const SparseMoe& moe, const at::Tensor& x, const at::Tensor& idx) {
  const int64_t N = x.size(0), k = idx.size(1), H = x.size(1);
  auto gu = expert_linear(x, moe.gate_up_all, idx);     // [N, k, 2I]
  auto act = fused::silu_mul(gu).reshape({N * k, -1});  // [N k, I]
  return expert_linear(act, moe.down_all, idx.reshape({N * k, 1})).view({N, k, H});
}

void record(RoutingTrace& trace, const ModelConfig& cfg, int64_t slot, const at::Tensor& probs, const at::Tensor& own,
            const at::Tensor& used, const at::Tensor& valid, at::IntArrayRef lead) {
  c10::NoGradGuard no_grad;
  const auto slots = static_cast<size_t>(cfg.sparse_layers().size());
  for (auto* v : {&trace.experts, &trace.counts, &trace.mean_prob, &trace.entropy, &trace.agree})
    if (v->size() != slots) v->resize(slots);
  const int64_t k = used.size(1);
  // No host sync here: the engine records routing inside captured CUDA graphs.
  auto vf = valid.defined() ? valid.to(at::kFloat) : at::ones({probs.size(0)}, probs.options());
  auto nv = vf.sum().clamp_min(1.0);
  const auto s = static_cast<size_t>(slot);
  if (trace.record_experts) trace.experts[s] = used.view({lead[0], lead[1], k});
  trace.counts[s] = at::zeros({cfg.num_experts}, probs.options())
                        .index_add_(0, used.reshape({-1}), vf.unsqueeze(1).expand({vf.size(0), k}).reshape({-1}));
  auto p = probs.detach();
  trace.mean_prob[s] = (p * vf.unsqueeze(1)).sum(0) / nv;
  trace.entropy[s] = (-at::special_xlogy(p, p).sum(-1) * vf).sum() / nv;
  auto same = (std::get<0>(at::sort(own, -1)) == std::get<0>(at::sort(used, -1))).all(-1).to(at::kFloat);
  trace.agree[s] = (same * vf).sum() / nv;
}

}  // namespace

at::Tensor moe_forward(const SparseMoe& moe, const ModelConfig& cfg, const at::Tensor& x_in, const at::Tensor& valid,
                       const at::Tensor& forced, RoutingTrace* trace, int64_t slot, MoeStrategy strategy,
                       const LoraHook& lora, uint64_t site) {
  const int64_t H = x_in.size(-1), k = cfg.num_experts_per_tok;
  const auto lead = x_in.sizes().slice(0, x_in.dim() - 1);
  auto x = x_in.reshape({-1, H});
  const int64_t N = x.size(0);
  // The router as HF runs it: logits in the model's dtype, softmax and top-k in fp32.
  auto probs = at::softmax(at::linear(x, moe.gate->weight).to(at::kFloat), -1);
  auto own = std::get<1>(probs.topk(k, -1));
  at::Tensor used = own;
  if (forced.defined()) {
    auto f = forced.reshape({N, k}).to(at::kLong);
    if (f.is_cpu() && N > 0) {  // the engine's own device records skip this host check
      const int64_t hi = f.max().item<int64_t>();
      RLX_CHECK(hi < cfg.num_experts, "routing replay: expert {} in the recorded routing of a {}-expert layer", hi,
                cfg.num_experts);
    }
    used = at::where((f < 0).any(-1, /*keepdim=*/true), own, f);
  }
  auto w = probs.gather(-1, used);
  if (cfg.norm_topk_prob) w = w / w.sum(-1, /*keepdim=*/true);
  w = w.to(x.scalar_type());
  if (strategy == MoeStrategy::automatic) strategy = MoeStrategy::grouped;
  RLX_CHECK(strategy != MoeStrategy::gathered || (moe.gate_up_all.defined() && !moe.experts[0]->gate_proj->lora_A),
            "MoE: the gathered strategy needs the engine's stacked expert weights and no adapters");
  auto per_slot = N == 0                              ? at::zeros({0, k, H}, x.options())
                  : strategy == MoeStrategy::dense    ? dense_experts(moe, cfg, x, used, lora, site)
                  : strategy == MoeStrategy::gathered ? gathered_experts(moe, x, used)
                                                      : grouped_experts(moe, cfg, x, used, lora, site);
  // The gate-weighted sum in top-k order, one slot at a time: the same arithmetic for a
  // token whatever else is in the batch.
  auto y = per_slot.select(1, 0) * w.narrow(1, 0, 1);
  for (int64_t j = 1; j < k; ++j) y = y + per_slot.select(1, j) * w.narrow(1, j, 1);
  if (trace) {
    record(*trace, cfg, slot, probs, own, used, valid, lead.size() == 2 ? lead : at::IntArrayRef{1, N});
    if (trace->aux_loss_coef > 0 && c10::GradMode::is_enabled() && probs.requires_grad()) {
      auto vf = valid.defined() ? valid.to(at::kFloat) : at::ones({N}, probs.options());
      y = AuxLossGrad::apply(y, probs, trace, vf);
    }
  }
  auto out_shape = lead.vec();
  out_shape.push_back(H);
  return y.view(out_shape);
}

}  // namespace detail
}  // namespace rlx
