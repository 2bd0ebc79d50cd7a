// RLX_HD marks functions that host and device share: `__host__ __device__` under nvcc,
// plain `inline` under g++, so the math the kernels use is unit-tested on CPU in CI.
//
//   RLX_HD float twice(float x) { return 2 * x; }   // callable from a kernel and from a test
#pragma once

#if defined(__CUDACC__)
#define RLX_HD __host__ __device__ __forceinline__
#else
#define RLX_HD inline
#endif
