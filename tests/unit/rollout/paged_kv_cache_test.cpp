#include "rlx/rollout/paged_kv_cache.hpp"

#include <catch2/catch.hpp>

#include "rlx/model/config.hpp"

// The CUDA pools are head-major (the kernels' layout), the CPU ones token-major (faster
// gathers); the same steps must attend to the same context either way.
TEST_CASE("paged KV cache: head-major and token-major pools attend alike over prefill, decode and copy-on-write",
          "[rollout]") {
  auto cfg = rlx::model_preset("tiny", rlx::Arch::qwen2);
  cfg.num_kv_heads = 2;
  using Layout = rlx::PagedKVCache::Layout;
  rlx::PagedKVCache head(cfg, 12, 4, at::kFloat, at::kCPU, Layout::head_major);
  rlx::PagedKVCache token(cfg, 12, 4, at::kFloat, at::kCPU, Layout::token_major);
  const int64_t Hq = 4, D = cfg.head_dim;
  at::manual_seed(3);
  std::vector<rlx::BlockId> a{7, 2, 9}, b{4, 11}, c{5, 2, 9};
  // Step 1: prefill 6 and 3 tokens; step 2: one token each, and c shares a's first blocks
  // after block 7 is copied to 5 (copy-on-write).
  using Entry = rlx::PagedKVCache::Entry;
  const std::vector<std::vector<Entry>> steps{
      {{.blocks = a, .cached = 0, .new_tokens = 6}, {.blocks = b, .cached = 0, .new_tokens = 3}},
      {{.blocks = a, .cached = 6, .new_tokens = 1}, {.blocks = b, .cached = 3, .new_tokens = 2},
       {.blocks = c, .cached = 6, .new_tokens = 1}}};
  for (size_t s = 0; s < steps.size(); ++s) {
    if (s == 1) {
      const std::vector<std::pair<rlx::BlockId, rlx::BlockId>> cow{{7, 5}};
      head.copy_blocks(cow);
      token.copy_blocks(cow);
    }
    int64_t packed = 0;
    for (const auto& e : steps[s]) packed += e.new_tokens;
    head.plan(steps[s]);
    token.plan(steps[s]);
    const rlx::ForwardInput in{.tokens = at::zeros({1, packed}, at::kLong)};
    CHECK(head.begin(in).equal(token.begin(in)));
    for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
      auto q = at::randn({1, packed, Hq, D}), k = at::randn({1, packed, 2, D}), v = at::randn({1, packed, 2, D});
      auto x = head.attend(layer, q, k, v, 0.125), y = token.attend(layer, q, k, v, 0.125);
      INFO("step " << s << " layer " << layer);
      CHECK(x.sizes() == y.sizes());
      CHECK(at::allclose(x, y, 1e-6, 1e-6));
    }
  }
}

TEST_CASE(
    "paged KV cache: a static decode step padded to its bucket attends as the planned step, padding stays in the pad "
    "block, "
    "and stages only its rows and context bucket",
    "[rollout]") {
  auto cfg = rlx::model_preset("tiny", rlx::Arch::qwen2);
  cfg.num_kv_heads = 2;
  using Layout = rlx::PagedKVCache::Layout;
  using Entry = rlx::PagedKVCache::Entry;
  const rlx::BlockId pad = 11;
  rlx::PagedKVCache fixed(cfg, 12, 4, at::kFloat, at::kCPU, Layout::head_major);
  rlx::PagedKVCache token(cfg, 12, 4, at::kFloat, at::kCPU, Layout::token_major);
  fixed.enable_static(/*max_seqs=*/8, /*max_blocks=*/4, pad);
  const int64_t Hq = 4, D = cfg.head_dim;
  at::manual_seed(4);
  std::vector<rlx::BlockId> a{7, 2, 9}, b{4, 10}, c{0};
  const std::vector<Entry> prefill{{.blocks = a, .cached = 0, .new_tokens = 9},
                                   {.blocks = b, .cached = 0, .new_tokens = 5},
                                   {.blocks = c, .cached = 0, .new_tokens = 2}};
  const std::vector<Entry> decode{{.blocks = a, .cached = 9, .new_tokens = 1},
                                  {.blocks = b, .cached = 5, .new_tokens = 1},
                                  {.blocks = c, .cached = 2, .new_tokens = 1}};
  fixed.plan(prefill);
  token.plan(prefill);
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
    auto q = at::randn({1, 16, Hq, D}), k = at::randn({1, 16, 2, D}), v = at::randn({1, 16, 2, D});
    fixed.attend(layer, q, k, v, 0.125);
    token.attend(layer, q, k, v, 0.125);
  }
  for (int step = 0; step < 2; ++step) {
    std::vector<Entry> now = decode;
    for (auto& e : now) e.cached += step;
    const int64_t rows = 4;  // three sequences in a bucket of four
    // Step 1 bounds the contexts at 12 tokens: tables 3 blocks wide, not the 4 of max_blocks.
    const int64_t width = step == 0 ? 4 : 3;
    fixed.plan_static(now, rows, step == 0 ? 0 : 12);
    token.plan(now);
    // What the step staged: positions, slots, write rows (2 kv heads), lengths, tables of its width.
    CHECK(fixed.static_staged_bytes() == rows * (8 + 8 + 2 * 8 + 4 + width * 4));
    const rlx::ForwardInput in_fixed{.tokens = at::zeros({1, rows}, at::kLong)};
    CHECK(fixed.begin(in_fixed).narrow(1, 0, 3).equal(token.begin({.tokens = at::zeros({1, 3}, at::kLong)})));
    for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
      auto q = at::randn({1, rows, Hq, D}), k = at::randn({1, rows, 2, D}), v = at::randn({1, rows, 2, D});
      auto x = fixed.attend(layer, q, k, v, 0.125);
      auto y = token.attend(layer, q.narrow(1, 0, 3), k.narrow(1, 0, 3), v.narrow(1, 0, 3), 0.125);
      INFO("step " << step << " layer " << layer);
      CHECK(at::allclose(x.narrow(1, 0, 3), y, 1e-5, 1e-5));
    }
  }
  // Blocks nobody holds (1, 3, 5, 6, 8) were never written: the padded row wrote block 11 only.
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
    for (rlx::BlockId blk : {1, 3, 5, 6, 8}) CHECK(fixed.keys(layer).select(0, blk).abs().sum().item<float>() == 0);
    CHECK(fixed.keys(layer).select(0, pad).abs().sum().item<float>() > 0);
  }
}
