// A host tensor's copy on a GPU that does not make the host wait. A blocking copy from
// pageable memory returns only once the stream has run everything queued before it: in a
// learner step that is a stall before each micro-batch's forward, the GPU idle while the
// host queues the next kernels. Staged in pinned memory instead (LibTorch's caching host
// allocator keeps the block until the copy has run), the copy is queued like a kernel.
//
//   auto tokens = rlx::to_device_async(host_tokens, device);   // t.to(device) where it is not host -> GPU
#pragma once

#include <ATen/ATen.h>

namespace rlx {

inline at::Tensor to_device_async(const at::Tensor& t, at::Device device) {
  if (!t.defined() || !t.is_cpu() || !device.is_cuda()) return t.defined() ? t.to(device) : t;
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace rlx
