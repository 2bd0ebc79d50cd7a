#include "rlx/model/logprob_head.hpp"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <type_traits>

#include "cpu_math.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#if RLX_WITH_CUDA
#include <cstdlib>
#include <string_view>

#include "cuda/ops.hpp"
#endif

namespace rlx {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// On the CPU, each chunk's softmax work is one pass over its logits per direction (no fp32
// copy, no temporaries), and a step whose tokens fit in one chunk keeps that chunk's logits
// for backward instead of making them again.
bool rows_here(const at::Tensor& z) {
  return z.device().is_cpu() && (z.scalar_type() == at::kFloat || z.scalar_type() == at::kBFloat16);
}

// fp32 rows [r0, r1) of z [m, V], vectorised (cpu_math.hpp): 8 lanes of running max, sum
// and sum of p z, folded at the end of the row.
RLX_CPU_CLONES void head_rows_forward_f32(const float* zp, int64_t V, int64_t r0, int64_t r1, const int64_t* tp,
                                          float* lp, float* op, float* ep) {
  constexpr int L = 8;
  for (int64_t r = r0; r < r1; ++r) {
    const float* z = zp + r * V;
    float mx[L], s[L], pz[L];
    for (int k = 0; k < L; ++k) mx[k] = -INFINITY, s[k] = 0, pz[k] = 0;
    int64_t j = 0;
    for (; j + L <= V; j += L)
      for (int k = 0; k < L; ++k) mx[k] = std::max(mx[k], z[j + k]);
    float m = -INFINITY;
    for (int k = 0; k < L; ++k) m = std::max(m, mx[k]);
    for (; j < V; ++j) m = std::max(m, z[j]);
    for (j = 0; j + L <= V; j += L)
      for (int k = 0; k < L; ++k) {
        const float e = cpu::exp_approx(z[j + k] - m);
        s[k] += e;
        pz[k] += e * z[j + k];
      }
    float sum = 0, sum_pz = 0;
    for (int k = 0; k < L; ++k) sum += s[k], sum_pz += pz[k];
    for (; j < V; ++j) {
      const float e = cpu::exp_approx(z[j] - m);
      sum += e;
      sum_pz += e * z[j];
    }
    const float l = m + std::log(sum);
    lp[r] = l;
    op[r] = z[tp[r]] - l;
    if (ep) ep[r] = l - sum_pz / sum;
  }
}

RLX_CPU_CLONES void head_rows_backward_f32(const float* zp, int64_t V, int64_t r0, int64_t r1, const int64_t* tp,
                                           const float* lp, const float* gl, const float* ge, const float* hp,
                                           float* dp) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* z = zp + r * V;
    float* d = dp + r * V;
    const float l = lp[r], a = gl ? gl[r] : 0.0f, b = ge ? ge[r] : 0.0f, H = hp ? hp[r] : 0.0f;
    for (int64_t j = 0; j < V; ++j) {
      const float lpj = z[j] - l;
      d[j] = -(a + b * (lpj + H)) * cpu::exp_approx(lpj);
    }
    d[tp[r]] += a;
  }
}

// z [m, V]: lse, the target's log-prob and (when `ent` has m elements) the entropy, in fp32.
void head_rows_forward(const at::Tensor& z, const at::Tensor& targets, at::Tensor lse, at::Tensor logp,
                       at::Tensor ent) {
  const int64_t m = z.size(0), V = z.size(1);
  const int64_t* tp = targets.data_ptr<int64_t>();
  float *lp = lse.data_ptr<float>(), *op = logp.data_ptr<float>();
  float* ep = ent.numel() == m ? ent.data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, z.scalar_type(), "rlx::token_logprobs", [&] {
    const scalar_t* zp = z.data_ptr<scalar_t>();
    at::parallel_for(0, m, std::max<int64_t>(1, 16384 / V), [&](int64_t r0, int64_t r1) {
      if constexpr (std::is_same_v<scalar_t, float>) {
        head_rows_forward_f32(reinterpret_cast<const float*>(zp), V, r0, r1, tp, lp, op, ep);
        return;
      }
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* zr = zp + r * V;
        float mx = -INFINITY;
        for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<float>(zr[j]));
        float sum = 0, pz = 0;
        for (int64_t j = 0; j < V; ++j) {
          const float zj = static_cast<float>(zr[j]), e = std::exp(zj - mx);
          sum += e;
          pz += e * zj;
        }
        const float l = mx + std::log(sum);
        lp[r] = l;
        op[r] = static_cast<float>(zr[tp[r]]) - l;
        if (ep) ep[r] = l - pz / sum;
      }
    });
  });
}

// d logits = -(g_logp + g_ent (log p + H)) p, plus g_logp at the target; in z's dtype.
at::Tensor head_rows_backward(const at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse,
                              const at::Tensor& ent, const at::Tensor& g_logp, const at::Tensor& g_ent) {
  const int64_t m = z.size(0), V = z.size(1);
  auto dz = at::empty_like(z);
  auto gl_t = g_logp.defined() ? g_logp.to(at::kFloat).contiguous() : at::Tensor();
  auto ge_t = g_ent.defined() && ent.numel() == m ? g_ent.to(at::kFloat).contiguous() : at::Tensor();
  const int64_t* tp = targets.data_ptr<int64_t>();
  const float* lp = lse.data_ptr<float>();
  const float* gl = gl_t.defined() ? gl_t.data_ptr<float>() : nullptr;
  const float* ge = ge_t.defined() ? ge_t.data_ptr<float>() : nullptr;
  const float* hp = ge ? ent.data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, z.scalar_type(), "rlx::token_logprobs_backward", [&] {
    const scalar_t* zp = z.data_ptr<scalar_t>();
    scalar_t* dp = dz.data_ptr<scalar_t>();
    at::parallel_for(0, m, std::max<int64_t>(1, 16384 / V), [&](int64_t r0, int64_t r1) {
      if constexpr (std::is_same_v<scalar_t, float>) {
        head_rows_backward_f32(reinterpret_cast<const float*>(zp), V, r0, r1, tp, lp, gl, ge, hp,
                               reinterpret_cast<float*>(dp));
        return;
      }
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* zr = zp + r * V;
        scalar_t* dr = dp + r * V;
        const float l = lp[r], a = gl ? gl[r] : 0.0f, b = ge ? ge[r] : 0.0f, H = hp ? hp[r] : 0.0f;
        for (int64_t j = 0; j < V; ++j) {
          const float lpj = static_cast<float>(zr[j]) - l;
          dr[j] = static_cast<scalar_t>(-(a + b * (lpj + H)) * std::exp(lpj));
        }
        if (a != 0.0f) {
          const float lpt = static_cast<float>(zr[tp[r]]) - l;
          dr[tp[r]] = static_cast<scalar_t>(a - (a + b * (lpt + H)) * std::exp(lpt));
        }
      }
    });
  });
  return dz;
}

#if RLX_WITH_CUDA
// On a GPU the head's kernels (cuda/logprob_head.cu) make the same one pass per
// direction over a chunk's logits in their own dtype, the backward's in place;
// RLX_LOGPROB_HEAD=aten takes LibTorch's ops below instead (to compare against).
bool head_on_gpu(const at::Tensor& z) {
  static const bool aten = [] {
    const char* v = std::getenv("RLX_LOGPROB_HEAD");
    return v != nullptr && std::string_view(v) == "aten";
  }();
  return !aten && cuda::head_on_device_supported(z);
}
#endif

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
    at::Tensor kept;  // the logits, when one chunk holds them all (CPU)
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
      const int64_t m = std::min(chunk, n - i0);
      auto zc = at::matmul(hidden.narrow(0, i0, m), weight.t());
      if (rows_here(zc)) {
        head_rows_forward(zc, targets.narrow(0, i0, m), lse.narrow(0, i0, m), logp.narrow(0, i0, m),
                          entropy ? ent.narrow(0, i0, m) : ent);
        if (m == n) kept = zc;
        continue;
      }
#if RLX_WITH_CUDA
      if (head_on_gpu(zc)) {
        auto l = lse.narrow(0, i0, m), lp = logp.narrow(0, i0, m), e = entropy ? ent.narrow(0, i0, m) : ent;
        cuda::head_forward_on_device(zc, targets.narrow(0, i0, m), l, lp, e);
        continue;
      }
#endif
      auto z = zc.to(at::kFloat);
      auto l = at::logsumexp(z, -1);
      lse.narrow(0, i0, m).copy_(l);
      logp.narrow(0, i0, m).copy_(z.gather(-1, targets.narrow(0, i0, m).unsqueeze(-1)).squeeze(-1) - l);
      if (entropy) {
        auto p = (z - l.unsqueeze(-1)).exp_();
        ent.narrow(0, i0, m).copy_(l - (p * z).sum(-1));
      }
    }
    ctx->save_for_backward({hidden, weight, targets, lse, ent, kept});
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
    const auto& kept = saved[5];
    const bool entropy = ctx->saved_data["entropy"].toBool();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto& g_logp = grads[0];
    const auto& g_ent = grads[1];
    const int64_t n = hidden.size(0);
    auto g_hidden = at::empty_like(hidden);
    at::Tensor g_weight;  // fp32, summed over chunks
    auto add_weight_grad = [&](const at::Tensor& g) {
      auto gf = g.to(at::kFloat);
      if (g_weight.defined())
        g_weight.add_(gf);
      else
        g_weight = gf;  // a fresh product, owned here
    };
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
      const int64_t m = std::min(chunk, n - i0);
      auto h = hidden.narrow(0, i0, m);
      auto zc = kept.defined() ? kept : at::matmul(h, weight.t());
      if (rows_here(zc)) {
        auto dzc = head_rows_backward(zc, targets.narrow(0, i0, m), lse.narrow(0, i0, m),
                                      entropy ? ent.narrow(0, i0, m) : ent,
                                      g_logp.defined() ? g_logp.narrow(0, i0, m) : at::Tensor(),
                                      g_ent.defined() && entropy ? g_ent.narrow(0, i0, m) : at::Tensor());
        g_hidden.narrow(0, i0, m).copy_(at::matmul(dzc, weight));
        add_weight_grad(at::matmul(dzc.t(), h));
        continue;
      }
#if RLX_WITH_CUDA
      if (head_on_gpu(zc)) {  // zc becomes d logits, in place
        cuda::head_backward_on_device(zc, targets.narrow(0, i0, m), lse.narrow(0, i0, m),
                                      entropy ? ent.narrow(0, i0, m) : ent,
                                      g_logp.defined() ? g_logp.narrow(0, i0, m) : at::Tensor(),
                                      g_ent.defined() && entropy ? g_ent.narrow(0, i0, m) : at::Tensor());
        auto gh = g_hidden.narrow(0, i0, m);
        at::matmul_out(gh, zc, weight);
        add_weight_grad(at::matmul(zc.t(), h));
        continue;
      }
#endif
      auto z = zc.to(at::kFloat);
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
      add_weight_grad(at::matmul(dzc.t(), h));
    }
    if (!g_weight.defined()) g_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
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
  const bool some = o.positions.defined();
  if (some) {  // the positions' rows only (index_select's gradient adds them back)
    flat_hidden = flat_hidden.index_select(0, o.positions);
    flat_targets = flat_targets.index_select(0, o.positions);
  }
  auto out = LogprobHead::apply(flat_hidden, weight.to(hidden.scalar_type()), flat_targets, o.entropy, o.chunk_tokens);
  // Scattered back among zeros (index_copy's gradient reads the positions' rows).
  auto place = [&](const at::Tensor& t) {
    if (!some) return t.view(lead);
    return at::zeros({targets.numel()}, t.options()).index_copy(0, o.positions, t).view(lead);
  };
  HeadOutputs r;
  r.logprobs = place(out[0]);
  if (o.entropy) r.entropy = place(out[1]);
  return r;
}

}  // namespace rlx
