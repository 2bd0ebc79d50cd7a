// The one place where LibTorch version differences live (Debian's 1.13 on CPU,
// the 2.x inside PyTorch on CUDA machines). Code elsewhere calls these.
#pragma once

#include <ATen/ATen.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>  // shapes in messages: fmt::format("{}", t.sizes()) prints [2, 3]
#include <torch/version.h>

#include <cstdint>
#include <optional>
#include <string_view>

#if RLX_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#define RLX_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace rlx::compat {

// Float8 dtypes arrived in LibTorch 2.1.
inline constexpr bool kHasFloat8 = RLX_TORCH_AT_LEAST(2, 1);
// Unsigned 16/32/64-bit dtypes arrived in 2.3.
inline constexpr bool kHasWideUnsigned = RLX_TORCH_AT_LEAST(2, 3);

// The ScalarType for a safetensors dtype name, when this LibTorch has it.
inline std::optional<at::ScalarType> scalar_type_for(std::string_view st) {
  if (st == "F64") return at::kDouble;
  if (st == "F32") return at::kFloat;
  if (st == "F16") return at::kHalf;
  if (st == "BF16") return at::kBFloat16;
  if (st == "I64") return at::kLong;
  if (st == "I32") return at::kInt;
  if (st == "I16") return at::kShort;
  if (st == "I8") return at::kChar;
  if (st == "U8") return at::kByte;
  if (st == "BOOL") return at::kBool;
#if RLX_TORCH_AT_LEAST(2, 1)
  if (st == "F8_E4M3") return at::kFloat8_e4m3fn;
  if (st == "F8_E5M2") return at::kFloat8_e5m2;
#endif
#if RLX_TORCH_AT_LEAST(2, 3)
  if (st == "U16") return at::kUInt16;
  if (st == "U32") return at::kUInt32;
  if (st == "U64") return at::kUInt64;
#endif
  return std::nullopt;
}

// Peak bytes LibTorch's caching allocator has handed out on a CUDA device since the
// process started; -1 on a CPU build or device. (Index 0 of the stat arrays is the
// aggregate over pool types in every LibTorch version rlx supports; the enum naming it
// moved between namespaces.)
inline int64_t device_peak_bytes([[maybe_unused]] at::Device device) {
#if RLX_WITH_CUDA
  if (device.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0).allocated_bytes[0].peak;
#endif
  return -1;
}

// Bytes a new allocation on a CUDA device can still get: the driver's free memory plus what
// LibTorch's caching allocator holds reserved but unused; -1 on a CPU build or device.
inline int64_t device_free_bytes([[maybe_unused]] at::Device device) {
#if RLX_WITH_CUDA
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : 0;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return static_cast<int64_t>(free) + (stats.reserved_bytes[0].current - stats.allocated_bytes[0].current);
  }
#endif
  return -1;
}

// CUDA devices this process sees (0 on a CPU build).
inline int cuda_device_count() {
#if RLX_WITH_CUDA
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

// Makes a CUDA device this thread's current one (a no-op for the CPU).
inline void set_current_device([[maybe_unused]] at::Device device) {
#if RLX_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.has_index() ? device.index() : 0);
#endif
}

// Waits for the work queued on `device` (a no-op on the CPU).
inline void synchronize([[maybe_unused]] at::Device device) {
#if RLX_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

}  // namespace rlx::compat

