#include "rlx/cuda/attention_math.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "rlx/cuda/reference.hpp"

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
