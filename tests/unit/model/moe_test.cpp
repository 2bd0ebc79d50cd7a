// Qwen3, Mistral and the mixtures of experts (Qwen3-MoE, Mixtral): each family's forward
// against a direct computation written here from HF's modelling code (experts run one
// token at a time), gradients against finite differences, batch invariance, routing replay
// and the routing trace, LoRA on experts, checkpoints both ways, presets.
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "../helpers.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/safetensors.hpp"
#include "rlx/model/transformer.hpp"

using Catch::Matchers::Contains;
using rlx::Arch;
using rlx::test::TempDir;

namespace {

// A tiny shape of `arch`: 2 layers, head_dim 8 (so a q/k norm has something to normalise),
// 6 experts of which 2 are used (3 for qwen3_moe, without renormalisation).
rlx::ModelConfig tiny(Arch arch) {
  auto c = rlx::model_preset(rlx::is_moe(arch) ? "tiny-moe" : "tiny", arch);
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  if (rlx::is_moe(arch)) {
    c.num_experts = 6;
    c.moe_intermediate_size = arch == Arch::mixtral ? c.intermediate_size : 12;
    c.num_experts_per_tok = arch == Arch::qwen3_moe ? 3 : 2;
    c.norm_topk_prob = arch == Arch::mixtral;
  }
  c.tie_word_embeddings = arch != Arch::mistral;
  c.validate();
  return c;
}

std::shared_ptr<rlx::Transformer> make(const rlx::ModelConfig& c, uint64_t seed, double scale = 8.0) {
  auto m = std::make_shared<rlx::Transformer>(c);
  m->init_weights(seed);
  // Norm weights away from 1 and a wider init, so a misplaced norm or a wrong gate shows.
  c10::NoGradGuard g;
  for (auto& [name, p] : m->hf_parameters()) {
    if (name.find("norm.weight") != std::string::npos) p.uniform_(0.5, 1.5);
    else p.mul_(scale);
  }
  return m;
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
}

// HF's modelling code, written out: one sequence [T], positions 0..T-1, experts token by token.
at::Tensor reference_logits(const rlx::Transformer& m, const at::Tensor& tokens) {
  const auto& c = m.config();
  std::map<std::string, at::Tensor> P;
  for (auto& [n, p] : m.hf_parameters()) P[n] = p.detach();
  auto W = [&](const std::string& n) { return P.at(n); };
  const int64_t T = tokens.size(0), Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  auto h = W("model.embed_tokens.weight").index_select(0, tokens);  // [T, H]
  auto inv = 1.0 / at::pow(c.rope_theta, at::arange(0, D, 2).to(at::kDouble) / double(D));
  auto ang = at::arange(T).to(at::kDouble).unsqueeze(1) * inv.unsqueeze(0);
  auto cos = at::cat({ang.cos(), ang.cos()}, -1).to(at::kFloat), sin = at::cat({ang.sin(), ang.sin()}, -1).to(at::kFloat);
  auto rope = [&](const at::Tensor& x) {  // x [T, heads, D]
    auto x1 = x.narrow(-1, 0, D / 2), x2 = x.narrow(-1, D / 2, D / 2);
    return x * cos.unsqueeze(1) + at::cat({-x2, x1}, -1) * sin.unsqueeze(1);
  };
  auto swiglu = [](const at::Tensor& x, const at::Tensor& g, const at::Tensor& u, const at::Tensor& d) {
    return at::linear(at::silu(at::linear(x, g)) * at::linear(x, u), d);
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string L = fmt::format("model.layers.{}.", l);
    auto x = rms(h, W(L + "input_layernorm.weight"), c.rms_norm_eps);
    auto q = at::linear(x, W(L + "self_attn.q_proj.weight")).view({T, Hq, D});
    auto k = at::linear(x, W(L + "self_attn.k_proj.weight")).view({T, Hkv, D});
    auto v = at::linear(x, W(L + "self_attn.v_proj.weight")).view({T, Hkv, D});
    if (c.qk_norm) {
      q = rms(q, W(L + "self_attn.q_norm.weight"), c.rms_norm_eps);
      k = rms(k, W(L + "self_attn.k_norm.weight"), c.rms_norm_eps);
    }
    q = rope(q), k = rope(k);
    k = k.repeat_interleave(Hq / Hkv, 1), v = v.repeat_interleave(Hq / Hkv, 1);
    auto s = at::einsum("qhd,khd->hqk", {q, k}) / std::sqrt(double(D));
    s = s.masked_fill(at::ones({T, T}, at::kBool).triu(1), -INFINITY);
    auto a = at::einsum("hqk,khd->qhd", {at::softmax(s, -1), v}).reshape({T, Hq * D});
    h = h + at::linear(a, W(L + "self_attn.o_proj.weight"));
    x = rms(h, W(L + "post_attention_layernorm.weight"), c.rms_norm_eps);
    if (!c.is_sparse(l)) {
      h = h + swiglu(x, W(L + "mlp.gate_proj.weight"), W(L + "mlp.up_proj.weight"), W(L + "mlp.down_proj.weight"));
      continue;
    }
    const bool mix = c.arch == Arch::mixtral;
    const std::string M = L + (mix ? "block_sparse_moe." : "mlp.");
    std::vector<at::Tensor> rows;
    for (int64_t t = 0; t < T; ++t) {
      auto p = at::softmax(at::linear(x[t], W(M + "gate.weight")).to(at::kFloat), -1);
      auto [w, e] = p.topk(c.num_experts_per_tok);
      if (c.norm_topk_prob) w = w / w.sum();
      auto y = at::zeros({c.hidden_size});
      for (int64_t j = 0; j < c.num_experts_per_tok; ++j) {
        const std::string X = fmt::format("{}experts.{}.", M, e[j].item<int64_t>());
        y = y + w[j] * (mix ? swiglu(x[t], W(X + "w1.weight"), W(X + "w3.weight"), W(X + "w2.weight"))
                            : swiglu(x[t], W(X + "gate_proj.weight"), W(X + "up_proj.weight"), W(X + "down_proj.weight")));
      }
      rows.push_back(y);
    }
    h = h + at::stack(rows);
  }
  h = rms(h, W("model.norm.weight"), c.rms_norm_eps);
  return at::linear(h, c.tie_word_embeddings ? W("model.embed_tokens.weight") : W("lm_head.weight"));
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

TEST_CASE("moe: each family's forward equals HF's computation written out, experts token by token", "[model][moe]") {
  at::manual_seed(1);  // LibTorch seeds its default generator at random
  auto arch = GENERATE(Arch::qwen3, Arch::mistral, Arch::qwen3_moe, Arch::mixtral);
  CAPTURE(rlx::config::enum_to_string(arch));
  auto m = make(tiny(arch), 3);
  auto tokens = at::randint(37, {11}, at::kLong);
  c10::NoGradGuard g;
  auto ours = m->forward({.tokens = tokens.unsqueeze(0)})[0];
  auto ref = reference_logits(*m, tokens);
  // fp32 throughout; logits of magnitude ~1-10 after sums of a few dozen products: 1e-4.
  CHECK(ours.abs().max().item<double>() > 0.1);
  CHECK(max_diff(ours, ref) < 1e-4);
  // A q/k norm's weight matters (qwen3), and every expert of the sparse layers is used by some token.
  if (arch == Arch::qwen3) CHECK(m->hf_parameters().size() == 2 * 11 + 2);
}

TEST_CASE("moe: a request alone equals the same request in a padded batch; grouped and dense experts agree",
          "[model][moe]") {
  at::manual_seed(2);  // LibTorch seeds its default generator at random
  auto arch = GENERATE(Arch::qwen3_moe, Arch::mixtral);
  auto m = make(tiny(arch), 5);
  c10::NoGradGuard g;
  auto a = at::randint(37, {1, 9}, at::kLong);
  auto batch = at::randint(37, {3, 9}, at::kLong);
  batch[1].copy_(a[0]);
  auto seg = at::ones({3, 9}, at::kLong);
  seg[2].narrow(0, 5, 4).zero_();  // a padded row beside it
  auto alone = m->forward({.tokens = a})[0];
  auto together = m->forward({.tokens = batch, .segments = seg})[1];
  // The same routing and per-token arithmetic; only a GEMM's row count differs (fp32, |x| ~ 1,
  // sums of 16-24 products): within 64 eps of the logits' magnitude.
  CHECK(max_diff(alone, together) <= 64 * 1.2e-7 * std::max(1.0, alone.abs().max().item<double>()));
  m->fuse_projections();
  m->set_moe_strategy(rlx::MoeStrategy::dense);
  auto dense = m->forward({.tokens = batch, .segments = seg});
  m->set_moe_strategy(rlx::MoeStrategy::grouped);
  auto grouped = m->forward({.tokens = batch, .segments = seg});
  CHECK(max_diff(dense, grouped) < 1e-5);
  CHECK(max_diff(grouped[1], together) < 1e-5);
  // Each (token, slot) through its own expert's stacked matrices (on CUDA the expert-indexed
  // GEMV; here the same products by gathering the matrices).
  m->set_moe_strategy(rlx::MoeStrategy::gathered);
  auto gathered = m->forward({.tokens = batch, .segments = seg});
  CHECK(max_diff(gathered, grouped) < 1e-5);
}

TEST_CASE("moe: gradients of every parameter, the router's included, match finite differences", "[model][moe]") {
  at::manual_seed(3);  // LibTorch seeds its default generator at random
  auto arch = GENERATE(Arch::qwen3, Arch::qwen3_moe, Arch::mixtral);
  CAPTURE(rlx::config::enum_to_string(arch));
  auto m = make(tiny(arch), 7, 2.0);
  auto tokens = at::randint(37, {2, 6}, at::kLong);
  auto probe = at::randn({2, 6, 37});
  rlx::RoutingTrace trace;
  trace.aux_loss_coef = arch == Arch::mixtral ? 0.5 : 0.0;  // the load-balancing loss's gradient too
  auto loss = [&](rlx::RoutingTrace* t) { return (m->forward({.tokens = tokens, .trace = t}) * probe).sum(); };
  const double loss_size = std::abs(loss(nullptr).item<double>());
  loss(&trace).backward();
  if (trace.aux_loss_coef > 0) CHECK(trace.aux_loss() > 0.9);  // E * sum f P >= 1 at its balanced minimum
  const bool sparse = rlx::is_moe(arch);
  int checked = 0;
  for (auto& [name, p] : m->hf_parameters()) {
    if (name.find("embed") != std::string::npos) continue;
    CAPTURE(name);
    auto d = at::randn(p.sizes());
    // An expert no token chose has no gradient (and a zero derivative).
    const double analytic = p.grad().defined() ? (p.grad() * d).sum().item<double>() : 0.0;
    // Central differences at two steps where the routing stays the same on both sides (top-k
    // is a step function of the router's scores). Their difference estimates the fp32
    // rounding and truncation error of the quotient, which bounds the comparison.
    auto central = [&](double eps) -> std::optional<double> {
      auto value = [&](double s, at::Tensor& routing) {
        c10::NoGradGuard g;
        p.add_(d, s);
        rlx::RoutingTrace t;
        const double v = loss(&t).item<double>() + trace.aux_loss_coef * t.aux_loss();
        if (sparse) routing = t.routing();
        p.add_(d, -s);
        return v;
      };
      at::Tensor up, down;
      const double hi = value(eps, up), lo = value(-eps, down);
      if (sparse && !(at::equal(up, trace.routing()) && at::equal(down, trace.routing()))) return std::nullopt;
      return (hi - lo) / (2 * eps);
    };
    std::optional<double> coarse, fine;
    double step = 1e-2;
    while (!fine && (step /= 4) > 1e-5) coarse = central(step), fine = coarse ? central(step / 2) : coarse;
    if (!fine) continue;  // every step flips a routing: nothing to compare here
    ++checked;
    // Truncation (the two steps' difference) and rounding: the fp32 loss's logits each carry
    // a relative error of a few eps, about 8 eps of the loss's size over its difference quotient.
    const double fd_error = std::abs(*coarse - *fine) + 8 * 1.2e-7 * loss_size / (step / 2);
    CAPTURE(analytic, *coarse, *fine, fd_error);
    CHECK(std::abs(*fine - analytic) <= 0.01 * std::abs(analytic) + 2 * fd_error + 1e-4);
  }
  CHECK(checked >= static_cast<int>(m->hf_parameters().size()) - 4);
}

TEST_CASE("moe: routing replay uses the recorded experts; the trace counts, agrees and balances", "[model][moe]") {
  at::manual_seed(4);  // LibTorch seeds its default generator at random
  auto c = tiny(Arch::qwen3_moe);
  auto m = make(c, 11);
  auto tokens = at::randint(37, {2, 8}, at::kLong);
  c10::NoGradGuard g;
  rlx::RoutingTrace trace;
  auto base = m->forward({.tokens = tokens, .trace = &trace});
  auto routing = trace.routing();
  REQUIRE(routing.sizes() == at::IntArrayRef{2, 8, 2, 3});
  CHECK(trace.agreement() == 1.0);
  CHECK(trace.valid_tokens() == 16);
  CHECK(at::stack(trace.counts).sum().item<double>() == 2 * 16 * 3);  // every (token, slot), each layer
  CHECK(trace.max_over_mean_load() >= 1.0);
  CHECK(trace.router_entropy() > 0);
  CHECK(trace.router_entropy() <= std::log(6.0) + 1e-6);
  // Replaying the model's own routing changes nothing.
  rlx::RoutingTrace again;
  CHECK(at::equal(m->forward({.tokens = tokens, .routing = routing, .trace = &again}), base));
  CHECK(again.agreement() == 1.0);
  // Other experts for some tokens: those tokens' logits change, agreement drops below 1, the
  // used experts are the forced ones, and rows of -1 route freely.
  auto forced = routing.clone();
  forced.select(0, 0).select(0, 2).select(0, 0).copy_(at::tensor({5, 4, 3}));
  forced.select(0, 1).fill_(-1);
  rlx::RoutingTrace replay;
  auto out = m->forward({.tokens = tokens, .routing = forced, .trace = &replay});
  CHECK(max_diff(out[0][2], base[0][2]) > 1e-3);
  CHECK(at::equal(out[1], base[1]));
  CHECK(at::equal(std::get<0>(at::sort(replay.routing()[0][2][0])), at::tensor({3, 4, 5}, at::kLong)));
  const bool same_set = at::equal(std::get<0>(at::sort(routing[0][2][0])), at::tensor({3, 4, 5}, at::kLong));
  CHECK(replay.agreement() == Approx(same_set ? 1.0 : 1.0 - 1.0 / 32));
  // Bad routing: named shape, and an expert the layer does not have.
  CHECK_THROWS_WITH(m->forward({.tokens = tokens, .routing = routing.narrow(2, 0, 1)}), Contains("sparse layers"));
  auto bad = routing.clone();
  bad[0][0][0][0] = 6;
  CHECK_THROWS_WITH(m->forward({.tokens = tokens, .routing = bad}), Contains("expert 6"));
}

TEST_CASE("moe: padding is not counted by the trace and does not change the other tokens", "[model][moe]") {
  at::manual_seed(5);  // LibTorch seeds its default generator at random
  auto m = make(tiny(Arch::mixtral), 13);
  auto tokens = at::randint(37, {1, 8}, at::kLong);
  auto seg = at::ones({1, 8}, at::kLong);
  seg[0].narrow(0, 6, 2).zero_();
  c10::NoGradGuard g;
  rlx::RoutingTrace t;
  m->forward({.tokens = tokens, .segments = seg, .trace = &t});
  CHECK(t.valid_tokens() == 6);
  CHECK(at::stack(t.counts).sum().item<double>() == 2 * 6 * 2);
}

TEST_CASE("moe: LoRA on attention and on every expert, PEFT's names, zero B leaves the model unchanged",
          "[model][moe][lora]") {
  at::manual_seed(6);  // LibTorch seeds its default generator at random
  auto c = tiny(Arch::qwen3_moe);
  auto m = make(c, 17);
  auto tokens = at::randint(37, {1, 7}, at::kLong);
  at::Tensor before;
  {
    c10::NoGradGuard g;
    before = m->forward({.tokens = tokens});
  }
  m->add_lora({.rank = 2, .alpha = 4, .targets = {"q_proj", "gate_proj", "down_proj"}}, rlx::LoraMode::unmerged);
  m->init_lora(1);
  auto names = m->lora_parameters();
  // 2 layers x (q + 6 experts x (gate + down)) x (A, B)
  CHECK(names.size() == 2 * (1 + 6 * 2) * 2);
  bool expert_named = false;
  for (auto& [n, p] : names) expert_named = expert_named || n == "model.layers.1.mlp.experts.5.down_proj.lora_B.weight";
  CHECK(expert_named);
  {
    c10::NoGradGuard g;
    CHECK(at::equal(m->forward({.tokens = tokens}), before));
    for (auto& [n, p] : names)
      if (n.find("lora_B") != std::string::npos) p.normal_(0, 0.5);
  }
  // Adapters of experts train: the gradient reaches an expert's B.
  (m->forward({.tokens = tokens}) * at::randn({1, 7, 37})).sum().backward();
  double expert_grad = 0;
  for (auto& [n, p] : names)
    if (n.find("experts") != std::string::npos && p.grad().defined()) expert_grad += p.grad().abs().sum().item<double>();
  CHECK(expert_grad > 0);
  // Merged adapters serve the same function as unmerged ones.
  auto merged = std::make_shared<rlx::Transformer>(c);
  {
    c10::NoGradGuard g;
    for (auto& [n, p] : merged->hf_parameters()) p.copy_(m->named_parameters()[n]);
  }
  merged->add_lora({.rank = 2, .alpha = 4, .targets = {"q_proj", "gate_proj", "down_proj"}}, rlx::LoraMode::merged);
  {
    c10::NoGradGuard g;
    auto mp = merged->named_parameters();
    for (auto& [n, p] : names) mp[n].copy_(p);
    merged->merge_lora();
    CHECK(max_diff(merged->forward({.tokens = tokens}), m->forward({.tokens = tokens})) < 1e-4);
  }
}

TEST_CASE("moe: save and load round-trip bit-exact with HF's names and config fields, sharded too", "[model][moe][hf]") {
  at::manual_seed(7);  // LibTorch seeds its default generator at random
  auto arch = GENERATE(Arch::qwen3, Arch::mistral, Arch::qwen3_moe, Arch::mixtral);
  CAPTURE(rlx::config::enum_to_string(arch));
  TempDir dir;
  auto c = tiny(arch);
  if (arch == Arch::qwen3_moe) c.mlp_only_layers = {0};  // a dense layer among sparse ones
  auto m = make(c, 19);
  rlx::save_hf(*m, dir.path, {.max_shard_bytes = 20'000});
  auto j = nlohmann::json::parse(rlx::test::read_file(dir / "config.json"));
  CHECK(j["model_type"] == rlx::config::enum_to_string(arch));
  auto back = rlx::read_hf_config(dir.path);
  CHECK(back == c);
  auto loaded = rlx::load_hf(dir.path);
  auto a = m->hf_parameters(), b = loaded->hf_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].first == b[i].first);
    CHECK(at::equal(a[i].second, b[i].second));
  }
  std::set<std::string> names;
  for (auto& [n, p] : a) names.insert(n);
  switch (arch) {
    case Arch::qwen3: CHECK(names.count("model.layers.1.self_attn.k_norm.weight")); break;
    case Arch::mistral: CHECK(names.count("lm_head.weight")); break;
    case Arch::qwen3_moe:
      CHECK(names.count("model.layers.0.mlp.gate_proj.weight"));
      CHECK(names.count("model.layers.1.mlp.gate.weight"));
      CHECK(names.count("model.layers.1.mlp.experts.5.up_proj.weight"));
      break;
    case Arch::mixtral:
      CHECK(names.count("model.layers.0.block_sparse_moe.gate.weight"));
      CHECK(names.count("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
      break;
    default: break;
  }
  auto tokens = at::randint(37, {2, 5}, at::kLong);
  c10::NoGradGuard g;
  CHECK(at::equal(m->forward({.tokens = tokens}), loaded->forward({.tokens = tokens})));
}

TEST_CASE("moe: configs from the Hub load; what rlx does not build is refused by name", "[model][moe][hf]") {
  at::manual_seed(8);  // LibTorch seeds its default generator at random
  auto j = nlohmann::json::parse(R"({"model_type":"qwen3_moe","vocab_size":100,"hidden_size":32,
    "intermediate_size":64,"moe_intermediate_size":16,"num_hidden_layers":4,"num_attention_heads":4,
    "num_key_value_heads":2,"head_dim":8,"num_experts":8,"num_experts_per_tok":2,"norm_topk_prob":true,
    "decoder_sparse_step":2,"mlp_only_layers":[3],"use_sliding_window":false,"sliding_window":null,
    "rope_theta":1000000.0,"tie_word_embeddings":false,"router_aux_loss_coef":0.001})");
  auto c = rlx::model_config_from_hf(j, "config.json");
  CHECK(c.qk_norm);
  CHECK(c.sparse_layers() == std::vector<int64_t>{1});
  CHECK(c.num_active_parameters() < c.num_parameters());
  // transformers >= 5 saves the expert count as num_local_experts (its attribute_map).
  auto v5 = j;
  v5.erase("num_experts");
  v5["num_local_experts"] = 8;
  CHECK(rlx::model_config_from_hf(v5, "config.json").num_experts == 8);
  v5.erase("num_local_experts");
  CHECK_THROWS_WITH(rlx::model_config_from_hf(v5, "config.json"), Contains("num_experts: required"));
  auto bad = j;
  bad["model_type"] = "qwen2_moe";
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "config.json"),
                    Contains("not supported") && Contains("qwen3_moe") && Contains("mixtral"));
  auto mistral = nlohmann::json::parse(R"({"model_type":"mistral","vocab_size":100,"hidden_size":32,
    "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":32768,"sliding_window":4096})");
  CHECK_THROWS_WITH(rlx::model_config_from_hf(mistral, "config.json"), Contains("sliding_window"));
  mistral["sliding_window"] = nullptr;
  CHECK(rlx::model_config_from_hf(mistral, "config.json").arch == Arch::mistral);
  auto mix = nlohmann::json::parse(R"({"model_type":"mixtral","vocab_size":100,"hidden_size":32,
    "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "num_local_experts":4,"num_experts_per_tok":5})");
  CHECK_THROWS_WITH(rlx::model_config_from_hf(mix, "config.json"), Contains("num_experts_per_tok"));
  // A missing expert is named with the shape it needs; nothing half-loaded is returned.
  TempDir dir;
  auto m = make(tiny(Arch::mixtral), 23);
  rlx::save_hf(*m, dir.path);
  auto f = rlx::SafetensorsFile::open(dir / "model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> kept;
  for (const auto& e : f.header().entries)
    if (e.name != "model.layers.1.block_sparse_moe.experts.4.w3.weight") kept.emplace_back(e.name, f.tensor(e.name));
  rlx::save_safetensors(dir / "model.safetensors", kept, {{"format", "pt"}});
  CHECK_THROWS_WITH(rlx::load_hf(dir.path), Contains("experts.4.w3.weight") && Contains("[24, 16]"));
}

TEST_CASE("moe: presets have the published parameter counts", "[model][moe]") {
  at::manual_seed(9);  // LibTorch seeds its default generator at random
  CHECK(rlx::model_preset("qwen3-0.6b").num_parameters() == 596049920);
  CHECK(rlx::model_preset("qwen3-0.6b").arch == Arch::qwen3);
  CHECK(rlx::model_preset("qwen3-30b-a3b").num_parameters() == 30532122624);
  CHECK(rlx::model_preset("qwen3-30b-a3b").num_active_parameters() < 3.5e9);
  CHECK(rlx::model_preset("mixtral-8x7b").num_parameters() == 46702792704);
  CHECK(rlx::model_preset("mistral-7b").num_parameters() == 7248023552);
  CHECK(rlx::model_preset("tiny-moe", Arch::qwen3).arch == Arch::qwen3_moe);
  CHECK(rlx::model_preset("tiny-moe", Arch::mistral).arch == Arch::mixtral);
  // A generic sparse shape as Mixtral has experts of its MLP width, so it saves as mixtral.
  auto mix = rlx::model_preset("tiny-moe");
  CHECK(mix.arch == Arch::mixtral);
  CHECK(mix.intermediate_size == mix.moe_intermediate_size);
  CHECK_NOTHROW(rlx::model_config_to_hf(mix, at::kFloat));
  CHECK(rlx::model_preset("tiny", Arch::qwen3_moe).arch == Arch::qwen3);
}

namespace {
// transformers v5's layout of `m`'s weights, built here from its per-expert tensors: per sparse
// layer mlp.experts.gate_up_proj [E, 2I, H] (each expert's gate rows, then its up rows) and
// mlp.experts.down_proj [E, H, I], Mixtral's router renamed to mlp.gate.weight; `transposed`
// stores [E, H, 2I] and [E, I, H] instead, as some Hub checkpoints of the same names do.
std::vector<std::pair<std::string, at::Tensor>> packed_layout(const rlx::Transformer& m, bool transposed) {
  const auto& c = m.config();
  const bool mixtral = c.arch == Arch::mixtral;
  std::map<std::string, at::Tensor> per_expert;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, p] : m.hf_parameters()) {
    if (name.find(".experts.") != std::string::npos) {
      per_expert[name] = p.detach();
      continue;
    }
    std::string n = name;
    if (auto at = n.find(".block_sparse_moe.gate."); at != std::string::npos) n.replace(at, 17, ".mlp");
    out.emplace_back(n, p.detach());
  }
  for (int64_t l : c.sparse_layers()) {
    const std::string from = fmt::format("model.layers.{}.{}.experts.", l, mixtral ? "block_sparse_moe" : "mlp");
    std::vector<at::Tensor> gate_up, down;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      auto W = [&](const char* qwen, const char* mix) {
        return per_expert.at(fmt::format("{}{}.{}.weight", from, e, mixtral ? mix : qwen));
      };
      gate_up.push_back(at::cat({W("gate_proj", "w1"), W("up_proj", "w3")}, 0));
      down.push_back(W("down_proj", "w2"));
    }
    auto gu = at::stack(gate_up), dn = at::stack(down);
    if (transposed) {
      gu = gu.transpose(1, 2);
      dn = dn.transpose(1, 2);
    }
    out.emplace_back(fmt::format("model.layers.{}.mlp.experts.gate_up_proj", l), gu);
    out.emplace_back(fmt::format("model.layers.{}.mlp.experts.down_proj", l), dn);
  }
  return out;
}
}  // namespace

TEST_CASE("moe: transformers v5's packed experts load to the per-expert load's logits exactly", "[model][moe][hf]") {
  at::manual_seed(10);  // LibTorch seeds its default generator at random
  auto arch = GENERATE(Arch::qwen3_moe, Arch::mixtral);
  auto transposed = GENERATE(false, true);
  CAPTURE(rlx::config::enum_to_string(arch), transposed);
  auto c = rlx::model_preset("tiny-moe", arch);  // hidden 64, 8 experts of 64
  // Square shapes fit either orientation, so the other tensor of the layer decides: Mixtral's
  // down_proj [8, 64, 64] by its gate_up_proj, Qwen3-MoE's gate_up_proj [8, 64, 64] by its down_proj.
  if (arch == Arch::qwen3_moe) {
    c.moe_intermediate_size = 32;
    c.mlp_only_layers = {0};  // a dense layer beside the sparse one
  }
  c.validate();
  auto m = make(c, 31, 4.0);
  TempDir hub, v5;
  rlx::save_hf(*m, hub.path);
  auto per_expert = rlx::load_hf(hub.path);
  std::filesystem::copy_file(hub / "config.json", v5 / "config.json");
  auto tensors = packed_layout(*m, transposed);
  if (!transposed) {
    rlx::save_safetensors(v5 / "model.safetensors", tensors, {{"format", "pt"}});
  } else {  // sharded: the packed experts in a shard of their own
    std::vector<std::pair<std::string, at::Tensor>> rest, experts;
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    for (auto& t : tensors) {
      const bool packed = t.first.find(".experts.") != std::string::npos;
      (packed ? experts : rest).push_back(t);
      index["weight_map"][t.first] = packed ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    rlx::save_safetensors(v5 / "model-00001-of-00002.safetensors", rest, {{"format", "pt"}});
    rlx::save_safetensors(v5 / "model-00002-of-00002.safetensors", experts, {{"format", "pt"}});
    rlx::test::write_file(v5 / "model.safetensors.index.json", index.dump());
  }
  auto loaded = rlx::load_hf(v5.path);
  auto a = per_expert->hf_parameters(), b = loaded->hf_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].first);
    CHECK(at::equal(a[i].second, b[i].second));
  }
  auto tokens = at::randint(c.vocab_size, {2, 9}, at::kLong);
  c10::NoGradGuard g;
  CHECK(at::equal(per_expert->forward({.tokens = tokens}), loaded->forward({.tokens = tokens})));
  if (transposed) return;

  // Bad input, on the one-file layout.

  const std::string L = "model.layers.1.mlp.experts.";
  const auto E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  auto rewrite = [&](auto&& edit) {
    auto ts = tensors;
    edit(ts);
    rlx::save_safetensors(v5 / "model.safetensors", ts, {{"format", "pt"}});
  };
  auto named = [&](auto& ts, const std::string& n) {
    return std::find_if(ts.begin(), ts.end(), [&](auto& t) { return t.first == n; });
  };
  // A missing down_proj: the message names the tensor, the file and both layouts looked for.
  rewrite([&](auto& ts) { ts.erase(named(ts, L + "down_proj")); });
  const std::string expert0 = arch == Arch::mixtral ? "model.layers.1.block_sparse_moe.experts.0.w2.weight"
                                                    : L + "0.down_proj.weight";
  CHECK_THROWS_WITH(rlx::load_hf(v5.path),
                    Contains((v5 / "model.safetensors").string() + ": missing tensor '" + expert0 + "'") &&
                        Contains("the Hub's per-expert layout") &&
                        Contains(fmt::format("'{}down_proj' [{}, {}, {}] or [{}, {}, {}]", L, E, H, I, E, I, H)));
  // A packed tensor of neither orientation is named with the shapes this config needs.
  rewrite([&](auto& ts) { named(ts, L + "gate_up_proj")->second = at::zeros({E - 1, 2 * I, H}); });
  CHECK_THROWS_WITH(rlx::load_hf(v5.path), Contains("packed experts '" + L + "gate_up_proj' have shape [" +
                                                    std::to_string(E - 1)));
  // Both layouts at once: the per-expert tensors are read and the packed ones left over are an error.
  rewrite([&](auto& ts) {
    for (auto& [n, p] : per_expert->hf_parameters())
      if (n.find(".experts.") != std::string::npos) ts.emplace_back(n, p.detach());
  });
  CHECK_THROWS_WITH(rlx::load_hf(v5.path),
                    Contains("unexpected tensor 'model.layers.") && Contains(".mlp.experts.down_proj' (not part of"));
  if (arch == Arch::mixtral) {  // the router: the Hub's name, or transformers v5's under mlp.
    rewrite([&](auto& ts) { ts.erase(named(ts, "model.layers.0.mlp.gate.weight")); });
    CHECK_THROWS_WITH(rlx::load_hf(v5.path), Contains("missing tensor 'model.layers.0.block_sparse_moe.gate.weight'") &&
                                                 Contains("'model.layers.0.mlp.gate.weight' (transformers v5's name)"));
  }
}

TEST_CASE("moe: packed experts whose two tensors disagree on their orientation are refused", "[model][moe][hf]") {
  at::manual_seed(11);  // LibTorch seeds its default generator at random
  auto c = tiny(Arch::qwen3_moe);  // hidden 16, experts of 12: no shape fits both orientations
  auto m = make(c, 37);
  TempDir dir;
  rlx::save_hf(*m, dir.path);
  auto tensors = packed_layout(*m, false);
  for (auto& [n, t] : tensors)
    if (n == "model.layers.1.mlp.experts.down_proj") t = t.transpose(1, 2);
  rlx::save_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
  CHECK_THROWS_WITH(rlx::load_hf(dir.path), Contains("the packed experts of model.layers.1 disagree on their orientation") &&
                                                Contains("'model.layers.1.mlp.experts.gate_up_proj' [6, 24, 16]") &&
                                                Contains("'model.layers.1.mlp.experts.down_proj' [6, 12, 16]"));
}
