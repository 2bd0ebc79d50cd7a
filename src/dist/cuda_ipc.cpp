#include "cuda_ipc.hpp"

#include <algorithm>
#include <cstring>

#include "rlx/core/error.hpp"

#if RLX_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace rlx::dist::detail {

#if RLX_WITH_CUDA
static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);

namespace {
void check(cudaError_t e, const char* what) {
  RLX_CHECK(e == cudaSuccess, "weight sync (CUDA IPC): {} failed: {}", what, cudaGetErrorString(e));
}
}  // namespace

bool CudaIpcSlots::available() { return true; }

void CudaIpcSlots::allocate(int device, int64_t bytes, IpcHandles& out) {
  device_ = device;
  check(cudaSetDevice(device), "cudaSetDevice");
  for (int s = 0; s < 2; ++s) {
    check(cudaMalloc(reinterpret_cast<void**>(&ptr_[s]), static_cast<size_t>(std::max<int64_t>(bytes, 1))), "cudaMalloc");
    cudaIpcMemHandle_t handle;
    check(cudaIpcGetMemHandle(&handle, ptr_[s]), "cudaIpcGetMemHandle");
    std::memcpy(out.slot[s], &handle, kIpcHandleBytes);
  }
}

void CudaIpcSlots::open(int device, const IpcHandles& handles) {
  device_ = device;
  imported_ = true;
  check(cudaSetDevice(device), "cudaSetDevice");
  for (int s = 0; s < 2; ++s) {
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, handles.slot[s], kIpcHandleBytes);
    check(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&ptr_[s]), handle, cudaIpcMemLazyEnablePeerAccess),
          "cudaIpcOpenMemHandle");
  }
}

void CudaIpcSlots::copy(char* dst, const char* src, int64_t bytes) {
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
}

void CudaIpcSlots::finish() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

CudaIpcSlots::~CudaIpcSlots() {
  if (device_ < 0) return;
  cudaSetDevice(device_);
  for (char* p : ptr_)
    if (p) imported_ ? cudaIpcCloseMemHandle(p) : cudaFree(p);
}

#else

namespace {
[[noreturn]] void unavailable() {
  throw Error("weight sync: the slots are on a CUDA device (CUDA IPC), and this build of rlx has no CUDA (RLX_CUDA)");
}
}  // namespace

bool CudaIpcSlots::available() { return false; }
void CudaIpcSlots::allocate(int, int64_t, IpcHandles&) { unavailable(); }
void CudaIpcSlots::open(int, const IpcHandles&) { unavailable(); }
void CudaIpcSlots::copy(char*, const char*, int64_t) { unavailable(); }
void CudaIpcSlots::finish() { unavailable(); }
CudaIpcSlots::~CudaIpcSlots() = default;

#endif

}  // namespace rlx::dist::detail
