#include "rollout/cuda/glue.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>

#include "rlx/core/error.hpp"
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

}  // namespace rlx::cuda
