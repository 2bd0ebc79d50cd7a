// RoPE and the KV append in one pass over the fused q/k/v projection's output: q heads
// rotated into q_out, k heads rotated and v heads copied into the paged pools at the
// tokens' slots (attention_math.hpp's layout). The rotation rounds as HF's apply_rotary_pos_emb
// does in the activation dtype: cos and sin, each product, the sum.
#include "common.cuh"
#include "rlx/cuda/attention_math.hpp"

namespace rlx::cuda {
namespace {

template <class T>
__global__ void rope_append_kernel(RopeAppendArgs a) {
  const int r = blockIdx.x, d = a.head_dim, half = d / 2;
  const T* src = static_cast<const T*>(a.qkv) + static_cast<int64_t>(r) * (a.q_heads + 2 * a.kv_heads) * d;
  const float pos = static_cast<float>(a.positions[r]);
  const int64_t slot = a.slots[r];
  const hd::PagedLayout layout{a.block_size, a.kv_heads, d};
  for (int idx = threadIdx.x; idx < (a.q_heads + a.kv_heads) * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const float angle = pos * a.inv_freq[i];
    const float c = round_to<T>(cosf(angle)), s = round_to<T>(sinf(angle));
    const float x1 = Num<T>::to(src[h * d + i]), x2 = Num<T>::to(src[h * d + i + half]);
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
  if (a.head_dim <= 0 || a.head_dim % 2 || a.q_heads <= 0 || a.kv_heads <= 0 || a.block_size <= 0)
    return cudaErrorInvalidValue;
  return with_dtype(a.dtype, [&](auto tag) -> int {
    using T = typename decltype(tag)::type;
    rope_append_kernel<T><<<a.rows, 128, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_status();
  });
}

}  // namespace rlx::cuda
