// The transformer's elementwise pieces as single differentiable ops: RMSNorm, RoPE and
// SiLU-and-multiply, each one pass forward and one pass backward instead of the five to ten
// LibTorch ops (and as many temporaries) of their composite form: on the CPU (float32,
// bfloat16, float64) and, in a CUDA build, on CUDA (float32, float16, bfloat16; rlx's kernels
// in src/cuda/). Elsewhere they run the composite form, which is also their reference in the
// tests.
//
//   auto x = rlx::fused::rms_norm(h, weight, 1e-6);        // HF: fp32 normalisation, cast, scale
//   auto q = rlx::fused::rope(q4, cos, sin, 1 / sqrt(D));  // [B, T, H, D], rotated and scaled
//   auto a = rlx::fused::silu_mul(gate_up);                // silu(first half) * second half
//   auto w = rlx::fused::join_rows({q_w, k_w, v_w});      // [q; k; v], a copy only if apart
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>

namespace rlx::fused {

// x [..., D], weight [D] in x's dtype. HF's RMSNorm: x in fp32 times rsqrt(mean(x^2) + eps),
// cast to x's dtype, times weight. Gradients flow to x and weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x [B, T, H, D] (the last dimension contiguous), cos and sin [B, T, D] in x's dtype:
// (x * cos + rotate_half(x) * sin) * scale, with rotate_half(x) = [-x2, x1] over the halves
// of D. Contiguous output. Gradients flow to x only (the tables are constants).
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, double scale = 1.0);

// gate_up [..., 2I]: silu(gate_up[..., :I]) * gate_up[..., I:], shape [..., I].
at::Tensor silu_mul(const at::Tensor& gate_up);

// parts [n_i, ...] (equal trailing shapes, undefined all or none): their concatenation along
// dim 0, one GEMM's operand (q, k and v's weights; gate and up's). Where the parts already lie
// back to back in one storage (an FSDP unit's flat buffer holds a module's projections so, and
// the engine's fused weights) it is a view of that storage, not a copy; gradients flow to each
// part either way. Undefined parts: undefined.
at::Tensor join_rows(std::initializer_list<at::Tensor> parts);

// The composite forms (LibTorch ops), the fused ops' reference and their path off the CPU.
at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, double scale = 1.0);
at::Tensor silu_mul_reference(const at::Tensor& gate_up);

}  // namespace rlx::fused
