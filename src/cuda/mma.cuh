// The tensor-core instruction rlx's kernels use (sm_80 and newer): c += A B by
// mma.sync.m16n8k16 with fp16 or bf16 operands and fp32 accumulators. Fragments, for lane l
// (g = l / 4, q = l % 4), two 16-bit values a register, the lower column (or k) in the low half:
//   A (16 x 16, row-major):  a0 = A[g][2q..2q+1]   a1 = A[g+8][2q..2q+1]
//                            a2 = A[g][2q+8..+9]   a3 = A[g+8][2q+8..+9]
//   B (16 x 8, k x n):       b0 = B[2q..2q+1][g]   b1 = B[2q+8..+9][g]
//   C (16 x 8, fp32):        c0, c1 = C[g][2q..2q+1]   c2, c3 = C[g+8][2q..2q+1]
#pragma once

#include <type_traits>

#include "common.cuh"

namespace rlx::cuda {

template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace rlx::cuda
