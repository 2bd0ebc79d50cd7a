#include "rlx/cuda/attention_math.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "rlx/cuda/reference.hpp"
#include "rlx/model/fused_ops.hpp"

namespace hd = rlx::hd;

TEST_CASE("attention math: a token's slot and its block-table position name the same element", "[rollout]") {
  const hd::PagedLayout l{.block_size = 16, .kv_heads = 2, .head_dim = 64};
  const std::vector<int32_t> table{7, 3, 11};
  for (int64_t pos = 0; pos < 48; ++pos)
    for (int32_t h = 0; h < 2; ++h) {
      const int64_t slot = int64_t{table[static_cast<size_t>(pos / 16)]} * 16 + pos % 16;
      CHECK(hd::paged_token_offset(l, table.data(), pos, h) == hd::paged_slot_offset(l, slot, h));
    }
  // [block, kv_head, block_size, head_dim]: a kv head's block is contiguous, heads follow.
  CHECK(hd::paged_offset(l, 0, 0, 1, 0) == 64);
  CHECK(hd::paged_offset(l, 0, 1, 0, 0) == 16 * 64);
  CHECK(hd::paged_offset(l, 1, 0, 0, 0) == 2 * 16 * 64);
  CHECK(hd::decode_splits(1) == 1);
  CHECK(hd::decode_splits(hd::kDecodeSplitTokens) == 1);
  CHECK(hd::decode_splits(hd::kDecodeSplitTokens + 1) == 2);
}

TEST_CASE("attention math: merging partial softmaxes equals one pass, empty parts are neutral", "[rollout]") {
  std::mt19937 g(4);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> s(300), v(300);
  for (auto& x : s) x = d(g);
  for (auto& x : v) x = d(g);
  auto run = [&](size_t lo, size_t hi, float& acc) {
    hd::SoftmaxState st = hd::softmax_empty();
    acc = 0;
    for (size_t i = lo; i < hi; ++i) {
      float scale_old, p;
      hd::softmax_add(st, s[i], scale_old, p);
      acc = acc * scale_old + p * v[i];
    }
    return st;
  };
  float whole_acc, a_acc, b_acc, e_acc;
  const auto whole = run(0, 300, whole_acc);
  auto a = run(0, 77, a_acc);
  const auto b = run(77, 300, b_acc);
  const auto empty = run(0, 0, e_acc);
  float sa, sb;
  hd::softmax_merge(a, b, sa, sb);
  CHECK(a.m == whole.m);
  CHECK(a.l == Approx(whole.l).epsilon(1e-5));
  CHECK((a_acc * sa + b_acc * sb) / a.l == Approx(whole_acc / whole.l).epsilon(1e-5));
  auto c = a;
  hd::softmax_merge(c, empty, sa, sb);
  CHECK(c.m == a.m);
  CHECK(c.l == a.l);
  CHECK(sa == 1.0f);
  CHECK(sb == 0.0f);
  auto e = empty;
  hd::softmax_merge(e, empty, sa, sb);  // both empty: no NaN
  CHECK(e.l == 0.0f);
  CHECK(sb == 0.0f);
}

TEST_CASE("attention math: paged split-K decode attention equals dense attention", "[rollout]") {
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int q_heads = 14, kv_heads = 2, dim = 64, block_size = 16;
  const std::vector<int32_t> lens{1, 127, 128, 129, 300};
  const int batch = static_cast<int>(lens.size()), max_blocks = 19, num_blocks = batch * max_blocks;
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), g);
  const size_t pool = static_cast<size_t>(num_blocks) * kv_heads * block_size * dim;
  std::vector<float> k(pool), v(pool), q(static_cast<size_t>(batch) * q_heads * dim);
  for (auto* vec : {&k, &v, &q})
    for (auto& x : *vec) x = d(g);
  std::vector<float> out(q.size());
  const float scale = 1.0f / 8.0f;
  rlx::cuda::reference::decode_attention(q.data(), k.data(), v.data(), tables.data(), lens.data(), out.data(),
                                         {batch, q_heads, kv_heads, dim, block_size, max_blocks, scale});
  const hd::PagedLayout l{block_size, kv_heads, dim};
  double worst = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < q_heads; ++h) {
      // Dense: gather the sequence's keys and values position by position, softmax in double.
      const int len = lens[static_cast<size_t>(b)], kvh = h / (q_heads / kv_heads);
      const int32_t* table = tables.data() + b * max_blocks;
      const float* qh = q.data() + (b * q_heads + h) * dim;
      std::vector<double> score(static_cast<size_t>(len));
      for (int t = 0; t < len; ++t) {
        const int64_t block = table[t / block_size], at = ((block * kv_heads + kvh) * block_size + t % block_size) * dim;
        double dot = 0;
        for (int i = 0; i < dim; ++i) dot += double{qh[i]} * k[static_cast<size_t>(at + i)];
        score[static_cast<size_t>(t)] = dot * scale;
        CHECK(at == hd::paged_token_offset(l, table, t, kvh));
      }
      const double mx = *std::max_element(score.begin(), score.end());
      double total = 0;
      for (auto& x : score) total += x = std::exp(x - mx);
      for (int i = 0; i < dim; ++i) {
        double o = 0;
        for (int t = 0; t < len; ++t)
          o += score[static_cast<size_t>(t)] * v[static_cast<size_t>(hd::paged_token_offset(l, table, t, kvh) + i)];
        worst = std::max(worst, std::abs(o / total - out[static_cast<size_t>((b * q_heads + h) * dim + i)]));
      }
    }
  CHECK(worst < 1e-5);
}

// The rope-append kernel's reference with Qwen3's q/k norms equals the model's own path, its
// RMSNorm of each head then RoPE (fused::rms_norm, fused::rope), in fp32; v copied as it is.
TEST_CASE("attention math: the rope-append reference with q/k norms equals the model's RMSNorm then RoPE",
          "[rollout]") {
  const int rows = 3, q_heads = 4, kv_heads = 2, d = 16, block_size = 4, num_blocks = 4;
  const float eps = 1e-6f;
  at::manual_seed(3);
  auto qkv = at::randn({rows, (q_heads + 2 * kv_heads) * d});
  auto qw = 1 + 0.2 * at::randn({d}), kw = 1 + 0.2 * at::randn({d});
  const std::vector<int64_t> positions{0, 9, 300}, slots{1, 6, 13};
  std::vector<float> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(1e6f, -2.0f * i / d);
  const size_t pool = static_cast<size_t>(num_blocks) * kv_heads * block_size * d;
  std::vector<float> q_out(static_cast<size_t>(rows) * q_heads * d), k_pool(pool), v_pool(pool);
  rlx::cuda::reference::rope_append(qkv.data_ptr<float>(), positions.data(), slots.data(), inv_freq.data(),
                                    q_out.data(), k_pool.data(), v_pool.data(), rows, q_heads, kv_heads, d, block_size,
                                    qw.data_ptr<float>(), kw.data_ptr<float>(), eps);
  auto angles = at::tensor(std::vector<int64_t>(positions.begin(), positions.end())).to(at::kFloat).unsqueeze(1) *
                at::tensor(inv_freq).unsqueeze(0);                    // [rows, d / 2]
  auto cos = at::cat({angles.cos(), angles.cos()}, -1).unsqueeze(0);  // [1, rows, d]
  auto sin = at::cat({angles.sin(), angles.sin()}, -1).unsqueeze(0);
  auto parts = qkv.split_with_sizes({q_heads * d, kv_heads * d, kv_heads * d}, -1);
  auto q = rlx::fused::rope(rlx::fused::rms_norm(parts[0].reshape({1, rows, q_heads, d}), qw, eps), cos, sin);
  auto k = rlx::fused::rope(rlx::fused::rms_norm(parts[1].reshape({1, rows, kv_heads, d}), kw, eps), cos, sin);
  CHECK((at::from_blob(q_out.data(), {1, rows, q_heads, d}) - q).abs().max().item<double>() <= 1e-5);
  const hd::PagedLayout l{block_size, kv_heads, d};
  double k_diff = 0, v_diff = 0;
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < kv_heads; ++h)
      for (int i = 0; i < d; ++i) {
        const auto at = static_cast<size_t>(hd::paged_slot_offset(l, slots[static_cast<size_t>(r)], h) + i);
        k_diff = std::max(k_diff, std::abs(double{k_pool[at]} - k[0][r][h][i].item<double>()));
        v_diff = std::max(v_diff, std::abs(double{v_pool[at]} - parts[2][r][h * d + i].item<double>()));
      }
  CHECK(k_diff <= 1e-5);
  CHECK(v_diff == 0);
}
