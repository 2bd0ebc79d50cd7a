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
