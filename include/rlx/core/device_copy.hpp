// A host tensor's copy on a GPU that does not make the host wait. A blocking copy from
// pageable memory returns only once the stream has run everything queued before it: in a
// learner step that is a stall before each micro-batch's forward, the GPU idle while the
// host queues the next kernels. Staged in a fresh pinned block instead (contiguous, so no
// pageable temporary; LibTorch's caching host allocator keeps it until the copy has run),
// the copy is queued like a kernel, and the caller may change or free its tensor at once.
//
//   auto tokens = rlx::to_device_async(host_tokens, device);   // t.to(device) where it is not host -> GPU
#pragma once

#include <ATen/ATen.h>

namespace rlx {

inline at::Tensor to_device_async(const at::Tensor& t, at::Device device) {
  if (!t.defined()) return t;
  if (!t.is_cpu() || !device.is_cuda()) return t.to(device);
  auto staged = at::empty(t.sizes(), t.options().pinned_memory(true));
  staged.copy_(t);
  return staged.to(device, /*non_blocking=*/true);
}

}  // namespace rlx
