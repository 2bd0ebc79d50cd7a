// RoPE and the KV append in one pass over the fused q/k/v projection's output: q heads
// rotated into q_out, k heads rotated and v heads copied into the paged pools at the
// tokens' slots (attention_math.hpp's layout); Qwen3's per-head q/k RMSNorm first when
// given. The rotation rounds as HF's apply_rotary_pos_emb does in the activation dtype: cos
// and sin, each product, the sum; the norm as HF's RMSNorm: fp32 statistics, the
// normalised value rounded, then the weight's product rounded.
#include <algorithm>

#include "common.cuh"
#include "rlx/cuda/attention_math.hpp"

namespace rlx::cuda {
namespace {

// A block a row, a thread a (head, rotated pair) where they fit in 1024: each thread's loads
// are then issued together (a 128-thread block took four pairs a thread one after another,
// each waiting on its loads: 3.6 us a row at batch 1 for Qwen2.5-0.5B's 512 pairs).
constexpr int kRopeMaxThreads = 1024;

// 1 / rms of each q and k head of the row into inv[h] (one warp a head, lanes strided over
// head_dim, then the warp's butterfly: a fixed order).
template <class T>
__device__ void head_inv_rms(const T* src, int heads, int d, float eps, float* inv) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int h = warp; h < heads; h += warps) {
    float squares = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float x = Num<T>::to(src[h * d + i]);
      squares += x * x;
    }
    squares = warp_reduce(squares, SumOp{});
    if (lane == 0) inv[h] = rsqrtf(squares / static_cast<float>(d) + eps);
  }
}

template <class T>
__global__ void __launch_bounds__(kRopeMaxThreads) rope_append_kernel(RopeAppendArgs a) {
  extern __shared__ float s_inv_rms[];  // [q_heads + kv_heads] with norms, else empty
  pdl_begin();
  const int r = blockIdx.x, d = a.head_dim, half = d / 2;
  const T* src = static_cast<const T*>(a.qkv) + static_cast<int64_t>(r) * (a.q_heads + 2 * a.kv_heads) * d;
  const bool normed = a.q_norm != nullptr;
  if (normed) {
    head_inv_rms(src, a.q_heads + a.kv_heads, d, a.norm_eps, s_inv_rms);
    __syncthreads();
  }
  const float pos = static_cast<float>(a.positions[r]);
  const int64_t slot = a.slots[r];
  const hd::PagedLayout layout{a.block_size, a.kv_heads, d};
  for (int idx = threadIdx.x; idx < (a.q_heads + a.kv_heads) * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const float angle = pos * a.inv_freq[i];
    const float c = round_to<T>(cosf(angle)), s = round_to<T>(sinf(angle));
    float x1 = Num<T>::to(src[h * d + i]), x2 = Num<T>::to(src[h * d + i + half]);
    if (normed) {
      const T* w = static_cast<const T*>(h < a.q_heads ? a.q_norm : a.k_norm);
      const float inv = s_inv_rms[h];
      x1 = round_to<T>(Num<T>::to(w[i]) * round_to<T>(x1 * inv));
      x2 = round_to<T>(Num<T>::to(w[i + half]) * round_to<T>(x2 * inv));
    }
    const T o1 = Num<T>::from(round_to<T>(x1 * c) + round_to<T>(-x2 * s));
    const T o2 = Num<T>::from(round_to<T>(x2 * c) + round_to<T>(x1 * s));
    T* dst = h < a.q_heads ? static_cast<T*>(a.q_out) + (static_cast<int64_t>(r) * a.q_heads + h) * d
                           : static_cast<T*>(a.k_pool) + hd::paged_slot_offset(layout, slot, h - a.q_heads);
    dst[i] = o1;
    dst[i + half] = o2;
  }
  const T* v = src + (a.q_heads + a.kv_heads) * d;
  for (int idx = threadIdx.x; idx < a.kv_heads * d; idx += blockDim.x) {
    const int h = idx / d, i = idx % d;
    static_cast<T*>(a.v_pool)[hd::paged_slot_offset(layout, slot, h) + i] = v[idx];
  }
}

}  // namespace

int rope_append(const RopeAppendArgs& a, void* stream) {
  if (a.rows <= 0) return 0;
  if (a.head_dim <= 0 || a.head_dim % 2 || a.q_heads <= 0 || a.kv_heads <= 0 || a.block_size <= 0 ||
      (a.q_norm == nullptr) != (a.k_norm == nullptr))
    return cudaErrorInvalidValue;
  const size_t smem = a.q_norm ? static_cast<size_t>(a.q_heads + a.kv_heads) * sizeof(float) : 0;
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    const int pairs = (a.q_heads + a.kv_heads) * (a.head_dim / 2);
    const int threads = std::min(kRopeMaxThreads, (pairs + 31) / 32 * 32);
    return launch_kernel(rope_append_kernel<T>, a.rows, threads, smem, static_cast<cudaStream_t>(stream), a);
  });
}

}  // namespace rlx::cuda
