// ATen glue for rlx's CUDA kernels, used by the model and the engine (CUDA builds only):
// tensors in, shape and dtype checks, the current stream, a launcher status turned into rlx::Error.
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "rlx/cuda/kernels.hpp"

namespace rlx::cuda {

// A launcher's status (cuda::kernels.hpp) as rlx::Error naming the kernel.
void check_launch(const char* kernel, int status);
// The kernels' dtype of a float32, float16 or bfloat16 tensor (an error for any other).
DType dtype_of(const at::Tensor& t);

// The learner's log-prob head on a chunk of logits z [rows, V] (CUDA, fp16/bf16/fp32,
// contiguous): head_forward_on_device fills lse, logp (and ent, when it has rows elements),
// fp32 [rows]; head_backward_on_device overwrites z with d z (g_logp / g_ent fp32 [rows] or
// undefined). The same rules as the CPU's head rows (model/logprob_head.cpp).
bool head_on_device_supported(const at::Tensor& z);
void head_forward_on_device(const at::Tensor& z, const at::Tensor& targets, at::Tensor& lse, at::Tensor& logp,
                            at::Tensor& ent);
void head_backward_on_device(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, const at::Tensor& ent,
                             const at::Tensor& g_logp, const at::Tensor& g_ent);

// Whether the decode attention kernel takes these: q and the pools of one float dtype on
// CUDA, head_dim 64 or 128.
bool decode_attention_supported(const at::Tensor& q, const at::Tensor& k_pool);
// Paged decode attention in place over the pools ([block, kv_head, block_size, head_dim]):
// q [seqs, q_heads, head_dim] (one new token a sequence, its key already in the pool),
// block tables int32 [seqs, max_blocks], context lengths int32 [seqs] (<= max_context).
// Returns [seqs, q_heads, head_dim] in q's dtype.
// `merge_counters` (int32 zeros, decode_attention_counters(...) of them, used by one stream
// at a time): the tensor-core pass 1 merges its splits itself; undefined: pass 2 does.
at::Tensor decode_attention_on_device(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                      const at::Tensor& block_tables, const at::Tensor& context_lens,
                                      int64_t max_context, double scale, const at::Tensor& merge_counters = {});

// residual <- residual + x; returns RMSNorm(residual) * weight (one kernel). residual is
// [..., hidden] contiguous, x and weight of its dtype.
at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps);
// RMSNorm(x) * weight, one kernel (the same one, with nothing to add).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// RoPE on the q and k heads of qkv [rows, (q_heads + 2 Hkv) * D] at `positions` (int64
// [rows]), k and v written into the head-major pools at `slots` (int64 [rows]); returns the
// rotated q [rows, q_heads, D]. q_norm and k_norm ([D], qkv's dtype; both or neither):
// Qwen3's per-head RMSNorm before the rotation.
at::Tensor rope_append(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& slots,
                       const at::Tensor& inv_freq, at::Tensor& k_pool, at::Tensor& v_pool, int64_t q_heads,
                       const at::Tensor& q_norm = {}, const at::Tensor& k_norm = {}, double eps = 1e-6);
// A mixture of experts' projection at decode, reading only the chosen experts' weights: x
// [N, K], w_all [E, n, K] (the layer's stacked experts), experts int64 [N, k] -> [N, k, n], row
// (t, j) = x[t] w_all[experts[t, j]]^T (the expert-indexed GEMV). Undefined where the kernel
// does not apply (not CUDA fp16/bf16, K not a multiple of 8, unaligned, over 65535 pairs).
at::Tensor expert_linear(const at::Tensor& x, const at::Tensor& w_all, const at::Tensor& experts);
// SiLU(gate) * up for gate_up [..., 2 * inter] (the fused gate/up GEMM's output): [..., inter].
at::Tensor silu_mul(const at::Tensor& gate_up);

// The learner's fused ops on CUDA, for model/fused_ops.cpp's autograd functions (the same
// shapes and rules as theirs): RMSNorm returning (y, inv_rms fp32 [rows]) and its backward
// returning (dx, dweight); RoPE over x [B, T, H, D] (or, `transpose`, its backward);
// silu_mul's backward: d gate_up from gate_up and d out.
std::pair<at::Tensor, at::Tensor> rms_norm_with_inv(const at::Tensor& x, const at::Tensor& weight, double eps);
std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& x, const at::Tensor& weight,
                                                    const at::Tensor& inv_rms, const at::Tensor& grad);
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, double scale, bool transpose);
at::Tensor silu_mul_backward(const at::Tensor& gate_up, const at::Tensor& grad);
// Whether decode's dense projections of one row take rlx's GEMV (RLX_GEMV=1), with the norm or
// the SiLU-mul before them folded in (norm_linear, silu_linear); cuBLAS otherwise (on an H200
// the GEMV's step was 1.01x cuBLAS's at batch 1, 0.38x at 8: a3976e4).
bool gemv_enabled();
// Whether they take rlx's tensor-core decode GEMM up to 256 rows past the GEMV's (or from one
// row without it), RLX_DECODE_GEMM=1 (cuda::decode_gemm: k a multiple of 64, sm_80 and newer),
// with the norms and SiLU-mul folded in as the GEMV's are (norm_linear, silu_linear).
bool decode_gemm_enabled();
// x [..., K] w [N, K]^T (+ b [N]): at::linear, or where gemv_enabled() the small-batch kernel
// (cuda::gemv: one row, fp16/bf16, K a multiple of 8, contiguous, 16-byte aligned)
// where it applies, or where decode_gemm_enabled() the tensor-core one up to 256 rows. No
// autograd (decode only). MoE's expert-indexed projections (expert_linear) always use the GEMV.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
// RMSNorm(h + add) * norm_weight, times w^T (+ b), in one kernel: returns (the product, h + add
// in a new tensor, or h itself with no add), bit for bit what add_rms_norm (or rms_norm) and
// linear() give. The GEMV where gemv_enabled() and it fits (at most 40 KiB of rows), else the
// decode GEMM where decode_gemm_enabled() and it fits, for rows the GEMV does not take (as
// linear() chooses); hidden at most 8192. The product undefined where neither applies: the
// caller runs add_rms_norm and linear. (fused_layer does not ask with unmerged LoRA adapters,
// nor for a MoE layer's MLP.)
std::pair<at::Tensor, at::Tensor> norm_linear(const at::Tensor& h, const at::Tensor& add, const at::Tensor& norm_weight,
                                              double eps, const at::Tensor& w, const at::Tensor& b);
// silu_mul(gate_up) w^T (+ b) in one kernel, bit for bit what silu_mul and linear() give: the
// GEMV where gemv_enabled() and it fits, else the decode GEMM where decode_gemm_enabled() and it
// fits (2 to 256 rows with the GEMV on); undefined otherwise.
at::Tensor silu_linear(const at::Tensor& gate_up, const at::Tensor& w, const at::Tensor& b);

}  // namespace rlx::cuda
