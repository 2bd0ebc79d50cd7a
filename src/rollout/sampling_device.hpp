// The engine's sampler on a CUDA device (CUDA builds only): the rows' parameters staged in
// one device buffer, the sampler kernel (cuda/kernels.hpp) launched on the current stream.
#pragma once

#include <ATen/ATen.h>

#include "rlx/rollout/sampling.hpp"

namespace rlx::cuda {

// sample() for logits on a CUDA device: the rows' parameters go over in one pinned copy;
// tokens and log-probs stay on the device.
Sampled sample_on_device(const at::Tensor& logits, const SamplingBatch& batch);

// The sampler's per-row parameters in one device buffer that stays put (what a CUDA graph
// captures): stage() copies a batch in (one pinned copy; rows past it are greedy), sample()
// launches the kernel on the current stream into caller-owned outputs.
class SamplingParamsBuffer {
 public:
  SamplingParamsBuffer(int64_t max_rows, at::Device device);
  void stage(const SamplingBatch& batch, int64_t rows);
  // logits [rows, vocab]; tokens int64 [rows], logprobs fp32 [rows] on the device.
  void sample(const at::Tensor& logits, at::Tensor& tokens, at::Tensor& logprobs) const;

 private:
  int64_t max_rows_;
  at::Tensor host_, device_;  // [top_p f64 | uniform f64 | temperature f32 | min_p f32 | top_k i32] x max_rows
};

}  // namespace rlx::cuda
