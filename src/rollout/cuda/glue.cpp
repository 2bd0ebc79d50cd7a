#include "rollout/cuda/glue.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/rollout/cuda/kernels.hpp"

namespace rlx::cuda {
namespace {

void check(const char* kernel, int status) {
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

// Appends `v` to `bytes` at an offset aligned for T; returns the offset.
template <class T, class V>
size_t append(std::vector<uint8_t>& bytes, const std::vector<V>& v) {
  const size_t at = (bytes.size() + alignof(T) - 1) / alignof(T) * alignof(T);
  bytes.resize(at + v.size() * sizeof(T));
  for (size_t i = 0; i < v.size(); ++i) {
    const T x = static_cast<T>(v[i]);
    std::memcpy(bytes.data() + at + i * sizeof(T), &x, sizeof(T));
  }
  return at;
}

}  // namespace

Sampled sample_on_device(const at::Tensor& logits_in, const SamplingBatch& b) {
  const c10::cuda::CUDAGuard guard(logits_in.device());
  auto logits = logits_in;
  if (logits.scalar_type() != at::kFloat && logits.scalar_type() != at::kHalf && logits.scalar_type() != at::kBFloat16)
    logits = logits.to(at::kFloat);
  if (logits.stride(1) != 1) logits = logits.contiguous();
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  RLX_CHECK(vocab < (int64_t{1} << 23), "sample: a vocabulary of {} tokens is above the sampler's 2^23", vocab);

  std::vector<uint8_t> bytes;
  const size_t top_p = append<double>(bytes, b.top_p), uniform = append<double>(bytes, b.uniform);
  const size_t temperature = append<float>(bytes, b.temperature), min_p = append<float>(bytes, b.min_p);
  const size_t top_k = append<int32_t>(bytes, b.top_k);
  auto host = at::empty({static_cast<int64_t>(bytes.size())}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  auto params = host.to(logits.device(), /*non_blocking=*/true);
  const auto* base = params.data_ptr<uint8_t>();

  auto tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  auto logprobs = at::empty({rows}, logits.options().dtype(at::kFloat));
  SampleArgs a{.dtype = dtype_of(logits),
               .logits = logits.data_ptr(),
               .row_stride = logits.stride(0),
               .rows = static_cast<int>(rows),
               .vocab = static_cast<int>(vocab),
               .temperature = reinterpret_cast<const float*>(base + temperature),
               .top_k = reinterpret_cast<const int32_t*>(base + top_k),
               .top_p = reinterpret_cast<const double*>(base + top_p),
               .min_p = reinterpret_cast<const float*>(base + min_p),
               .uniform = reinterpret_cast<const double*>(base + uniform),
               .tokens = tokens.data_ptr<int64_t>(),
               .logprobs = logprobs.data_ptr<float>()};
  check("sample", sample(a, c10::cuda::getCurrentCUDAStream().stream()));
  return {tokens, logprobs};
}

bool decode_attention_supported(const at::Tensor& q, const at::Tensor& k_pool) {
  const auto t = q.scalar_type();
  return q.is_cuda() && k_pool.scalar_type() == t && (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) &&
         (k_pool.size(3) == 64 || k_pool.size(3) == 128);
}

at::Tensor decode_attention_on_device(const at::Tensor& q_in, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                      const at::Tensor& block_tables, const at::Tensor& context_lens,
                                      int64_t max_context, double scale) {
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
                        .scale = static_cast<float>(scale)};
  check("decode_attention", decode_attention(a, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

}  // namespace rlx::cuda
