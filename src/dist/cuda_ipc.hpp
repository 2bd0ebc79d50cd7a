// CUDA IPC for the shm weight-sync path (private to src/dist): two device buffers that
// a publisher allocates and exports, and a subscriber in another process maps (CUDA
// does not open a handle in the process that exported it). Plain CUDA runtime calls, no
// LibTorch: this file also compiles against /usr/local/cuda on machines whose LibTorch
// has no CUDA (the rlx_cuda_ipc_check target). Without RLX_WITH_CUDA every call throws.
#pragma once

#include <cstdint>

namespace rlx::dist::detail {

inline constexpr int kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
struct IpcHandles {
  char slot[2][kIpcHandleBytes];
};

class CudaIpcSlots {
 public:
  CudaIpcSlots() = default;
  ~CudaIpcSlots();  // frees (publisher) or closes (subscriber) the buffers
  CudaIpcSlots(const CudaIpcSlots&) = delete;
  CudaIpcSlots& operator=(const CudaIpcSlots&) = delete;

  static bool available();  // built with CUDA
  // Publisher: two buffers of `bytes` on `device`, their handles written to `out`.
  void allocate(int device, int64_t bytes, IpcHandles& out);
  // Subscriber: maps the publisher's buffers on `device`.
  void open(int device, const IpcHandles& handles);
  char* slot(int s) const { return ptr_[s]; }
  // Publisher: forgets the buffers without freeing them (a process may still map them); the
  // driver reclaims them when this process exits.
  void abandon() { device_ = -1; }

  // Device-to-device copy on the legacy default stream; finish() waits for every copy and
  // kernel on the current device (a seqlock is checked only after the bytes are there).
  static void copy(char* dst, const char* src, int64_t bytes);
  static void finish();

 private:
  int device_ = -1;
  char* ptr_[2] = {nullptr, nullptr};
  bool imported_ = false;
};

}  // namespace rlx::dist::detail
