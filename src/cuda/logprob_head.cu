// The learner's log-prob head on a GPU, one chunk of logits z [rows, V] (the GEMM's output,
// in its dtype, never copied to fp32): one block a row.
//   forward:  one pass over the row: each thread's running (max, sum of exp, sum of exp x z),
//             merged by a block reduction in a fixed order; lse, the target's log-prob and,
//             if asked, the entropy, in fp32.
//   backward: one pass writing d z = -(g_logp + g_ent (log p + H)) p, plus g_logp at the
//             target, in z's dtype, in place over z (each element read, then written, by one
//             thread), so the hidden and weight gradients are one GEMM each.
// The same rules as the CPU's rows (src/model/logprob_head.cpp head_rows_forward/backward).
#include <cmath>

#include "common.cuh"

namespace rlx::cuda {
namespace {

constexpr int kHeadThreads = 512;

struct RowState {  // over some of a row's logits: max m, sum of exp(z - m), sum of exp(z - m) z
  float m, s, pz;
};

__device__ __forceinline__ RowState row_merge(RowState a, RowState b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a;
  const float ea = expf(a.m - m), eb = expf(b.m - m);
  return {m, a.s * ea + b.s * eb, a.pz * ea + b.pz * eb};
}

__device__ __forceinline__ void row_add(RowState& st, float z) {
  if (z > st.m) {
    const float e = expf(st.m - z);
    st.s *= e;
    st.pz *= e;
    st.m = z;
  }
  const float e = expf(z - st.m);
  st.s += e;
  st.pz += e * z;
}

template <class T>
__global__ void __launch_bounds__(kHeadThreads) head_forward_kernel(HeadForwardArgs a) {
  const int64_t row = blockIdx.x;
  const T* z = static_cast<const T*>(a.logits) + row * a.vocab;
  RowState st{-INFINITY, 0.0f, 0.0f};
  constexpr int kVec = 16 / sizeof(T);
  if (a.vocab % kVec == 0) {  // 16-byte loads (rows stay 16-byte aligned)
    for (int64_t j = threadIdx.x; j < a.vocab / kVec; j += blockDim.x) {
      const uint4 raw = reinterpret_cast<const uint4*>(z)[j];
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) row_add(st, Num<T>::to(x[k]));
    }
  } else {
    for (int64_t j = threadIdx.x; j < a.vocab; j += blockDim.x) row_add(st, Num<T>::to(z[j]));
  }
  // Fixed order: a warp butterfly, then the warps in index order.
  for (int offset = 16; offset > 0; offset >>= 1) {
    const RowState o{__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset),
                     __shfl_xor_sync(0xffffffffu, st.pz, offset)};
    st = row_merge(st, o);
  }
  __shared__ RowState s_warp[kHeadThreads / 32];
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = st;
  __syncthreads();
  if (threadIdx.x == 0) {
    RowState total = s_warp[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) total = row_merge(total, s_warp[w]);
    const float lse = total.m + logf(total.s);
    a.lse[row] = lse;
    a.logp[row] = Num<T>::to(z[a.targets[row]]) - lse;
    if (a.entropy) a.entropy[row] = lse - total.pz / total.s;
  }
}

template <class T>
__global__ void __launch_bounds__(kHeadThreads) head_backward_kernel(HeadBackwardArgs a) {
  const int64_t row = blockIdx.x;
  T* z = static_cast<T*>(a.logits) + row * a.vocab;
  const float l = a.lse[row];
  const float ga = a.g_logp ? a.g_logp[row] : 0.0f;
  const float gb = a.g_entropy ? a.g_entropy[row] : 0.0f;
  const float H = a.g_entropy ? a.entropy[row] : 0.0f;
  const int64_t target = a.targets[row];
  auto grad = [&](float zj, int64_t j) {
    const float lpj = zj - l;
    float d = -(ga + gb * (lpj + H)) * __expf(lpj);
    if (j == target) d += ga;
    return d;
  };
  constexpr int kVec = 16 / sizeof(T);
  if (a.vocab % kVec == 0) {
    for (int64_t j = threadIdx.x; j < a.vocab / kVec; j += blockDim.x) {
      uint4 raw = reinterpret_cast<const uint4*>(z)[j];
      T* x = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) x[k] = Num<T>::from(grad(Num<T>::to(x[k]), j * kVec + k));
      reinterpret_cast<uint4*>(z)[j] = raw;
    }
  } else {
    for (int64_t j = threadIdx.x; j < a.vocab; j += blockDim.x) z[j] = Num<T>::from(grad(Num<T>::to(z[j]), j));
  }
}

}  // namespace

int head_forward(const HeadForwardArgs& a, void* stream) {
  if (a.rows <= 0) return 0;
  if (a.vocab <= 0 || !a.logits || !a.targets || !a.lse || !a.logp) return cudaErrorInvalidValue;
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    head_forward_kernel<T><<<a.rows, kHeadThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_status();
  });
}

int head_backward(const HeadBackwardArgs& a, void* stream) {
  if (a.rows <= 0) return 0;
  if (a.vocab <= 0 || !a.logits || !a.targets || !a.lse || (a.g_entropy && !a.entropy)) return cudaErrorInvalidValue;
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    head_backward_kernel<T><<<a.rows, kHeadThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_status();
  });
}

}  // namespace rlx::cuda
