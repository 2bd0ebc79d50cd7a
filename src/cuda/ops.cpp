#include "cuda/ops.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <limits>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/cuda/kernels.hpp"

namespace rlx::cuda {

void check_launch(const char* kernel, int status) {
  RLX_CHECK(status == 0, "CUDA kernel {}: {}", kernel, error_string(status));
}

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::f32;
    case at::kHalf: return DType::f16;
    case at::kBFloat16: return DType::bf16;
    default: RLX_CHECK(false, "CUDA kernels take float32, float16 or bfloat16 tensors, not {}", c10::toString(t.scalar_type()));
  }
  return DType::f32;
}

bool head_on_device_supported(const at::Tensor& z) {
  const auto t = z.scalar_type();
  return z.is_cuda() && z.dim() == 2 && z.is_contiguous() && (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) &&
         z.size(0) <= std::numeric_limits<int>::max();
}

void head_forward_on_device(const at::Tensor& z, const at::Tensor& targets, at::Tensor& lse, at::Tensor& logp,
                            at::Tensor& ent) {
  const c10::cuda::CUDAGuard guard(z.device());
  RLX_ASSERT(head_on_device_supported(z) && targets.scalar_type() == at::kLong && lse.is_contiguous() &&
                 logp.is_contiguous() && lse.scalar_type() == at::kFloat && logp.scalar_type() == at::kFloat,
             "head_forward_on_device: logits {} {}", z.sizes(), c10::toString(z.scalar_type()));
  const auto t = targets.contiguous();
  const bool with_ent = ent.numel() == z.size(0);
  RLX_ASSERT(!with_ent || (ent.is_contiguous() && ent.scalar_type() == at::kFloat), "head_forward_on_device: entropy");
  HeadForwardArgs a{.dtype = dtype_of(z),
                    .logits = z.data_ptr(),
                    .targets = t.data_ptr<int64_t>(),
                    .lse = lse.data_ptr<float>(),
                    .logp = logp.data_ptr<float>(),
                    .entropy = with_ent ? ent.data_ptr<float>() : nullptr,
                    .rows = static_cast<int>(z.size(0)),
                    .vocab = z.size(1)};
  check_launch("head_forward", head_forward(a, c10::cuda::getCurrentCUDAStream().stream()));
}

void head_backward_on_device(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, const at::Tensor& ent,
                             const at::Tensor& g_logp, const at::Tensor& g_ent) {
  const c10::cuda::CUDAGuard guard(z.device());
  RLX_ASSERT(head_on_device_supported(z) && targets.scalar_type() == at::kLong && lse.scalar_type() == at::kFloat,
             "head_backward_on_device: logits {} {}", z.sizes(), c10::toString(z.scalar_type()));
  const auto t = targets.contiguous();
  const auto l = lse.contiguous();
  const auto gl = g_logp.defined() ? g_logp.to(at::kFloat).contiguous() : at::Tensor();
  const bool with_ent = g_ent.defined() && ent.numel() == z.size(0);
  const auto ge = with_ent ? g_ent.to(at::kFloat).contiguous() : at::Tensor();
  const auto e = with_ent ? ent.contiguous() : at::Tensor();
  HeadBackwardArgs a{.dtype = dtype_of(z),
                     .logits = z.data_ptr(),
                     .targets = t.data_ptr<int64_t>(),
                     .lse = l.data_ptr<float>(),
                     .entropy = with_ent ? e.data_ptr<float>() : nullptr,
                     .g_logp = gl.defined() ? gl.data_ptr<float>() : nullptr,
                     .g_entropy = with_ent ? ge.data_ptr<float>() : nullptr,
                     .rows = static_cast<int>(z.size(0)),
                     .vocab = z.size(1)};
  check_launch("head_backward", head_backward(a, c10::cuda::getCurrentCUDAStream().stream()));
}

namespace {
bool has_mma(at::Device device);

// The tensor-core kernel where the device has tensor cores for it (sm_80 and newer): on an
// H200 (2026-11-28, 27b1eeb) it made the decode step 1.43x / 1.65x / 1.97x the tiled kernel's
// at batch 1 / 64 / 256 (docs/PERF.md). RLX_DECODE_ATTENTION=tiled, mma, mma-sequence or split
// chooses.
DecodeAttentionKernel decode_attention_kernel(at::Device device) {
  using K = DecodeAttentionKernel;
  static const std::optional<K> chosen = []() -> std::optional<K> {
    const char* v = std::getenv("RLX_DECODE_ATTENTION");
    if (v == nullptr) return std::nullopt;
    for (const auto& [name, kernel] : {std::pair{"tiled", K::tiled}, std::pair{"split", K::split},
                                       std::pair{"mma", K::mma}, std::pair{"mma-sequence", K::mma_sequence}})
      if (std::strcmp(v, name) == 0) return kernel;
    throw Error(fmt::format("RLX_DECODE_ATTENTION={:?}: expected tiled, mma, mma-sequence or split", v));
  }();
  if (!chosen) return has_mma(device) ? K::mma : K::tiled;
  RLX_CHECK((*chosen != K::mma && *chosen != K::mma_sequence) || has_mma(device),
            "RLX_DECODE_ATTENTION: {} has no sm_80 tensor cores for the tensor-core kernels (tiled or split run there)",
            device.str());
  return *chosen;
}
}  // namespace

bool decode_attention_supported(const at::Tensor& q, const at::Tensor& k_pool) {
  const auto t = q.scalar_type();
  return q.is_cuda() && k_pool.scalar_type() == t && (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) &&
         (k_pool.size(3) == 64 || k_pool.size(3) == 128);
}

at::Tensor decode_attention_on_device(const at::Tensor& q_in, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                      const at::Tensor& block_tables, const at::Tensor& context_lens,
                                      int64_t max_context, double scale, const at::Tensor& merge_counters) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  RLX_ASSERT(q_in.dim() == 3 && k_pool.dim() == 4 && k_pool.is_contiguous() && v_pool.is_contiguous() &&
                 block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt,
             "decode_attention_on_device: q {}, pool {}", q_in.sizes(), k_pool.sizes());
  const auto q = q_in.contiguous();
  const int64_t seqs = q.size(0), q_heads = q.size(1), head_dim = q.size(2);
  auto out = at::empty_like(q);
  auto workspace = at::empty({static_cast<int64_t>(decode_attention_workspace(
                                 static_cast<int>(seqs), static_cast<int>(q_heads), static_cast<int>(head_dim),
                                 static_cast<int>(max_context)))},
                             q.options().dtype(at::kFloat));
  const auto tables = block_tables.contiguous();
  DecodeAttentionArgs a{.dtype = dtype_of(q),
                        .q = q.data_ptr(),
                        .k_pool = k_pool.data_ptr(),
                        .v_pool = v_pool.data_ptr(),
                        .block_tables = tables.data_ptr<int32_t>(),
                        .context_lens = context_lens.data_ptr<int32_t>(),
                        .out = out.data_ptr(),
                        .workspace = workspace.data_ptr<float>(),
                        .batch = static_cast<int>(seqs),
                        .q_heads = static_cast<int>(q_heads),
                        .kv_heads = static_cast<int>(k_pool.size(1)),
                        .head_dim = static_cast<int>(head_dim),
                        .block_size = static_cast<int>(k_pool.size(2)),
                        .max_blocks = static_cast<int>(tables.size(1)),
                        .max_context = static_cast<int>(max_context),
                        .scale = static_cast<float>(scale),
                        .kernel = decode_attention_kernel(q.device())};
  const auto counters = decode_attention_counters(a.batch, a.q_heads, a.kv_heads);
  if (a.kernel == DecodeAttentionKernel::mma && merge_counters.defined() &&
      merge_counters.numel() >= static_cast<int64_t>(counters))
    a.merge_counters = merge_counters.data_ptr<int32_t>();
  check_launch("decode_attention", decode_attention(a, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

namespace {
// RMSNorm(residual (+ x)) * weight in one kernel; with x, residual <- residual + x first. The
// kernel writes `residual` only where it adds an x.
at::Tensor launch_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps,
                           const char* what, float* inv_rms = nullptr) {
  const c10::cuda::CUDAGuard guard(residual.device());
  RLX_ASSERT(residual.is_contiguous() && (!x.defined() || (x.sizes() == residual.sizes() && x.is_contiguous() &&
                                                            x.scalar_type() == residual.scalar_type())) &&
                 weight.scalar_type() == residual.scalar_type() && weight.numel() == residual.size(-1),
             "{}: residual {}, x {}, weight {}", what, residual.sizes(), x.defined() ? x.sizes() : at::IntArrayRef{},
             weight.sizes());
  auto out = at::empty_like(residual);
  const int64_t hidden = residual.size(-1);
  if (out.numel() == 0) return out;
  AddRmsNormArgs a{.dtype = dtype_of(residual),
                   .residual = const_cast<void*>(residual.data_ptr()),
                   .x = x.defined() ? x.data_ptr() : nullptr,
                   .weight = weight.data_ptr(),
                   .out = out.data_ptr(),
                   .inv_rms = inv_rms,
                   .rows = static_cast<int>(residual.numel() / hidden),
                   .hidden = static_cast<int>(hidden),
                   .eps = static_cast<float>(eps)};
  check_launch(what, cuda::add_rms_norm(a, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}
}  // namespace

at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps) {
  return launch_rms_norm(residual, x.contiguous(), weight, eps, "add_rms_norm");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return launch_rms_norm(x.contiguous(), at::Tensor(), weight, eps, "rms_norm");
}

std::pair<at::Tensor, at::Tensor> rms_norm_with_inv(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  const auto x = x_in.contiguous();
  auto inv = at::empty({x.numel() / std::max<int64_t>(1, x.size(-1))}, x.options().dtype(at::kFloat));
  auto y = launch_rms_norm(x, at::Tensor(), weight.contiguous(), eps, "rms_norm", inv.data_ptr<float>());
  return {y, inv};
}

std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& x_in, const at::Tensor& weight_in,
                                                    const at::Tensor& inv_rms, const at::Tensor& grad_in) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous(), weight = weight_in.contiguous(), grad = grad_in.contiguous();
  const int64_t hidden = x.size(-1), rows = hidden ? x.numel() / hidden : 0;
  RLX_ASSERT(grad.sizes() == x.sizes() && grad.scalar_type() == x.scalar_type() && weight.numel() == hidden &&
                 weight.scalar_type() == x.scalar_type() && inv_rms.numel() == rows &&
                 inv_rms.scalar_type() == at::kFloat && inv_rms.is_contiguous() &&
                 rows <= std::numeric_limits<int>::max(),
             "rms_norm_backward: x {}, grad {}, weight {}, inv_rms {}", x.sizes(), grad.sizes(), weight.sizes(),
             inv_rms.sizes());
  auto dx = at::empty_like(x);
  if (x.numel() == 0) return {dx, at::zeros_like(weight)};
  const int64_t blocks = std::max<int64_t>(1, (rows + kRmsNormBlockRows - 1) / kRmsNormBlockRows);
  RLX_CHECK(blocks <= 65535, "rms_norm_backward: {} rows is more than the kernel's grid takes ({})", rows,
            65535 * kRmsNormBlockRows);
  auto partial = at::empty({blocks, hidden}, x.options().dtype(at::kFloat));
  RmsNormBackwardArgs a{.dtype = dtype_of(x),
                        .x = x.data_ptr(),
                        .weight = weight.data_ptr(),
                        .inv_rms = inv_rms.data_ptr<float>(),
                        .grad = grad.data_ptr(),
                        .dx = dx.data_ptr(),
                        .dw_partial = partial.data_ptr<float>(),
                        .rows = static_cast<int>(rows),
                        .hidden = static_cast<int>(hidden)};
  check_launch("rms_norm_backward", cuda::rms_norm_backward(a, c10::cuda::getCurrentCUDAStream().stream()));
  return {dx, partial.sum(0).to(weight.scalar_type())};
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in, double scale, bool transpose) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  RLX_ASSERT(x.dim() == 4 && x.stride(3) == 1 && D % 2 == 0 && cos.sizes() == at::IntArrayRef({B, T, D}) &&
                 sin.sizes() == cos.sizes() && cos.scalar_type() == x.scalar_type() &&
                 sin.scalar_type() == x.scalar_type() && T <= std::numeric_limits<int>::max(),
             "rope: x {}, cos {}, sin {}", x.sizes(), cos.sizes(), sin.sizes());
  auto out = at::empty({B, T, H, D}, x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  RopeArgs a{.dtype = dtype_of(x),
             .x = x.data_ptr(),
             .stride_batch = x.stride(0),
             .stride_time = x.stride(1),
             .stride_head = x.stride(2),
             .cos = cos.data_ptr(),
             .sin = sin.data_ptr(),
             .out = out.data_ptr(),
             .rows = B * T,
             .time = static_cast<int>(T),
             .heads = static_cast<int>(H),
             .head_dim = static_cast<int>(D),
             .scale = static_cast<float>(scale),
             .transpose = transpose};
  check_launch("rope", cuda::rope(a, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

at::Tensor silu_mul_backward(const at::Tensor& gate_up_in, const at::Tensor& grad_in) {
  const c10::cuda::CUDAGuard guard(gate_up_in.device());
  const auto gate_up = gate_up_in.contiguous(), grad = grad_in.contiguous();
  const int64_t inter = gate_up.size(-1) / 2, rows = inter ? gate_up.numel() / (2 * inter) : 0;
  RLX_ASSERT(grad.numel() == rows * inter && grad.scalar_type() == gate_up.scalar_type() &&
                 inter <= std::numeric_limits<int>::max(),
             "silu_mul_backward: gate_up {}, grad {}", gate_up.sizes(), grad.sizes());
  auto d = at::empty_like(gate_up);
  if (d.numel() == 0) return d;
  check_launch("silu_mul_backward",
               cuda::silu_mul_backward(dtype_of(gate_up), gate_up.data_ptr(), grad.data_ptr(), d.data_ptr(), rows,
                                       static_cast<int>(inter), c10::cuda::getCurrentCUDAStream().stream()));
  return d;
}

at::Tensor rope_append(const at::Tensor& qkv_in, const at::Tensor& positions, const at::Tensor& slots,
                       const at::Tensor& inv_freq, at::Tensor& k_pool, at::Tensor& v_pool, int64_t q_heads,
                       const at::Tensor& q_norm, const at::Tensor& k_norm, double eps) {
  const c10::cuda::CUDAGuard guard(qkv_in.device());
  const auto qkv = qkv_in.contiguous();
  const int64_t rows = qkv.size(0), kv_heads = k_pool.size(1), block_size = k_pool.size(2), head_dim = k_pool.size(3);
  RLX_ASSERT(qkv.dim() == 2 && qkv.size(1) == (q_heads + 2 * kv_heads) * head_dim && positions.numel() == rows &&
                 slots.numel() == rows && positions.scalar_type() == at::kLong && slots.scalar_type() == at::kLong &&
                 inv_freq.scalar_type() == at::kFloat && inv_freq.numel() == head_dim / 2 &&
                 k_pool.scalar_type() == qkv.scalar_type(),
             "rope_append: qkv {}, pool {}", qkv.sizes(), k_pool.sizes());
  const bool normed = q_norm.defined();
  RLX_ASSERT(normed == k_norm.defined() &&
                 (!normed || (q_norm.numel() == head_dim && k_norm.numel() == head_dim &&
                              q_norm.scalar_type() == qkv.scalar_type() && k_norm.scalar_type() == qkv.scalar_type() &&
                              q_norm.is_contiguous() && k_norm.is_contiguous())),
             "rope_append: q/k norm weights must both be [{}] contiguous of qkv's dtype", head_dim);
  auto q = at::empty({rows, q_heads, head_dim}, qkv.options());
  const auto pos = positions.contiguous(), sl = slots.contiguous(), freq = inv_freq.contiguous();
  RopeAppendArgs a{.dtype = dtype_of(qkv),
                   .qkv = qkv.data_ptr(),
                   .positions = pos.data_ptr<int64_t>(),
                   .slots = sl.data_ptr<int64_t>(),
                   .inv_freq = freq.data_ptr<float>(),
                   .q_out = q.data_ptr(),
                   .k_pool = k_pool.data_ptr(),
                   .v_pool = v_pool.data_ptr(),
                   .rows = static_cast<int>(rows),
                   .q_heads = static_cast<int>(q_heads),
                   .kv_heads = static_cast<int>(kv_heads),
                   .head_dim = static_cast<int>(head_dim),
                   .block_size = static_cast<int>(block_size),
                   .q_norm = normed ? q_norm.data_ptr() : nullptr,
                   .k_norm = normed ? k_norm.data_ptr() : nullptr,
                   .norm_eps = static_cast<float>(eps)};
  check_launch("rope_append", cuda::rope_append(a, c10::cuda::getCurrentCUDAStream().stream()));
  return q;
}

namespace {
// Whether the environment variable is "1". Read at each call, about 0.2 us (a [cuda] test
// compares both paths in one process; a graph's replay calls nothing).
bool switched_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Whether the device runs the tensor-core kernels (sm_80 and newer), asked once a device.
bool has_mma(at::Device device) {
  static std::array<std::atomic<int>, 64> known{};  // 0 not asked, 1 no, 2 yes
  const int i = device.index() < 0 ? 0 : device.index();
  if (i >= static_cast<int>(known.size())) return false;
  if (known[static_cast<size_t>(i)].load() == 0) {
    int major = 0;
    const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) == cudaSuccess && major >= 8;
    known[static_cast<size_t>(i)].store(yes ? 2 : 1);
  }
  return known[static_cast<size_t>(i)].load() == 2;
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// The rows decode's dense projections give the GEMV (where gemv_enabled()): one. At 8 rows its
// step was 0.38x cuBLAS's (H200, a3976e4: 3.138 ms against 1.188), at one 1.01x.
constexpr int64_t kGemvDenseRows = 1;

// Whether the GEMV takes x [..., k] (with `silu`, gate_up [..., 2 k]) against w [n, k] (+ b):
// fp16/bf16 on CUDA, k a multiple of 8, at most `max_rows` rows, x and w contiguous and
// 16-byte aligned.
bool gemv_fits(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool silu = false,
               int64_t max_rows = kGemvDenseRows) {
  const auto t = x.scalar_type();
  if (!x.is_cuda() || x.dim() < 1 || w.dim() != 2 || (t != at::kHalf && t != at::kBFloat16) || w.scalar_type() != t)
    return false;
  const int64_t k = w.size(1), width = silu ? 2 * k : k, rows = width > 0 ? x.numel() / width : 0;
  return x.size(-1) == width && k > 0 && k % 8 == 0 && rows >= 1 && rows <= max_rows && x.is_contiguous() &&
         w.is_contiguous() && aligned16(x) && aligned16(w) &&
         (!b.defined() || (b.scalar_type() == t && b.is_contiguous() && b.numel() == w.size(0)));
}

// The GEMV's output for x's rows against w, and the arguments that fill it.
std::pair<at::Tensor, GemvArgs> gemv_out(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  auto out = at::empty(sizes, x.options());
  GemvArgs a{.dtype = dtype_of(x),
             .x = x.data_ptr(),
             .w = w.data_ptr(),
             .bias = b.defined() ? b.data_ptr() : nullptr,
             .out = out.data_ptr(),
             .m = static_cast<int>(x.numel() / x.size(-1)),
             .n = w.size(0),
             .k = w.size(1)};
  return {out, a};
}
}  // namespace

// Opt-in: on an H200 (2026-11-28, fa07f15) cuBLAS's projections made a batch-1 decode step
// 1.706 ms where the GEMV before its rebuild made it 1.879 ms (docs/PERF.md).
bool gemv_enabled() { return switched_on("RLX_GEMV"); }
bool decode_gemm_enabled() { return switched_on("RLX_DECODE_GEMM"); }

namespace {
// Whether decode_gemm_enabled() and the tensor-core GEMM takes x (with `silu`, gate_up) against w.
bool decode_gemm_fits(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool silu) {
  return decode_gemm_enabled() && gemv_fits(x, w, b, silu, kDecodeGemmMaxRows) &&
         w.size(1) % kDecodeGemmWidthStep == 0 && w.size(0) <= kDecodeGemmMaxCols && has_mma(x.device());
}
}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (gemv_enabled() && gemv_fits(x, w, b)) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto [out, a] = gemv_out(x, w, b);
    check_launch("gemv", gemv(a, c10::cuda::getCurrentCUDAStream().stream()));
    return out;
  }
  if (decode_gemm_fits(x, w, b, /*silu=*/false)) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto [out, a] = gemv_out(x, w, b);
    check_launch("decode_gemm", decode_gemm(a, c10::cuda::getCurrentCUDAStream().stream()));
    return out;
  }
  return at::linear(x, w, b);
}

std::pair<at::Tensor, at::Tensor> norm_linear(const at::Tensor& h, const at::Tensor& add, const at::Tensor& weight,
                                              double eps, const at::Tensor& w, const at::Tensor& b) {
  const int64_t k = h.size(-1);
  if (k > kGemvNormMaxWidth || weight.scalar_type() != h.scalar_type() || weight.numel() != k ||
      !weight.is_contiguous() || !aligned16(weight) ||
      (add.defined() &&
       (add.sizes() != h.sizes() || add.scalar_type() != h.scalar_type() || !add.is_contiguous() || !aligned16(add))))
    return {};
  // The GEMV stages the normalised rows in shared memory (at most kGemvNormBytes of them); rows
  // the GEMV takes but cannot fold are refused, not sent to the decode GEMM (linear() would
  // take the GEMV for them: another sum order).
  const bool gemv_rows = gemv_enabled() && gemv_fits(h, w, b);
  const bool small = gemv_rows && h.numel() * 2 <= kGemvNormBytes;
  if (!small && (gemv_rows || !decode_gemm_fits(h, w, b, /*silu=*/false))) return {};
  const c10::cuda::CUDAGuard guard(h.device());
  auto [out, a] = gemv_out(h, w, b);
  at::Tensor sum = add.defined() ? at::empty_like(h) : h;  // not h's memory: other blocks still read h
  a.input = GemvInput::add_rms_norm;
  a.add = add.defined() ? add.data_ptr() : nullptr;
  a.norm_weight = weight.data_ptr();
  a.residual_out = add.defined() ? sum.data_ptr() : nullptr;
  a.eps = static_cast<float>(eps);
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  if (small)
    check_launch("gemv (add + RMSNorm)", gemv(a, stream));
  else
    check_launch("decode_gemm (add + RMSNorm)", decode_gemm(a, stream));
  return {out, sum};
}

at::Tensor silu_linear(const at::Tensor& gate_up, const at::Tensor& w, const at::Tensor& b) {
  const bool small = gemv_enabled() && gemv_fits(gate_up, w, b, /*silu=*/true);
  if (!small && !decode_gemm_fits(gate_up, w, b, /*silu=*/true)) return {};
  const c10::cuda::CUDAGuard guard(gate_up.device());
  auto [out, a] = gemv_out(gate_up, w, b);
  a.input = GemvInput::silu_mul;
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  if (small)
    check_launch("gemv (SiLU-mul)", gemv(a, stream));
  else
    check_launch("decode_gemm (SiLU-mul)", decode_gemm(a, stream));
  return out;
}

at::Tensor expert_linear(const at::Tensor& x, const at::Tensor& w_all, const at::Tensor& experts) {
  const auto t = x.scalar_type();
  const int64_t k = x.size(-1), pairs = experts.numel();
  if (!x.is_cuda() || (t != at::kHalf && t != at::kBFloat16) || x.dim() != 2 || w_all.dim() != 3 ||
      w_all.scalar_type() != t || w_all.size(2) != k || k % 8 != 0 || experts.dim() != 2 ||
      experts.size(0) != x.size(0) || experts.scalar_type() != at::kLong || pairs < 1 || pairs > kGemvMaxExpertRows ||
      !x.is_contiguous() || !w_all.is_contiguous() || !aligned16(x) || !aligned16(w_all))
    return {};
  const c10::cuda::CUDAGuard guard(x.device());
  const auto e = experts.contiguous();
  auto out = at::empty({x.size(0), experts.size(1), w_all.size(1)}, x.options());
  GemvArgs a{.dtype = dtype_of(x),
             .x = x.data_ptr(),
             .w = w_all.data_ptr(),
             .out = out.data_ptr(),
             .m = static_cast<int>(pairs),
             .n = w_all.size(1),
             .k = k,
             .experts = e.data_ptr<int64_t>(),
             .x_share = static_cast<int>(experts.size(1))};
  check_launch("gemv (experts)", gemv(a, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up_in) {
  const c10::cuda::CUDAGuard guard(gate_up_in.device());
  const auto gate_up = gate_up_in.contiguous();
  const int64_t inter = gate_up.size(-1) / 2;
  auto sizes = gate_up.sizes().vec();
  sizes.back() = inter;
  auto out = at::empty(sizes, gate_up.options());
  if (out.numel() == 0) return out;
  check_launch("silu_mul", cuda::silu_mul(dtype_of(gate_up), gate_up.data_ptr(), out.data_ptr(),
                                   static_cast<int>(gate_up.numel() / (2 * inter)), static_cast<int>(inter),
                                   c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

}  // namespace rlx::cuda
