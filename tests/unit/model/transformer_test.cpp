#include "rlx/model/transformer.hpp"

#include <c10/core/GradMode.h>
#include <cmath>

#include "../helpers.hpp"

using Catch::Matchers::Contains;
using rlx::ForwardInput;

namespace {
rlx::ModelConfig small_config(bool qkv_bias = false, bool tied = true, rlx::RopeType rope = rlx::RopeType::none) {
  auto c = rlx::model_preset("tiny");
  c.vocab_size = 97;
  c.qkv_bias = qkv_bias;
  c.o_bias = qkv_bias;
  c.mlp_bias = qkv_bias;
  c.tie_word_embeddings = tied;
  c.rope_scaling.type = rope;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 16;
  return c;
}

std::shared_ptr<rlx::Transformer> make_model(const rlx::ModelConfig& c, uint64_t seed = 3) {
  auto m = std::make_shared<rlx::Transformer>(c);
  m->init_weights(seed);
  // Non-trivial norms and biases, so the test exercises them.
  c10::NoGradGuard g;
  for (auto& [name, p] : m->hf_parameters())
    if (name.find("norm") != std::string::npos || name.find("bias") != std::string::npos)
      p.add_(at::randn(p.sizes(), at::TensorOptions().dtype(p.scalar_type())) * 0.1);
  return m;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }
}  // namespace

TEST_CASE("transformer: incremental KV-cache decoding equals the full forward (fp32, padded batches)", "[model]") {
  at::manual_seed(0);
  const bool bias = GENERATE(false, true);
  const bool tied = GENERATE(true, false);
  const auto rope = GENERATE(rlx::RopeType::none, rlx::RopeType::llama3);
  auto cfg = small_config(bias, tied, rope);
  auto model = make_model(cfg);
  c10::NoGradGuard g;

  // Three sequences of different lengths, right-padded to T.
  const std::vector<int64_t> lengths = {11, 5, 17};
  const int64_t B = 3, T = 17;
  auto tokens = at::randint(cfg.vocab_size, {B, T}, at::TensorOptions().dtype(at::kLong));
  auto segments = at::zeros({B, T}, at::kLong);
  for (int64_t b = 0; b < B; ++b) segments[b].narrow(0, 0, lengths[static_cast<size_t>(b)]).fill_(1);
  auto full = model->forward({.tokens = tokens, .segments = segments});

  // Each row alone, unpadded: padding must not change any valid logit.
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lengths[static_cast<size_t>(b)];
    auto alone = model->forward({.tokens = tokens[b].narrow(0, 0, n).unsqueeze(0)});
    CHECK(max_abs_diff(alone[0], full[b].narrow(0, 0, n)) <= 1e-5);
  }

  // Prefill a ragged prompt, then chunks of varying size, then single-token steps.
  const int64_t chunk = GENERATE(1, 3);
  rlx::DenseKVCache cache(cfg, B, T, at::kFloat, at::kCPU);
  int64_t pos = 0;
  const std::vector<int64_t> steps = {4, chunk, chunk, 1, 1, 2, 100};
  for (int64_t step : steps) {
    if (pos >= T) break;
    const int64_t len = std::min(step, T - pos);
    // Row b takes the tokens it still has within [pos, pos + len), left-aligned.
    auto step_tokens = at::zeros({B, len}, at::kLong);
    auto step_seg = at::zeros({B, len}, at::kLong);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t have = std::clamp<int64_t>(lengths[static_cast<size_t>(b)] - pos, 0, len);
      if (have == 0) continue;
      step_tokens[b].narrow(0, 0, have).copy_(tokens[b].narrow(0, pos, have));
      step_seg[b].narrow(0, 0, have).fill_(1);
    }
    auto out = model->forward({.tokens = step_tokens, .segments = step_seg}, &cache);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t have = std::clamp<int64_t>(lengths[static_cast<size_t>(b)] - pos, 0, len);
      if (have == 0) continue;
      INFO("row " << b << " positions " << pos << ".." << pos + have);
      CHECK(max_abs_diff(out[b].narrow(0, 0, have), full[b].narrow(0, pos, have)) <= 1e-5);
    }
    pos += len;
  }
  for (int64_t b = 0; b < B; ++b) CHECK(cache.length(b) == lengths[static_cast<size_t>(b)]);
}

TEST_CASE("transformer: packed sequences equal separate forwards", "[model]") {
  at::manual_seed(1);
  auto cfg = small_config(true, false);
  auto model = make_model(cfg);
  c10::NoGradGuard g;
  auto a = at::randint(cfg.vocab_size, {1, 6}, at::kLong), b = at::randint(cfg.vocab_size, {1, 9}, at::kLong);
  auto packed = at::cat({a, b, at::zeros({1, 2}, at::kLong)}, 1);
  auto seg = at::cat({at::full({1, 6}, 1, at::kLong), at::full({1, 9}, 2, at::kLong), at::zeros({1, 2}, at::kLong)}, 1);
  auto out = model->forward({.tokens = packed, .segments = seg});
  CHECK(max_abs_diff(out[0].narrow(0, 0, 6), model->forward({.tokens = a})[0]) <= 1e-5);
  CHECK(max_abs_diff(out[0].narrow(0, 6, 9), model->forward({.tokens = b})[0]) <= 1e-5);
  CHECK_FALSE(at::isnan(out).any().item<bool>());  // padding rows stay finite
}

TEST_CASE("transformer: explicit positions shift RoPE like a longer context", "[model]") {
  auto cfg = small_config();
  auto model = make_model(cfg);
  c10::NoGradGuard g;
  auto t = at::randint(cfg.vocab_size, {1, 5}, at::kLong);
  auto base = model->forward({.tokens = t});
  auto same = model->forward({.tokens = t, .positions = at::arange(5, at::kLong).unsqueeze(0)});
  auto shifted = model->forward({.tokens = t, .positions = at::arange(5, at::kLong).unsqueeze(0) + 7});
  CHECK(max_abs_diff(base, same) == 0.0);
  // Relative positions are what RoPE encodes: a uniform shift changes little (fp rounding only).
  CHECK(max_abs_diff(base, shifted) <= 1e-4);
}

TEST_CASE("transformer: init is deterministic per seed and has HF's statistics", "[model]") {
  auto cfg = rlx::model_preset("tiny");
  rlx::Transformer a(cfg), b(cfg), c(cfg);
  a.init_weights(11), b.init_weights(11), c.init_weights(12);
  auto pa = a.hf_parameters(), pb = b.hf_parameters(), pc = c.hf_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) CHECK(at::equal(pa[i].second, pb[i].second));
  CHECK_FALSE(at::equal(pa[0].second, pc[0].second));
  auto emb = pa[0].second;
  CHECK(pa[0].first == "model.embed_tokens.weight");
  CHECK(std::abs(emb.mean().item<double>()) < 0.002);
  CHECK(std::abs(emb.std().item<double>() - 0.02) < 0.001);
  for (auto& [name, p] : pa)
    if (name.find("norm") != std::string::npos) CHECK(at::all(p == 1).item<bool>());
  CHECK(static_cast<int64_t>(a.parameters().size()) > 0);
  int64_t count = 0;
  for (auto& [_, p] : pa) count += p.numel();
  CHECK(count == cfg.num_parameters());
}

TEST_CASE("transformer: bf16 forward stays close to fp32 and gradients flow", "[model]") {
  auto cfg = small_config(true);
  auto model = make_model(cfg);
  auto t = at::randint(cfg.vocab_size, {2, 8}, at::kLong);
  auto ref = model->forward({.tokens = t}).detach();
  rlx::Transformer half(cfg, at::kBFloat16);
  {
    c10::NoGradGuard g;
    auto src = model->hf_parameters(), dst = half.hf_parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
  }
  auto out = half.forward({.tokens = t}).to(at::kFloat);
  CHECK(out.scalar_type() == at::kFloat);
  // bf16 has 8 mantissa bits; logits here are O(0.1-1).
  CHECK(max_abs_diff(out, ref) < 0.1);

  auto loss = model->forward({.tokens = t}).logsumexp(-1).mean();
  loss.backward();
  for (auto& [name, p] : model->hf_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().abs().sum().item<double>() > 0);
  }
}

TEST_CASE("transformer: RoPE inverse frequencies follow HF's formulas", "[model]") {
  auto cfg = rlx::model_preset("tiny");  // head_dim 16, theta 1e4
  auto inv = rlx::rope_inv_freq(cfg);
  REQUIRE(inv.size(0) == 8);
  CHECK(inv[0].item<double>() == Approx(1.0));
  CHECK(inv[1].item<double>() == Approx(std::pow(1e4, -2.0 / 16)).epsilon(1e-6));
  cfg.rope_scaling = {.type = rlx::RopeType::linear, .factor = 2.0};
  CHECK(rlx::rope_inv_freq(cfg)[1].item<double>() == Approx(std::pow(1e4, -2.0 / 16) / 2).epsilon(1e-6));
  // llama3: factor 8, context 8192. High frequencies (wavelength < 8192/4) unchanged, low ones
  // (wavelength > 8192/1) divided by 8, the band between interpolated.
  cfg.rope_scaling = {.type = rlx::RopeType::llama3, .factor = 8.0};
  auto l3 = rlx::rope_inv_freq(cfg), plain = rlx::rope_inv_freq(rlx::model_preset("tiny"));
  for (int i = 0; i < 8; ++i) {
    const double f = plain[i].item<double>(), wavelen = 2 * M_PI / f, g = l3[i].item<double>();
    if (wavelen < 2048) CHECK(g == Approx(f));
    else if (wavelen > 8192) CHECK(g == Approx(f / 8));
    else CHECK((g < f && g > f / 8));
  }
}

TEST_CASE("transformer: bad inputs are rejected with a clear error", "[model]") {
  auto cfg = small_config();
  auto model = make_model(cfg);
  CHECK_THROWS_WITH(model->forward({.tokens = at::full({1, 3}, cfg.vocab_size, at::kLong)}),
                    Contains("token ids must be in [0, 97)"));
  CHECK_THROWS_WITH(model->forward({.tokens = at::zeros({3}, at::kLong)}), Contains("[batch, time]"));
  rlx::DenseKVCache cache(cfg, 1, 4, at::kFloat, at::kCPU);
  CHECK_THROWS_WITH(model->forward({.tokens = at::zeros({1, 5}, at::kLong)}, &cache), Contains("capacity is 4"));
  auto bad = cfg;
  bad.num_kv_heads = 3;
  CHECK_THROWS_WITH(rlx::Transformer(bad), Contains("multiple of num_kv_heads"));
  CHECK_THROWS_WITH(rlx::model_preset("huge"), Contains("unknown model preset 'huge'"));
}

TEST_CASE("transformer: presets have the published parameter counts", "[model]") {
  // Qwen2.5-0.5B: 494,032,768 parameters (HF model card: 0.49B).
  CHECK(rlx::model_preset("qwen2.5-0.5b", rlx::Arch::qwen2).num_parameters() == 494032768);
  // SmolLM2-360M: 361,821,120.
  CHECK(rlx::model_preset("smollm2-360m").num_parameters() == 361821120);
  CHECK(rlx::model_preset("tiny").num_parameters() < 1'000'000);
}

TEST_CASE("transformer: fused projections compute the same forward, take weight updates, keep gradients", "[model]") {
  for (bool bias : {false, true}) {
    INFO("biases " << bias);
    const auto cfg = small_config(bias);
    auto plain = make_model(cfg), fused = make_model(cfg);
    {
      c10::NoGradGuard g;  // make_model's perturbations draw from the global generator: copy them
      auto src = plain->hf_parameters(), dst = fused->hf_parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
    }
    fused->fuse_projections();
    CHECK(fused->fused());
    const auto tokens = at::randint(97, {2, 9}, at::TensorOptions().dtype(at::kLong));
    {
      c10::NoGradGuard g;
      CHECK(max_abs_diff(plain->forward({.tokens = tokens}), fused->forward({.tokens = tokens})) < 1e-5);
      // A weight update copies into the parameters: the fused GEMMs see it.
      auto named = [](rlx::Transformer& m, const std::string& name) {
        for (auto& [n, p] : m.hf_parameters())
          if (n == name) return p;
        FAIL("no parameter " << name);
        return at::Tensor();
      };
      for (const char* name : {"model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight"}) {
        auto update = at::randn(named(*plain, name).sizes()) * 0.2;
        named(*plain, name).copy_(update);
        named(*fused, name).copy_(update);
      }
      CHECK(max_abs_diff(plain->forward({.tokens = tokens}), fused->forward({.tokens = tokens})) < 1e-5);
    }
    // With autograd the parameters themselves are used: their gradients match.
    plain->forward({.tokens = tokens}).pow(2).mean().backward();
    fused->forward({.tokens = tokens}).pow(2).mean().backward();
    auto a = plain->hf_parameters(), b = fused->hf_parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      REQUIRE(b[i].second.grad().defined());
      CHECK(max_abs_diff(a[i].second.grad(), b[i].second.grad()) < 1e-5);
    }
  }
}
