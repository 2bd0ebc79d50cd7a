// ATen glue for the rollout engine's kernels (CUDA builds only): tensors in, shape and
// dtype checks, the current stream, a launcher status turned into rlx::Error.
#pragma once

#include <ATen/ATen.h>

#include "rlx/rollout/sampling.hpp"

namespace rlx::cuda {

// sample() for logits on a CUDA device: the rows' parameters go over in one pinned copy;
// tokens and log-probs stay on the device.
Sampled sample_on_device(const at::Tensor& logits, const SamplingBatch& batch);

}  // namespace rlx::cuda
