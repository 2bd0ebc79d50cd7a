#include "rlx/model/fused_ops.hpp"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <numeric>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "cpu_math.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#if RLX_WITH_CUDA
#include "cuda/ops.hpp"
#endif

namespace rlx::fused {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per parallel task: enough elements that a task outweighs handing it to a thread.
int64_t row_grain(int64_t width) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width)); }

// Where the fused forms run: the CPU rows below (float32, bfloat16, float64), and on CUDA
// (CUDA builds) rlx's kernels (float32, float16, bfloat16; src/cuda/fused_grad.cu, norms.cu).
// RLX_FUSED_OPS=aten keeps the composite form on CUDA (to compare against).
bool fused_on_cuda(const at::Tensor& x) {
#if RLX_WITH_CUDA
  static const bool aten = [] {
    const char* v = std::getenv("RLX_FUSED_OPS");
    return v != nullptr && std::string_view(v) == "aten";
  }();
  const auto t = x.scalar_type();
  return !aten && x.is_cuda() && (t == at::kFloat || t == at::kHalf || t == at::kBFloat16);
#else
  (void)x;
  return false;
#endif
}
bool fused_here(const at::Tensor& x) {
  const auto t = x.scalar_type();
  return (x.device().is_cpu() && (t == at::kFloat || t == at::kBFloat16 || t == at::kDouble)) || fused_on_cuda(x);
}

// ---- RMSNorm -------------------------------------------------------------------------

// Rows per block of the weight-gradient sum: fixed, so the sum's order (and its rounding)
// does not depend on the thread count.
constexpr int64_t kNormBlockRows = 128;

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
    auto x = x_in.contiguous();
    auto w = w_in.contiguous();
#if RLX_WITH_CUDA
    if (x.is_cuda()) {
      auto [y, inv_rms] = cuda::rms_norm_with_inv(x, w, eps);
      ctx->save_for_backward({x, w, inv_rms});
      return y;
    }
#endif
    const int64_t D = x.size(-1), rows = D ? x.numel() / D : 0;
    auto y = at::empty_like(x);
    auto rstd = at::empty({rows}, x.options().dtype(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rlx::fused::rms_norm", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* wp = w.data_ptr<scalar_t>();
      scalar_t* yp = y.data_ptr<scalar_t>();
      acc_t* rp = rstd.data_ptr<acc_t>();
      at::parallel_for(0, rows, row_grain(D), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* xr = xp + r * D;
          acc_t ss = 0;
          for (int64_t i = 0; i < D; ++i) ss += static_cast<acc_t>(xr[i]) * static_cast<acc_t>(xr[i]);
          const acc_t inv = acc_t(1) / std::sqrt(ss / static_cast<acc_t>(D) + static_cast<acc_t>(eps));
          rp[r] = inv;
          scalar_t* yr = yp + r * D;
          // As HF: the normalised value is cast to x's dtype before the weight multiplies it.
          for (int64_t i = 0; i < D; ++i)
            yr[i] = static_cast<scalar_t>(static_cast<acc_t>(wp[i]) *
                                          static_cast<acc_t>(static_cast<scalar_t>(static_cast<acc_t>(xr[i]) * inv)));
        }
      });
    });
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &rstd = saved[2];
#if RLX_WITH_CUDA
    if (x.is_cuda()) {
      auto [dx, dw] = cuda::rms_norm_backward(x, w, rstd, grads[0]);
      return {dx, dw, at::Tensor()};
    }
#endif
    auto g = grads[0].contiguous();
    const int64_t D = x.size(-1), rows = D ? x.numel() / D : 0;
    auto dx = at::empty_like(x);
    const int64_t blocks = (rows + kNormBlockRows - 1) / kNormBlockRows;
    auto partial = at::zeros({std::max<int64_t>(blocks, 1), D}, rstd.options());
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rlx::fused::rms_norm_backward", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* wp = w.data_ptr<scalar_t>();
      const scalar_t* gp = g.data_ptr<scalar_t>();
      const acc_t* rp = rstd.data_ptr<acc_t>();
      scalar_t* dxp = dx.data_ptr<scalar_t>();
      acc_t* pp = partial.data_ptr<acc_t>();
      at::parallel_for(0, blocks, std::max<int64_t>(1, row_grain(D) / kNormBlockRows), [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          acc_t* pw = pp + b * D;
          for (int64_t r = b * kNormBlockRows; r < std::min(rows, (b + 1) * kNormBlockRows); ++r) {
            const scalar_t* xr = xp + r * D;
            const scalar_t* gr = gp + r * D;
            const acc_t inv = rp[r];
            // y = w * n, n = x * inv: dn = g * w; dx = inv * (dn - n * mean(dn * n)).
            acc_t dot = 0;
            for (int64_t i = 0; i < D; ++i) {
              const acc_t n = static_cast<acc_t>(xr[i]) * inv;
              const acc_t gi = static_cast<acc_t>(gr[i]);
              dot += gi * static_cast<acc_t>(wp[i]) * n;
              pw[i] += gi * static_cast<acc_t>(static_cast<scalar_t>(n));
            }
            const acc_t mean = dot / static_cast<acc_t>(D);
            scalar_t* dr = dxp + r * D;
            for (int64_t i = 0; i < D; ++i) {
              const acc_t n = static_cast<acc_t>(xr[i]) * inv;
              dr[i] = static_cast<scalar_t>(inv * (static_cast<acc_t>(gr[i]) * static_cast<acc_t>(wp[i]) - n * mean));
            }
          }
        }
      });
    });
    auto dw = partial.sum(0).to(w.scalar_type());
    return {dx, dw, at::Tensor()};
  }
};

// ---- RoPE ----------------------------------------------------------------------------

// y[i] = (x[i] c[i] - x[i+h] s[i]) k, y[i+h] = (x[i+h] c[i+h] + x[i] s[i+h]) k for i < h = D/2.
// With `transpose`, the adjoint: dx[i] = (g[i] c[i] + g[i+h] s[i+h]) k,
// dx[i+h] = (g[i+h] c[i+h] - g[i] s[i]) k.
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in, double scale,
                      bool transpose) {
#if RLX_WITH_CUDA
  if (x.is_cuda()) return cuda::rope(x, cos_in, sin_in, scale, transpose);
#endif
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), h = D / 2;
  auto cos = cos_in.contiguous(), sin = sin_in.contiguous();
  auto y = at::empty({B, T, H, D}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t sb = x.stride(0), st = x.stride(1), sh = x.stride(2);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rlx::fused::rope", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* sp = sin.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const acc_t k = static_cast<acc_t>(scale);
    at::parallel_for(0, B * T, row_grain(H * D), [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t b = p / T, t = p % T;
        const scalar_t* c = cp + p * D;
        const scalar_t* s = sp + p * D;
        for (int64_t head = 0; head < H; ++head) {
          const scalar_t* xr = xp + b * sb + t * st + head * sh;
          scalar_t* yr = yp + (p * H + head) * D;
          for (int64_t i = 0; i < h; ++i) {
            const acc_t a = static_cast<acc_t>(xr[i]), z = static_cast<acc_t>(xr[i + h]);
            const acc_t c1 = static_cast<acc_t>(c[i]), c2 = static_cast<acc_t>(c[i + h]);
            const acc_t s1 = static_cast<acc_t>(s[i]), s2 = static_cast<acc_t>(s[i + h]);
            if (transpose) {
              yr[i] = static_cast<scalar_t>((a * c1 + z * s2) * k);
              yr[i + h] = static_cast<scalar_t>((z * c2 - a * s1) * k);
            } else {
              yr[i] = static_cast<scalar_t>((a * c1 - z * s1) * k);
              yr[i + h] = static_cast<scalar_t>((z * c2 + a * s2) * k);
            }
          }
        }
      }
    });
  });
  return y;
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            double scale) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["scale"] = scale;
    return rope_apply(x, cos, sin, scale, false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto g = grads[0].stride(3) == 1 ? grads[0] : grads[0].contiguous();
    auto dx = rope_apply(g, saved[0], saved[1], ctx->saved_data["scale"].toDouble(), true);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---- SiLU and multiply -----------------------------------------------------------------

// e^x: the vectorisable one (fp32, cpu_math.hpp) or std::exp.
template <bool kApprox, typename T>
RLX_CPU_INLINE T exp_of(T x) {
  if constexpr (kApprox)
    return cpu::exp_approx(x);
  else
    return std::exp(x);
}

// Rows [r0, r1) of gu [rows, 2I] -> out [rows, I]. As LibTorch: silu's result is rounded to
// the dtype before the product.
template <bool kApprox, typename scalar_t>
RLX_CPU_INLINE void silu_mul_rows(const scalar_t* gu, scalar_t* out, int64_t r0, int64_t r1, int64_t I) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t r = r0; r < r1; ++r) {
    const scalar_t* g = gu + r * 2 * I;
    const scalar_t* u = g + I;
    scalar_t* o = out + r * I;
    for (int64_t i = 0; i < I; ++i) {
      const auto gv = static_cast<acc_t>(g[i]);
      const auto act = static_cast<scalar_t>(gv / (acc_t(1) + exp_of<kApprox>(-gv)));
      o[i] = static_cast<scalar_t>(static_cast<acc_t>(act) * static_cast<acc_t>(u[i]));
    }
  }
}

// d gate = d * u * s * (1 + g (1 - s)), d up = d * silu(g), s = sigmoid(g).
template <bool kApprox, typename scalar_t>
RLX_CPU_INLINE void silu_mul_rows_backward(const scalar_t* gu, const scalar_t* dout, scalar_t* dgu, int64_t r0,
                                           int64_t r1, int64_t I) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t r = r0; r < r1; ++r) {
    const scalar_t* g = gu + r * 2 * I;
    const scalar_t* u = g + I;
    const scalar_t* d = dout + r * I;
    scalar_t* dg = dgu + r * 2 * I;
    scalar_t* du = dg + I;
    for (int64_t i = 0; i < I; ++i) {
      const auto gv = static_cast<acc_t>(g[i]), uv = static_cast<acc_t>(u[i]), dv = static_cast<acc_t>(d[i]);
      const acc_t s = acc_t(1) / (acc_t(1) + exp_of<kApprox>(-gv));
      du[i] = static_cast<scalar_t>(dv * static_cast<acc_t>(static_cast<scalar_t>(gv * s)));
      dg[i] = static_cast<scalar_t>(dv * uv * s * (acc_t(1) + gv * (acc_t(1) - s)));
    }
  }
}

// The fp32 rows built twice (cpu_math.hpp) with the vectorisable exp; other dtypes take std::exp.
RLX_CPU_CLONES void silu_mul_rows_f32(const float* gu, float* out, int64_t r0, int64_t r1, int64_t I) {
  silu_mul_rows<true>(gu, out, r0, r1, I);
}
RLX_CPU_CLONES void silu_mul_rows_backward_f32(const float* gu, const float* dout, float* dgu, int64_t r0, int64_t r1,
                                               int64_t I) {
  silu_mul_rows_backward<true>(gu, dout, dgu, r0, r1, I);
}
// Per dtype: fp32 to the clones above (a non-template overload wins), the rest to std::exp.
template <typename scalar_t>
void silu_mul_any(const scalar_t* gu, scalar_t* out, int64_t r0, int64_t r1, int64_t I) {
  silu_mul_rows<false>(gu, out, r0, r1, I);
}
void silu_mul_any(const float* gu, float* out, int64_t r0, int64_t r1, int64_t I) {
  silu_mul_rows_f32(gu, out, r0, r1, I);
}
template <typename scalar_t>
void silu_mul_backward_any(const scalar_t* gu, const scalar_t* dout, scalar_t* dgu, int64_t r0, int64_t r1, int64_t I) {
  silu_mul_rows_backward<false>(gu, dout, dgu, r0, r1, I);
}
void silu_mul_backward_any(const float* gu, const float* dout, float* dgu, int64_t r0, int64_t r1, int64_t I) {
  silu_mul_rows_backward_f32(gu, dout, dgu, r0, r1, I);
}

struct SiluMulFn : torch::autograd::Function<SiluMulFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gu_in) {
    auto gu = gu_in.contiguous();
#if RLX_WITH_CUDA
    if (gu.is_cuda()) {
      ctx->save_for_backward({gu});
      return cuda::silu_mul(gu);
    }
#endif
    const int64_t I = gu.size(-1) / 2, rows = I ? gu.numel() / (2 * I) : 0;
    auto shape = gu.sizes().vec();
    shape.back() = I;
    auto out = at::empty(shape, gu.options());
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, gu.scalar_type(), "rlx::fused::silu_mul", [&] {
      const scalar_t* p = gu.data_ptr<scalar_t>();
      scalar_t* o = out.data_ptr<scalar_t>();
      at::parallel_for(0, rows, row_grain(2 * I),
                       [&](int64_t r0, int64_t r1) { silu_mul_any(p, o, r0, r1, I); });
    });
    ctx->save_for_backward({gu});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto gu = ctx->get_saved_variables()[0];
#if RLX_WITH_CUDA
    if (gu.is_cuda()) return {cuda::silu_mul_backward(gu, grads[0])};
#endif
    auto dout = grads[0].contiguous();
    const int64_t I = gu.size(-1) / 2, rows = I ? gu.numel() / (2 * I) : 0;
    auto dgu = at::empty_like(gu);
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, gu.scalar_type(), "rlx::fused::silu_mul_backward", [&] {
      const scalar_t* p = gu.data_ptr<scalar_t>();
      const scalar_t* d = dout.data_ptr<scalar_t>();
      scalar_t* q = dgu.data_ptr<scalar_t>();
      at::parallel_for(0, rows, row_grain(2 * I),
                       [&](int64_t r0, int64_t r1) { silu_mul_backward_any(p, d, q, r0, r1, I); });
    });
    return {dgu};
  }
};

// ---- Rows joined -----------------------------------------------------------------------

// Whether `parts` lie back to back in one storage, each contiguous, with one dtype and
// trailing shape: their concatenation is then a view of that storage.
bool back_to_back(std::initializer_list<at::Tensor> parts) {
  const at::Tensor* prev = nullptr;
  for (const auto& p : parts) {
    if (!p.defined() || !p.is_contiguous()) return false;
    if (prev != nullptr &&
        (p.scalar_type() != prev->scalar_type() || p.device() != prev->device() ||
         !p.storage().is_alias_of(prev->storage()) || p.storage_offset() != prev->storage_offset() + prev->numel() ||
         p.sizes().slice(1) != prev->sizes().slice(1)))
      return false;
    prev = &p;
  }
  return true;
}

// The view of back-to-back parts as one tensor; backward hands each part its rows of the
// gradient (views of it, no copy).
struct JoinRowsFn : torch::autograd::Function<JoinRowsFn> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList parts) {
    std::vector<int64_t> rows;
    for (const auto& p : parts) rows.push_back(p.size(0));
    auto shape = parts[0].sizes().vec();
    shape[0] = std::accumulate(rows.begin(), rows.end(), int64_t{0});
    ctx->saved_data["rows"] = rows;
    return at::empty({0}, parts[0].options())
        .set_(parts[0].storage(), parts[0].storage_offset(), shape, c10::contiguous_strides(shape));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return grads[0].split_with_sizes(ctx->saved_data["rows"].toIntVector(), 0);
  }
};

}  // namespace

at::Tensor join_rows(std::initializer_list<at::Tensor> parts) {
  RLX_ASSERT(parts.size() >= 1, "join_rows: no parts");
  if (!parts.begin()->defined()) return at::Tensor();
  if (parts.size() > 1 && back_to_back(parts)) return JoinRowsFn::apply(at::TensorList(parts.begin(), parts.size()));
  return at::cat(parts, 0);
}

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto xf = x.to(at::kFloat);
  auto normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, double scale) {
  auto halves = x.chunk(2, -1);
  auto rotated = at::cat({-halves[1], halves[0]}, -1);
  auto y = x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2);
  return scale == 1.0 ? y : y * scale;
}

at::Tensor silu_mul_reference(const at::Tensor& gate_up) {
  const int64_t I = gate_up.size(-1) / 2;
  return at::silu(gate_up.narrow(-1, 0, I)) * gate_up.narrow(-1, I, I);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  RLX_ASSERT(weight.dim() == 1 && x.size(-1) == weight.size(0), "rms_norm: x {} and weight {}", x.sizes(),
             weight.sizes());
  if (!fused_here(x) || weight.scalar_type() != x.scalar_type() || weight.device() != x.device())
    return rms_norm_reference(x, weight, eps);
  return RmsNormFn::apply(x, weight, eps);
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, double scale) {
  RLX_ASSERT(x.dim() == 4 && x.size(3) % 2 == 0 && cos.dim() == 3 && cos.size(0) == x.size(0) &&
                 cos.size(1) == x.size(1) && cos.size(2) == x.size(3) && sin.sizes() == cos.sizes(),
             "rope: x {}, cos {}, sin {}", x.sizes(), cos.sizes(), sin.sizes());
  if (!fused_here(x) || x.stride(3) != 1 || cos.scalar_type() != x.scalar_type() ||
      sin.scalar_type() != x.scalar_type() || cos.device() != x.device() || sin.device() != x.device())
    return rope_reference(x, cos, sin, scale);
  return RopeFn::apply(x, cos, sin, scale);
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  RLX_ASSERT(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "silu_mul: gate_up {}", gate_up.sizes());
  if (!fused_here(gate_up)) return silu_mul_reference(gate_up);
  return SiluMulFn::apply(gate_up);
}

}  // namespace rlx::fused
