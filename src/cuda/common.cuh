// What every kernel file of the rollout engine uses: the dtypes and their fp32 round
// trips, dtype dispatch for launchers, and block reductions whose order is fixed (each
// thread's strided partial, a warp butterfly, then the warps in index order), so a row's
// result never depends on the launch around it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
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

// Whether p is 16-byte aligned: where 16-byte vector loads (uint4) may read it.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The launch's status: an argument error found by the launcher, else cudaGetLastError().
inline int launch_status() { return static_cast<int>(cudaGetLastError()); }

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
