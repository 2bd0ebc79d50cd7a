// What every kernel file of the rollout engine uses: the dtypes and their fp32 round
// trips, dtype dispatch for launchers, and block reductions whose order is fixed (each
// thread's strided partial, a warp butterfly, then the warps in index order), so a row's
// result never depends on the launch around it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "rlx/cuda/kernels.hpp"

namespace rlx::cuda {

template <class T>
struct Num;
template <>
struct Num<float> {
  static __device__ __forceinline__ float to(float x) { return x; }
  static __device__ __forceinline__ float from(float x) { return x; }
};
template <>
struct Num<__half> {
  static __device__ __forceinline__ float to(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from(float x) { return __float2half_rn(x); }
};
template <>
struct Num<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
};

// x rounded to T and back: what storing an intermediate in T does to it.
template <class T>
__device__ __forceinline__ float round_to(float x) {
  return Num<T>::to(Num<T>::from(x));
}

// The layer ops' element rules, rounded where HF's modules store in T (one definition for the
// norm and SiLU-mul kernels and for the GEMV that takes them on its way in):
// the residual sum, h + x, stored in T;
template <class T>
__device__ __forceinline__ T add_rounded(T h, T x) {
  return Num<T>::from(Num<T>::to(h) + Num<T>::to(x));
}
// RMSNorm's output for h (the stored sum, as float): the normalised value stored, times the weight;
template <class T>
__device__ __forceinline__ T rms_scaled(T weight, float h, float inv_rms) {
  return Num<T>::from(Num<T>::to(weight) * round_to<T>(h * inv_rms));
}
// SiLU(gate) * up, SiLU's output stored.
template <class T>
__device__ __forceinline__ T silu_times(float g, float u) {
  return Num<T>::from(round_to<T>(g / (1.0f + expf(-g))) * u);
}

// SiLU-mul on one 16-byte vector of gate and the same of up: silu_mul's vector kernel and the
// decode GEMM that takes it on the way in.
template <class T>
__device__ __forceinline__ uint4 silu_times_vector(uint4 gate, uint4 up) {
  constexpr int kVec = 16 / sizeof(T);
  const T* g = reinterpret_cast<const T*>(&gate);
  const T* u = reinterpret_cast<const T*>(&up);
  uint4 out;
  T* y = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int j = 0; j < kVec; ++j) y[j] = silu_times<T>(Num<T>::to(g[j]), Num<T>::to(u[j]));
  return out;
}

// The residual's values plus x's, stored rounded (add_rounded on each of a 16-byte vector's).
template <class T>
__device__ __forceinline__ uint4 add_rounded_vector(uint4 h, uint4 x) {
  constexpr int kVec = 16 / sizeof(T);
  T* e = reinterpret_cast<T*>(&h);
  const T* xe = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int j = 0; j < kVec; ++j) e[j] = add_rounded<T>(e[j], xe[j]);
  return h;
}

// add_rms_norm's two passes on one 16-byte vector, shared by its vector kernel and the GEMV's
// and decode GEMM's norms so that they give the same bits. First: the residual's values plus
// x's (x null: as they are), stored rounded, their squares added to `squares` in element order.
template <class T>
__device__ __forceinline__ uint4 add_and_square(uint4 raw, const uint4* x, float& squares) {
  constexpr int kVec = 16 / sizeof(T);
  if (x) raw = add_rounded_vector<T>(raw, *x);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float f = Num<T>::to(e[j]);
    squares += f * f;
  }
  return raw;
}
// Second: RMSNorm's output for each stored sum, times the weight.
template <class T>
__device__ __forceinline__ uint4 rms_scaled_vector(uint4 sums, uint4 weight, float inv_rms) {
  constexpr int kVec = 16 / sizeof(T);
  T* e = reinterpret_cast<T*>(&sums);
  const T* w = reinterpret_cast<const T*>(&weight);
#pragma unroll
  for (int j = 0; j < kVec; ++j) e[j] = rms_scaled<T>(w[j], Num<T>::to(e[j]), inv_rms);
  return sums;
}

// add_rms_norm's threads for a row of `vecs` 16-byte vectors (a warp multiple, at most 256): its
// sum of squares is each thread's vectors t, t + threads, ... in order, then block_reduce. The
// GEMV's norm takes the same order, so its normalised rows equal the norm kernel's bit for bit.
constexpr int kNormThreads = 256;
__host__ __device__ constexpr int norm_threads(int vecs) {
  return vecs >= kNormThreads ? kNormThreads : (vecs + 31) / 32 * 32;
}

template <class T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) for the runtime dtype; an unknown one is cudaErrorInvalidValue.
template <class Fn>
int with_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(TypeTag<float>{});
    case DType::f16: return fn(TypeTag<__half>{});
    case DType::bf16: return fn(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

// The same for the 16-bit dtypes only (f32 is cudaErrorInvalidValue).
template <class Fn>
int with_16bit_dtype(DType d, Fn&& fn) {
  return with_dtype(d, [&](auto tag) -> int {
    if constexpr (sizeof(typename decltype(tag)::type) != 2)
      return cudaErrorInvalidValue;
    else
      return fn(tag);
  });
}

// Whether p is 16-byte aligned: where 16-byte vector loads (uint4) may read it.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The launch's status: an argument error found by the launcher, else cudaGetLastError().
inline int launch_status() { return static_cast<int>(cudaGetLastError()); }

// Programmatic dependent launch (sm_90; RLX_PDL=1): a kernel launched by launch_kernel may
// begin while the stream's previous kernel ends, its blocks resident and waiting, which hides
// the launch latency between decode's small kernels. Every kernel of the decode step begins
// with pdl_begin(): it lets the next kernel launch now, then waits until the previous one has
// finished and its writes are visible, before touching memory. (A kernel can launch only once
// every block of the one before has begun, so waiting blocks never hold back an earlier grid.)
// Launched without the attribute, or before sm_90, both instructions are no-ops.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether launch_kernel asks for programmatic dependent launch: RLX_PDL=1 on a device of
// compute capability 9 (the sm_90a code, whose kernels wait; a later device runs the sm_80
// code, whose pdl_begin is empty), runtime and driver 12.3 or later (PDL in captured graphs).
// Read once a process.
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("RLX_PDL");
    int device = 0, major = 0, runtime = 0, driver = 0;
    return v != nullptr && std::strcmp(v, "1") == 0 && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9 &&
           cudaRuntimeGetVersion(&runtime) == cudaSuccess && runtime >= 12030 &&
           cudaDriverGetVersion(&driver) == cudaSuccess && driver >= 12030;
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent launch where
// pdl_enabled() and the stream is not the legacy default one (a CUDA graph's capture, the
// engine's own streams; the kernel must begin with pdl_begin()); returns the launch's status (as
// launch_status(), which it leaves clear).
template <class... Params, class... Args>
int launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                  const Args&... args) {
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &pdl;
  config.numAttrs = pdl_enabled() && stream != nullptr && stream != cudaStreamLegacy ? 1 : 0;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  const int last = launch_status();  // clears the launch's error
  return launched != cudaSuccess ? static_cast<int>(launched) : last;
}

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a > b ? a : b; }
};

template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Every thread of the block gets op over all threads' v. `smem` holds blockDim.x / 32
// values; the call begins and ends with a barrier, so it can be reused at once.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T* smem) {
  v = warp_reduce(v, op);
  const int warps = blockDim.x / 32;
  __syncthreads();
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  T total = smem[0];
  for (int w = 1; w < warps; ++w) total = op(total, smem[w]);
  __syncthreads();
  return total;
}

}  // namespace rlx::cuda
