#include "rollout/sampling_device.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <cstring>

#include "cuda/ops.hpp"
#include "rlx/core/error.hpp"
#include "rlx/cuda/kernels.hpp"

namespace rlx::cuda {
namespace {

// Byte offsets of the parameter columns for `rows` rows.
struct ParamsLayout {
  int64_t top_p, uniform, temperature, min_p, top_k, bytes;
  explicit ParamsLayout(int64_t rows)
      : top_p(0),
        uniform(rows * 8),
        temperature(rows * 16),
        min_p(rows * 20),
        top_k(rows * 24),
        bytes(rows * 28) {}
};

}  // namespace

SamplingParamsBuffer::SamplingParamsBuffer(int64_t max_rows, at::Device device) : max_rows_(max_rows) {
  const ParamsLayout l(max_rows);
  host_ = at::zeros({l.bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  device_ = at::zeros({l.bytes}, at::TensorOptions().dtype(at::kByte).device(device));
}

void SamplingParamsBuffer::stage(const SamplingBatch& b, int64_t rows) {
  RLX_ASSERT(static_cast<int64_t>(b.size()) <= rows && rows <= max_rows_, "SamplingParamsBuffer: {} rows in {} of {}",
             b.size(), rows, max_rows_);
  const ParamsLayout l(max_rows_);
  auto* h = host_.data_ptr<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const bool real = r < static_cast<int64_t>(b.size());
    const size_t i = static_cast<size_t>(r);
    const double top_p = real ? b.top_p[i] : 1.0, uniform = real ? b.uniform[i] : 0.0;
    const float temperature = real ? static_cast<float>(b.temperature[i]) : 0.0f;
    const float min_p = real ? static_cast<float>(b.min_p[i]) : 0.0f;
    const int32_t top_k = real ? static_cast<int32_t>(b.top_k[i]) : 0;
    std::memcpy(h + l.top_p + r * 8, &top_p, 8);
    std::memcpy(h + l.uniform + r * 8, &uniform, 8);
    std::memcpy(h + l.temperature + r * 4, &temperature, 4);
    std::memcpy(h + l.min_p + r * 4, &min_p, 4);
    std::memcpy(h + l.top_k + r * 4, &top_k, 4);
  }
  device_.copy_(host_, /*non_blocking=*/true);
}

void SamplingParamsBuffer::sample(const at::Tensor& logits_in, at::Tensor& tokens, at::Tensor& logprobs) const {
  auto logits = logits_in;
  if (logits.scalar_type() != at::kFloat && logits.scalar_type() != at::kHalf && logits.scalar_type() != at::kBFloat16)
    logits = logits.to(at::kFloat);
  if (logits.stride(1) != 1) logits = logits.contiguous();
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  RLX_CHECK(vocab < (int64_t{1} << 23), "sample: a vocabulary of {} tokens is above the sampler's 2^23", vocab);
  RLX_ASSERT(rows <= max_rows_ && tokens.numel() == rows && logprobs.numel() == rows, "sample: {} rows", rows);
  const ParamsLayout l(max_rows_);
  const auto* base = device_.data_ptr<uint8_t>();
  // The rows' slices (maximum and sum by many blocks a row: cuda::SampleArgs::workspace).
  auto workspace = at::empty({static_cast<int64_t>(cuda::sample_workspace_bytes(static_cast<int>(rows)))},
                             logits.options().dtype(at::kByte));
  SampleArgs a{.dtype = dtype_of(logits),
               .logits = logits.data_ptr(),
               .row_stride = logits.stride(0),
               .rows = static_cast<int>(rows),
               .vocab = static_cast<int>(vocab),
               .temperature = reinterpret_cast<const float*>(base + l.temperature),
               .top_k = reinterpret_cast<const int32_t*>(base + l.top_k),
               .top_p = reinterpret_cast<const double*>(base + l.top_p),
               .min_p = reinterpret_cast<const float*>(base + l.min_p),
               .uniform = reinterpret_cast<const double*>(base + l.uniform),
               .tokens = tokens.data_ptr<int64_t>(),
               .logprobs = logprobs.data_ptr<float>(),
               .workspace = workspace.data_ptr()};
  check_launch("sample", cuda::sample(a, c10::cuda::getCurrentCUDAStream().stream()));
}

Sampled sample_on_device(const at::Tensor& logits, const SamplingBatch& b) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0);
  SamplingParamsBuffer params(rows, logits.device());
  params.stage(b, rows);
  auto tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  auto logprobs = at::empty({rows}, logits.options().dtype(at::kFloat));
  params.sample(logits, tokens, logprobs);
  return {tokens, logprobs};
}

}  // namespace rlx::cuda
