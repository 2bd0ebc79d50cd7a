#include "rlx/model/varlen_attention.hpp"

#include <map>
#include <numeric>

#include "rlx/core/device_copy.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/model/kv_cache.hpp"
#if RLX_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace rlx {

int64_t VarlenSeqs::total_q() const { return std::accumulate(q_lens.begin(), q_lens.end(), int64_t{0}); }
int64_t VarlenSeqs::total_k() const { return std::accumulate(k_lens.begin(), k_lens.end(), int64_t{0}); }

VarlenSeqs varlen_seqs(std::span<const int64_t> q_lens, std::span<const int64_t> k_lens, at::Device device) {
  RLX_ASSERT(!q_lens.empty() && q_lens.size() == k_lens.size(), "varlen_seqs: {} query and {} key lengths",
             q_lens.size(), k_lens.size());
  VarlenSeqs s;
  s.q_lens.assign(q_lens.begin(), q_lens.end());
  s.k_lens.assign(k_lens.begin(), k_lens.end());
  std::vector<int32_t> cu(2 * (q_lens.size() + 1), 0);  // cu_q, then cu_k: one copy to the device
  const size_t n = q_lens.size();
  for (size_t i = 0; i < n; ++i) {
    RLX_ASSERT(q_lens[i] >= 1 && q_lens[i] <= k_lens[i], "varlen_seqs: sequence {} has {} queries and {} keys", i,
               q_lens[i], k_lens[i]);
    cu[i + 1] = cu[i] + static_cast<int32_t>(q_lens[i]);
    cu[n + 1 + i + 1] = cu[n + 1 + i] + static_cast<int32_t>(k_lens[i]);
    s.max_q = std::max(s.max_q, q_lens[i]);
    s.max_k = std::max(s.max_k, k_lens[i]);
  }
  RLX_CHECK(s.total_k() < (int64_t{1} << 31), "varlen attention: {} keys overflow int32 offsets", s.total_k());
  auto both = to_device_async(at::tensor(cu, at::TensorOptions().dtype(at::kInt)), device);
  s.cu_q = both.narrow(0, 0, static_cast<int64_t>(n + 1));
  s.cu_k = both.narrow(0, static_cast<int64_t>(n + 1), static_cast<int64_t>(n + 1));
  return s;
}

VarlenSeqs varlen_from_segments(const at::Tensor& segments, at::Device device, const at::Tensor& prefix) {
  RLX_ASSERT(segments.dim() == 2 && segments.numel() > 0, "varlen_from_segments: segments {}", segments.sizes());
  RLX_ASSERT(!prefix.defined() || prefix.sizes() == segments.sizes(), "varlen_from_segments: prefix {} for segments {}",
             prefix.sizes(), segments.sizes());
  auto seg = segments.to(at::kCPU, at::kLong).contiguous();
  const int64_t B = seg.size(0), T = seg.size(1);
  const int64_t* p = seg.data_ptr<int64_t>();
  struct Run {
    int64_t start, len, prefix;  // row-major token offset, tokens, the prefix segment (0: none)
  };
  std::vector<Run> runs;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = b * T;
    for (int64_t t = 1; t <= T; ++t) {
      if (t < T && p[b * T + t] == p[b * T + t - 1]) continue;
      runs.push_back({start, b * T + t - start, 0});
      start = b * T + t;
    }
  }
  std::vector<int64_t> q_lens, k_lens;
  for (const auto& r : runs) q_lens.push_back(r.len);
  if (!prefix.defined()) return varlen_seqs(q_lens, q_lens, device);
  auto pre = prefix.to(at::kCPU, at::kLong).contiguous();
  const int64_t* pp = pre.data_ptr<int64_t>();
  // Where each (row, segment) run sits, to find a prefix by its segment id.
  std::map<std::pair<int64_t, int64_t>, const Run*> by_segment;
  for (const auto& r : runs) by_segment[{r.start / T, p[r.start]}] = &r;
  std::vector<int64_t> index;
  for (auto& r : runs) {
    const int64_t shared = pp[r.start];
    for (int64_t i = r.start; i < r.start + r.len; ++i)
      RLX_CHECK(pp[i] == shared, "forward: prefix differs within segment {} of row {}", p[r.start], r.start / T);
    int64_t k_len = r.len;
    if (shared != 0) {
      auto it = by_segment.find({r.start / T, shared});
      RLX_CHECK(it != by_segment.end() && shared != p[r.start] && pp[it->second->start] == 0,
                "forward: row {} segment {} names prefix segment {}, which is not another segment of the row without a "
                "prefix of its own",
                r.start / T, p[r.start], shared);
      for (int64_t i = 0; i < it->second->len; ++i) index.push_back(it->second->start + i);
      k_len += it->second->len;
    }
    for (int64_t i = 0; i < r.len; ++i) index.push_back(r.start + i);
    k_lens.push_back(k_len);
  }
  auto s = varlen_seqs(q_lens, k_lens, device);
  s.kv_index = to_device_async(at::tensor(index, at::TensorOptions().dtype(at::kLong)), device);
  return s;
}

bool flash_varlen_supported([[maybe_unused]] at::Device device, [[maybe_unused]] at::ScalarType dtype,
                            [[maybe_unused]] int64_t head_dim) {
#if RLX_WITH_CUDA && RLX_TORCH_AT_LEAST(2, 1)
  if (!device.is_cuda() || (dtype != at::kBFloat16 && dtype != at::kHalf)) return false;
  if (head_dim % 8 != 0 || head_dim > 256) return false;
  return at::cuda::getDeviceProperties(device.has_index() ? device.index() : c10::cuda::current_device())->major >= 8;
#else
  return false;
#endif
}

namespace {
// Keys listed by index: a shared prefix's rows gathered once per sequence that sees them.
std::pair<at::Tensor, at::Tensor> gather_keys(const at::Tensor& k, const at::Tensor& v, const VarlenSeqs& seqs) {
  RLX_ASSERT(k.dim() == 3 && v.sizes() == k.sizes(), "varlen_attention: k {}, v {}", k.sizes(), v.sizes());
  if (!seqs.kv_index.defined()) return {k, v};
  return {k.index_select(0, seqs.kv_index), v.index_select(0, seqs.kv_index)};
}

at::Tensor reference_gathered(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const VarlenSeqs& seqs,
                              double scale) {
  std::vector<at::Tensor> outs;
  outs.reserve(static_cast<size_t>(seqs.seqs()));
  auto lopts = at::TensorOptions().dtype(at::kLong).device(q.device());
  int64_t oq = 0, ok = 0;
  for (int64_t s = 0; s < seqs.seqs(); ++s) {
    const int64_t Lq = seqs.q_lens[static_cast<size_t>(s)], Lk = seqs.k_lens[static_cast<size_t>(s)];
    auto allowed = at::arange(Lk, lopts).view({1, 1, Lk}) <= (at::arange(Lq, lopts) + (Lk - Lq)).view({1, Lq, 1});
    outs.push_back(attention(q.narrow(0, oq, Lq).unsqueeze(0), k.narrow(0, ok, Lk).unsqueeze(0),
                             v.narrow(0, ok, Lk).unsqueeze(0), allowed, scale)
                       .squeeze(0));
    oq += Lq;
    ok += Lk;
  }
  return at::cat(outs, 0);
}
}  // namespace

at::Tensor varlen_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const VarlenSeqs& seqs, double scale) {
  auto [kk, vv] = gather_keys(k, v, seqs);
  return reference_gathered(q, kk, vv, seqs, scale);
}

at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in, const VarlenSeqs& seqs,
                            double scale) {
  const auto [k, v] = gather_keys(k_in, v_in, seqs);
  RLX_ASSERT(q.dim() == 3 && q.size(0) == seqs.total_q() && k.size(0) == seqs.total_k() &&
                 q.size(1) % k.size(1) == 0 && q.size(2) == k.size(2),
             "varlen_attention: q {}, k {}, v {} for {} queries and {} keys", q.sizes(), k.sizes(), v.sizes(),
             seqs.total_q(), seqs.total_k());
#if RLX_WITH_CUDA && RLX_TORCH_AT_LEAST(2, 1)
  if (flash_varlen_supported(q.device(), q.scalar_type(), q.size(2)) && k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type())
    return std::get<0>(at::_flash_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), seqs.cu_q,
                                                    seqs.cu_k, seqs.max_q, seqs.max_k, /*dropout_p=*/0.0,
                                                    /*is_causal=*/true, /*return_debug_mask=*/false, scale));
#endif
  return reference_gathered(q, k, v, seqs, scale);
}

}  // namespace rlx
