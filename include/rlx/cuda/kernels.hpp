// The rollout engine's own CUDA kernels, as plain launchers over raw device pointers:
// no LibTorch type and no CUDA header here, so this compiles with g++ alone. Each launcher
// enqueues on `stream` (a cudaStream_t; nullptr is the legacy default stream) and returns
// 0 or the cudaError_t of the launch (`error_string` names it; the ATen glue turns a
// non-zero status into rlx::Error with the kernel's name).
//
// Kernel families, one file each under src/cuda/, each with a CPU reference in
// reference.hpp and a [cuda] test against it (tests/cuda/kernels_test.cpp):
//   decode_attention   paged split-K decode attention and its merge pass (any GQA group)
//   sample             temperature, top-k, top-p, min-p, greedy (sampling_rule.hpp)
//   add_rms_norm       residual add + RMSNorm;  silu_mul: SiLU(gate) * up
//   rope_append        RoPE on q and k, k and v written into the paged pool
//   rms_norm_backward, rope, silu_mul_backward: the learner's fused ops (fused_grad.cu)
//   gemv               small-batch projections, the norm or SiLU-mul before them folded in
//   decode_gemm        plain projections on tensor cores, up to 256 rows
//
//   rlx::cuda::DecodeAttentionArgs a{.dtype = rlx::cuda::DType::bf16, .q = q, ...};
//   if (int st = rlx::cuda::decode_attention(a, stream)) throw ... rlx::cuda::error_string(st);
#pragma once

#include <cstddef>
#include <cstdint>

namespace rlx::cuda {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

// The CUDA runtime's text for a launcher's status.
const char* error_string(int status);

// Pass 1 of decode attention: `tiled` (fp16/bf16; fp32 takes `split`) computes each (token,
// head) score once and updates the softmax once per 32 tokens; `split` is the first kernel,
// one online-softmax update per token, kept to compare against (RLX_DECODE_ATTENTION=split);
// `mma` (fp16/bf16, sm_80+) computes the scores and the weighted values on tensor cores
// (RLX_DECODE_ATTENTION=mma, the default there); `mma_sequence` does the same arithmetic a
// block a sequence's kv head, its splits in turn with the next one's keys and values loading,
// and merges them itself (the same bits as `mma` and pass 2; RLX_DECODE_ATTENTION=mma-sequence,
// for large batches).
enum class DecodeAttentionKernel : int { tiled = 0, split = 1, mma = 2, mma_sequence = 3 };

struct DecodeAttentionArgs {
  DType dtype = DType::bf16;
  const void* q = nullptr;               // [batch, q_heads, head_dim], rotated
  const void* k_pool = nullptr;          // [num_blocks, kv_heads, block_size, head_dim]
  const void* v_pool = nullptr;          // same layout
  const int32_t* block_tables = nullptr; // [batch, max_blocks]
  const int32_t* context_lens = nullptr; // [batch], >= 1, the new token's key included
  void* out = nullptr;                   // [batch, q_heads, head_dim]
  float* workspace = nullptr;            // decode_attention_workspace(...) floats, 8-byte aligned
  int batch = 0, q_heads = 0, kv_heads = 0, head_dim = 0;  // head_dim 64 or 128
  int block_size = 16, max_blocks = 0;
  int max_context = 0;                   // bound on context_lens: sizes the grid (a graph's capacity)
  float scale = 0;                       // softmax scale, usually 1/sqrt(head_dim)
  DecodeAttentionKernel kernel = DecodeAttentionKernel::tiled;
  // With `mma`: decode_attention_counters(...) ints, zero before the call and left zero after
  // it. The last of a sequence's split blocks to finish then merges the splits itself, and pass
  // 2 is not launched. One set per stream: calls on one stream run one after another.
  int* merge_counters = nullptr;
};
size_t decode_attention_workspace(int batch, int q_heads, int head_dim, int max_context);
size_t decode_attention_counters(int batch, int q_heads, int kv_heads);
int decode_attention(const DecodeAttentionArgs& a, void* stream);

struct SampleArgs {
  DType dtype = DType::f32;
  const void* logits = nullptr;          // [rows, row_stride], the first vocab columns used
  int64_t row_stride = 0;
  int rows = 0, vocab = 0;
  const float* temperature = nullptr;    // [rows]; 0: greedy
  const int32_t* top_k = nullptr;        // [rows]; 0: off
  const double* top_p = nullptr;         // [rows]; 1: off
  const float* min_p = nullptr;          // [rows]; 0: off
  const double* uniform = nullptr;       // [rows] in [0, 1): the philox draw of the row
  int64_t* tokens = nullptr;             // [rows] out
  float* logprobs = nullptr;             // [rows] out: log_softmax(x / T)[token]
  // With a workspace (sample_workspace_bytes(rows)), each row's maximum and softmax sum are
  // taken by `slices` blocks a row (0: as many as fill the device, at most kSampleMaxSlices)
  // before the row's block draws; rows with top-k, top-p or min-p still take the one-block
  // path. Every sum is in integer units: the tokens and log-probs are the same for any slices.
  void* workspace = nullptr;
  int slices = 0;
};
constexpr int kSampleMaxSlices = 64;
size_t sample_workspace_bytes(int rows);
int sample(const SampleArgs& a, void* stream);

// residual <- residual + x (skipped when x is null); out <- RMSNorm(residual) * weight.
// Rounded as HF's Qwen2/Llama modules round in bf16: the sum, the normalised value, the product.
struct AddRmsNormArgs {
  DType dtype = DType::bf16;
  void* residual = nullptr;  // [rows, hidden], updated in place
  const void* x = nullptr;   // [rows, hidden] or null
  const void* weight = nullptr;  // [hidden]
  void* out = nullptr;       // [rows, hidden]
  float* inv_rms = nullptr;  // [rows] or null: 1 / rms of each row, for rms_norm_backward
  int rows = 0, hidden = 0;
  float eps = 1e-6f;
};
int add_rms_norm(const AddRmsNormArgs& a, void* stream);

// The learner's fused ops (src/cuda/fused_grad.cu; model/fused_ops.hpp drives them).
// RMSNorm's backward from the forward's inv_rms: dx in x's dtype, and dw as fp32 partial sums,
// one row of dw_partial a block of kRmsNormBlockRows rows (their sum over blocks is dw).
constexpr int kRmsNormBlockRows = 128;
struct RmsNormBackwardArgs {
  DType dtype = DType::bf16;
  const void* x = nullptr;         // [rows, hidden], the forward's input
  const void* weight = nullptr;    // [hidden]
  const float* inv_rms = nullptr;  // [rows]
  const void* grad = nullptr;      // [rows, hidden], d out
  void* dx = nullptr;              // [rows, hidden]
  float* dw_partial = nullptr;     // [ceil(rows / kRmsNormBlockRows), hidden]
  int rows = 0, hidden = 0;
};
int rms_norm_backward(const RmsNormBackwardArgs& a, void* stream);
// RoPE over x [batch, time, heads, head_dim] (head_dim contiguous, other strides free) with
// per-position tables cos, sin [batch, time, head_dim]: out (contiguous) = (x cos +
// rotate_half(x) sin) scale, or with `transpose` its adjoint (the backward of the same tables).
struct RopeArgs {
  DType dtype = DType::bf16;
  const void* x = nullptr;
  int64_t stride_batch = 0, stride_time = 0, stride_head = 0;  // x's, in elements
  const void* cos = nullptr;
  const void* sin = nullptr;
  void* out = nullptr;
  int64_t rows = 0;  // batch * time
  int time = 0, heads = 0, head_dim = 0;
  float scale = 1.0f;
  bool transpose = false;
};
int rope(const RopeArgs& a, void* stream);
// d gate_up [rows, 2 inter] of silu_mul from its input gate_up and d out [rows, inter].
int silu_mul_backward(DType dtype, const void* gate_up, const void* grad, void* dgate_up, int64_t rows, int inter,
                      void* stream);

// The learner's log-prob head over a chunk of logits [rows, vocab] (src/cuda/logprob_head.cu):
// forward writes the fp32 log-sum-exp, the target's log-prob and (if `entropy`) the entropy per
// row; backward overwrites the logits with their gradient, in their dtype.
struct HeadForwardArgs {
  DType dtype = DType::bf16;
  const void* logits = nullptr;     // [rows, vocab], contiguous
  const int64_t* targets = nullptr; // [rows]
  float* lse = nullptr;             // [rows]
  float* logp = nullptr;            // [rows]
  float* entropy = nullptr;         // [rows] or null
  int rows = 0;
  int64_t vocab = 0;
};
int head_forward(const HeadForwardArgs& a, void* stream);
struct HeadBackwardArgs {
  DType dtype = DType::bf16;
  void* logits = nullptr;            // [rows, vocab]: in, the logits; out, d logits
  const int64_t* targets = nullptr;  // [rows]
  const float* lse = nullptr;        // [rows], from the forward
  const float* entropy = nullptr;    // [rows], from the forward (needed with g_entropy)
  const float* g_logp = nullptr;     // [rows] or null (no gradient)
  const float* g_entropy = nullptr;  // [rows] or null
  int rows = 0;
  int64_t vocab = 0;
};
int head_backward(const HeadBackwardArgs& a, void* stream);

// out [m, n] = x [m, k] w [n, k]^T (+ bias [n]) for m <= kGemvMaxRows, fp16/bf16, k a
// multiple of 8, x, w and the norm's operands 16-byte aligned and contiguous: decode's
// projections at small batch. The layer op before a projection can be taken on the way in
// (`input`), its own kernel then skipped; the product equals that kernel's output times w^T,
// bit for bit:
//   add_rms_norm  x is the residual stream [m, k]: RMSNorm(x + add) * norm_weight, as
//                 add_rms_norm computes it; x + add is written to residual_out ([m, k], not
//                 x's or add's memory). No add: RMSNorm(x), nothing written. k at most
//                 kGemvNormMaxWidth, m k 2 bytes at most kGemvNormBytes (the normalised rows
//                 sit in shared memory).
//   silu_mul      x is gate_up [m, 2 k]: SiLU(gate) * up, as silu_mul computes it.
// w is read before the kernel waits for the kernels launched before it on the stream (with
// programmatic dependent launch several may still run): no kernel since the stream's last
// launch without it may write w. Model weights qualify (they change by copies between decode
// steps); the experts' indices, a router's output, are read after the wait.
constexpr int kGemvMaxRows = 8;
constexpr int kGemvNormBytes = 40 * 1024;
constexpr int kGemvNormMaxWidth = 8192;
enum class GemvInput : int { plain = 0, add_rms_norm = 1, silu_mul = 2 };
// Expert-indexed (a mixture of experts' decode, `experts` set; plain input): w is [E, n, k],
// the stacked weights of E experts, and each of the m rows of out has its own: out[i] =
// x[i / x_share] w[experts[i]]^T (m up to kGemvMaxExpertRows; no bias). Only the chosen
// experts' weights are read.
constexpr int kGemvMaxExpertRows = 65535;
struct GemvArgs {
  DType dtype = DType::bf16;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;  // or null
  void* out = nullptr;
  int m = 0;
  int64_t n = 0, k = 0;
  const int64_t* experts = nullptr;  // [m], each in [0, E), or null
  int x_share = 1;                   // rows of out per row of x (the top-k slots of a token)
  GemvInput input = GemvInput::plain;
  const void* add = nullptr;          // add_rms_norm: [m, k] or null
  const void* norm_weight = nullptr;  // add_rms_norm: [k]
  void* residual_out = nullptr;       // add_rms_norm with add: [m, k]
  float eps = 1e-6f;                  // add_rms_norm
};
int gemv(const GemvArgs& a, void* stream);

// The product on tensor cores for decode's batches past the GEMV's: m up to kDecodeGemmMaxRows,
// k a multiple of kDecodeGemmWidthStep, n at most kDecodeGemmMaxCols, sm_80 and newer; plain,
// GemvInput::silu_mul (x is then gate_up [m, 2 k]) or GemvInput::add_rms_norm (k at most
// kGemvNormMaxWidth; the GEMV's rules for add and residual_out); no experts. Each row's sum is
// ordered by k and n alone: a row of x gives the same bits in any batch this kernel takes.
constexpr int kDecodeGemmMaxRows = 256;
constexpr int kDecodeGemmWidthStep = 64;
constexpr int64_t kDecodeGemmMaxCols = int64_t{65535} * 16;
int decode_gemm(const GemvArgs& a, void* stream);

// out[r, i] = SiLU(gate_up[r, i]) * gate_up[r, inter + i]  (the gate/up GEMM's output halves).
int silu_mul(DType dtype, const void* gate_up, void* out, int rows, int inter, void* stream);

// For each new token r at `positions[r]`: the q heads of qkv[r] rotated into q_out[r]; its k
// heads rotated and its v heads copied into the pools at `slots[r]` (block * block_size +
// offset). qkv is the fused projection's output, [rows, (q_heads + 2 kv_heads) * head_dim].
// With q_norm and k_norm (Qwen3's per-head RMSNorm, weights [head_dim] in the activation
// dtype), each q and k head is normalised first, as HF's module rounds it.
struct RopeAppendArgs {
  DType dtype = DType::bf16;
  const void* qkv = nullptr;
  const int64_t* positions = nullptr;  // [rows]
  const int64_t* slots = nullptr;      // [rows]
  const float* inv_freq = nullptr;     // [head_dim / 2], the model's (scaling applied)
  void* q_out = nullptr;               // [rows, q_heads, head_dim]
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  int rows = 0, q_heads = 0, kv_heads = 0, head_dim = 0, block_size = 16;
  const void* q_norm = nullptr;  // both or neither
  const void* k_norm = nullptr;
  float norm_eps = 1e-6f;
};
int rope_append(const RopeAppendArgs& a, void* stream);

}  // namespace rlx::cuda
