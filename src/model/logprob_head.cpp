#include "rlx/model/logprob_head.hpp"

#include <torch/autograd.h>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward: per chunk, logits (compute dtype) -> fp32 -> log-sum-exp, picked log-prob and
// entropy; saves hidden, weight, targets and the fp32 log-sum-exp. Backward: per chunk, the
// logits again, then d logits = g_logp (onehot - p) - g_ent p (log p + H), in the compute
// dtype, into the hidden and weight gradients.
struct LogprobHead : torch::autograd::Function<LogprobHead> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& targets, bool entropy, int64_t chunk) {
    const int64_t n = hidden.size(0);
    auto opts = hidden.options().dtype(at::kFloat);
    auto logp = at::empty({n}, opts), lse = at::empty({n}, opts);
    auto ent = entropy ? at::empty({n}, opts) : at::empty({0}, opts);
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
      const int64_t m = std::min(chunk, n - i0);
      auto z = at::matmul(hidden.narrow(0, i0, m), weight.t()).to(at::kFloat);
      auto l = at::logsumexp(z, -1);
      lse.narrow(0, i0, m).copy_(l);
      logp.narrow(0, i0, m).copy_(z.gather(-1, targets.narrow(0, i0, m).unsqueeze(-1)).squeeze(-1) - l);
      if (entropy) {
        auto p = (z - l.unsqueeze(-1)).exp_();
        ent.narrow(0, i0, m).copy_(l - (p * z).sum(-1));
      }
    }
    ctx->save_for_backward({hidden, weight, targets, lse, ent});
    ctx->saved_data["entropy"] = entropy;
    ctx->saved_data["chunk"] = chunk;
    return {logp, ent};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1];
    const auto& targets = saved[2];
    const auto& lse = saved[3];
    const auto& ent = saved[4];
    const bool entropy = ctx->saved_data["entropy"].toBool();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto& g_logp = grads[0];
    const auto& g_ent = grads[1];
    const int64_t n = hidden.size(0);
    auto g_hidden = at::empty_like(hidden);
    auto g_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
      const int64_t m = std::min(chunk, n - i0);
      auto h = hidden.narrow(0, i0, m);
      auto z = at::matmul(h, weight.t()).to(at::kFloat);
      auto logp_all = z - lse.narrow(0, i0, m).unsqueeze(-1);
      auto p = logp_all.exp();
      at::Tensor dz;
      if (g_logp.defined()) {
        auto gl = g_logp.narrow(0, i0, m).unsqueeze(-1);
        dz = -(p * gl);
        dz.scatter_add_(-1, targets.narrow(0, i0, m).unsqueeze(-1), gl);
      } else {
        dz = at::zeros_like(z);
      }
      if (entropy && g_ent.defined())
        dz -= g_ent.narrow(0, i0, m).unsqueeze(-1) * p * (logp_all + ent.narrow(0, i0, m).unsqueeze(-1));
      auto dzc = dz.to(hidden.scalar_type());
      g_hidden.narrow(0, i0, m).copy_(at::matmul(dzc, weight));
      g_weight.add_(at::matmul(dzc.t(), h).to(at::kFloat));
    }
    return {g_hidden, g_weight.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

HeadOutputs token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                           const LogprobHeadOptions& o) {
  RLX_CHECK(o.chunk_tokens >= 1, "token_logprobs: chunk_tokens must be >= 1, got {}", o.chunk_tokens);
  RLX_ASSERT(hidden.size(-1) == weight.size(1) && targets.sizes() == hidden.sizes().slice(0, hidden.dim() - 1),
             "token_logprobs: hidden {}, weight {}, targets {}", hidden.sizes(), weight.sizes(), targets.sizes());
  auto lead = targets.sizes().vec();
  auto flat_hidden = hidden.reshape({-1, hidden.size(-1)});
  auto flat_targets = targets.reshape({-1}).to(at::kLong);
  auto out = LogprobHead::apply(flat_hidden, weight.to(hidden.scalar_type()), flat_targets, o.entropy, o.chunk_tokens);
  HeadOutputs r;
  r.logprobs = out[0].view(lead);
  if (o.entropy) r.entropy = out[1].view(lead);
  return r;
}

}  // namespace rlx
