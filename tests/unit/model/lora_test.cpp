// LoRA adapters: the model's forward with them (unmerged, merged, fused), the sharded
// learner training only them, the base as KL's reference, checkpoints, PEFT export, and
// the engine's weight updates carrying only them.
#include <c10/core/GradMode.h>

#include "rlx/dist/fsdp.hpp"
#include "rlx/learner/checkpoint.hpp"
#include "rlx/learner/learner.hpp"
#include "rlx/learner/reference.hpp"
#include "rlx/launch/memory_plan.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/safetensors.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/rollout/engine.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "../helpers.hpp"
#include "../test_models.hpp"

namespace fs = std::filesystem;

namespace {

rlx::ModelConfig shape() {
  return rlx::test::test_model({.vocab = 29, .hidden = 16, .heads = 2, .kv_heads = 1, .head_dim = 8, .intermediate = 23,
                                .qwen2 = true});
}

rlx::LoraSpec spec(int64_t rank = 4, std::vector<std::string> targets = {}) {
  rlx::LoraSpec s;
  s.rank = rank;
  s.alpha = 8;
  if (!targets.empty()) s.targets = std::move(targets);
  return s;
}

// Random values in every adapter (B too, so that the update is not zero).
void randomise(const std::vector<std::pair<std::string, at::Tensor>>& adapters, uint64_t seed) {
  c10::NoGradGuard no_grad;
  at::manual_seed(seed);
  for (auto& [name, p] : adapters) p.copy_(at::randn(p.sizes()) * 0.2);
}

rlx::ForwardInput batch(const rlx::ModelConfig& cfg) {
  at::manual_seed(3);
  return {.tokens = at::randint(0, cfg.vocab_size, {2, 7}, at::kLong)};
}

std::vector<rlx::Sequence> sequences() {
  rlx::Sequence a, b;
  a.tokens = {1, 5, 7, 3, 9, 2, 4};
  a.loss_mask = {0, 1, 1, 1, 1, 1, 1};
  b.tokens = {2, 8, 6, 3, 1};
  b.loss_mask = {0, 0, 1, 1, 1};
  return {a, b};
}

rlx::StepResult nll_step(rlx::Learner& l) {
  return l.step(sequences(),
                [](const rlx::MicroBatch& mb, const rlx::TokenOutputs& out, const rlx::StepContext& ctx,
                   rlx::MetricSums&) { return -(out.logprobs * mb.loss_mask).sum() / ctx.global_loss_tokens; });
}

// A LoRA learner on `base`'s weights after `steps` NLL steps.
std::unique_ptr<rlx::Learner> trained(const rlx::Transformer& base, rlx::dist::Communicator& comm, rlx::LearnerOptions lo,
                                      int steps) {
  auto l = std::make_unique<rlx::Learner>(base.config(), comm, std::move(lo));
  l->load_from(base);
  for (int i = 0; i < steps; ++i) nll_step(*l);
  return l;
}

std::map<std::string, at::Tensor> by_name(const std::vector<std::pair<std::string, at::Tensor>>& v) {
  std::map<std::string, at::Tensor> m;
  for (const auto& [n, t] : v) m.emplace(n, t.detach().clone());
  return m;
}

}  // namespace

TEST_CASE("lora: an adapted forward is the base model with W + scale * B A, merged or not, fused or not", "[model][lora]") {
  const auto cfg = shape();
  rlx::Transformer base(cfg);
  base.init_weights(5);
  const auto in = batch(cfg);
  const auto s = spec(4, {"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"});  // some targets, not all

  rlx::Transformer adapted(cfg);
  for (auto& [n, p] : adapted.hf_parameters()) p.detach().copy_(by_name(base.hf_parameters()).at(n));
  adapted.add_lora(s, rlx::LoraMode::unmerged);
  // Names are PEFT's; hf_parameters() lists the base only.
  const auto adapters = adapted.lora_parameters();
  CHECK(adapters.size() == 2 * s.targets.size() * static_cast<size_t>(cfg.num_layers));
  CHECK(adapters.front().first == "model.layers.0.self_attn.q_proj.lora_A.weight");
  CHECK(adapted.hf_parameters().size() == base.hf_parameters().size());
  CHECK(adapted.sync_parameters().size() == adapters.size());
  // Freshly added (B = 0) and freshly initialised (B = 0, A random) the model is the base.
  adapted.init_lora(9);
  c10::NoGradGuard no_grad;
  CHECK(at::equal(adapted.forward(in), base.forward(in)));
  randomise(adapters, 1);
  const auto out = adapted.forward(in);
  CHECK_FALSE(at::allclose(out, base.forward(in), 1e-3, 1e-3));

  // The same delta written into the weights by hand.
  rlx::Transformer by_hand(cfg);
  auto ada = by_name(adapters);
  for (auto& [n, p] : by_hand.hf_parameters()) {
    auto w = by_name(base.hf_parameters()).at(n);
    const auto stem = n.substr(0, n.size() - std::string(".weight").size());
    if (ada.contains(stem + ".lora_A.weight"))
      w += s.scale() * at::matmul(ada.at(stem + ".lora_B.weight"), ada.at(stem + ".lora_A.weight"));
    p.copy_(w);
  }
  CHECK(at::allclose(out, by_hand.forward(in), 1e-5, 1e-5));
  // Switched off, the adapted model is the base again (KL's reference).
  adapted.set_lora_active(false);
  CHECK(at::equal(adapted.forward(in), base.forward(in)));
  adapted.set_lora_active(true);

  // An engine's model: merged (served weights = base + delta, made at each update) ...
  rlx::Transformer merged(cfg);
  for (auto& [n, p] : merged.hf_parameters()) p.copy_(by_name(base.hf_parameters()).at(n));
  merged.add_lora(s, rlx::LoraMode::merged);
  merged.fuse_projections();
  for (auto& [n, p] : merged.lora_parameters()) p.copy_(ada.at(n));
  CHECK(merged.merge_lora() > 0);
  CHECK(at::allclose(merged.forward(in), out, 1e-5, 1e-5));
  // ... and again after another update: merged from the kept base, not on top of the last merge.
  for (auto& [n, p] : merged.lora_parameters()) p.mul_(-1.0);
  merged.merge_lora();
  for (auto& [n, p] : merged.lora_parameters()) p.mul_(-1.0);
  merged.merge_lora();
  CHECK(at::allclose(merged.forward(in), out, 1e-5, 1e-5));
  // ... or unmerged on the fused (inference) path.
  rlx::Transformer fused(cfg);
  for (auto& [n, p] : fused.hf_parameters()) p.copy_(by_name(base.hf_parameters()).at(n));
  fused.add_lora(s, rlx::LoraMode::unmerged);
  fused.fuse_projections();
  for (auto& [n, p] : fused.lora_parameters()) p.copy_(ada.at(n));
  CHECK(at::allclose(fused.forward(in), out, 1e-5, 1e-5));

  // Bad specs are named.
  rlx::Transformer other(cfg);
  CHECK_THROWS_WITH(other.add_lora(spec(4, {"q_proj", "lm_head"}), rlx::LoraMode::unmerged),
                    Catch::Contains("model.lora.targets[1]") && Catch::Contains("lm_head"));
  CHECK_THROWS_WITH(other.add_lora(spec(4, {"q_proj", "q_proj"}), rlx::LoraMode::unmerged), Catch::Contains("twice"));
  other.add_lora(spec(), rlx::LoraMode::unmerged);
  CHECK_THROWS_WITH(other.add_lora(spec(), rlx::LoraMode::unmerged), Catch::Contains("already has adapters"));
}

TEST_CASE("lora: the sharded learner trains only the adapters, with the gradients autograd gives the plain model",
          "[learner][lora]") {
  const auto cfg = shape();
  auto comm = rlx::dist::single_process();
  rlx::Transformer base(cfg);
  base.init_weights(5);
  const auto s = spec(4);
  for (bool checkpointing : {false, true}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      rlx::LearnerOptions lo;
      lo.optimizer.lr = 1e-2;
      lo.optimizer.weight_decay = 0.1;
      lo.fsdp.lora = s;
      lo.fsdp.activation_checkpointing = checkpointing;
      lo.fsdp.compute_dtype = dtype;
      lo.seed = 7;
      rlx::Learner l(cfg, *comm, lo);
      l.load_from(base);
      // Trained: the adapters' units only, one per block, fp32; the base frozen in the compute dtype.
      const auto trained = l.model().trained_units();
      REQUIRE(trained.size() == static_cast<size_t>(cfg.num_layers));
      for (auto* u : trained) {
        CHECK(u->name.ends_with(".lora"));
        CHECK(u->shard.scalar_type() == at::kFloat);
      }
      for (auto& u : l.model().units())
        if (!u.trained) CHECK(u.shard.scalar_type() == dtype);
      CHECK(l.trained_tensors().size() == trained.size());

      // The first step's gradients against the plain model's (same adapters, autograd).
      rlx::Transformer plain(cfg);
      for (auto& [n, p] : plain.hf_parameters()) p.detach().copy_(by_name(base.hf_parameters()).at(n));
      plain.add_lora(s, rlx::LoraMode::unmerged);
      plain.init_lora(7);  // the learner's seed: the same A, B = 0
      for (auto& [n, p] : plain.hf_parameters()) p.requires_grad_(false);
      auto adapters0 = by_name(l.model().gather_lora_parameters());
      for (auto& [n, p] : plain.lora_parameters()) CHECK(at::equal(p, adapters0.at(n)));

      const auto base0 = by_name(l.model().gather_parameters());
      auto r1 = nll_step(l);
      CHECK(r1.grad_norm > 0);
      auto adapters1 = by_name(l.model().gather_lora_parameters());
      for (auto& [n, a] : adapters1) {
        // With B = 0 the gradient of each A is zero: only weight decay moves it. Every B moves.
        if (n.find("lora_A") != std::string::npos)
          CHECK(at::allclose(a, adapters0.at(n) * (1 - 1e-2 * 0.1), 1e-6, 1e-7));
        else
          CHECK_FALSE(at::equal(a, adapters0.at(n)));
      }
      nll_step(l);
      auto adapters2 = by_name(l.model().gather_lora_parameters());
      int moved = 0;  // by their gradients now, beyond the decay
      for (auto& [n, a] : adapters2)
        moved += n.find("lora_A") != std::string::npos && !at::allclose(a, adapters1.at(n) * (1 - 1e-2 * 0.1), 1e-6, 1e-7);
      CHECK(moved == static_cast<int>(s.targets.size()) * cfg.num_layers);
      // The base never moves (no gradient, no weight decay).
      auto lora_off = l.model().gather_lora_parameters();
      for (auto& [n, p] : lora_off) p.zero_();
      {
        // gather_parameters() merges; with zero adapters it is the base exactly.
        rlx::Learner probe(cfg, *comm, lo);
        probe.load_from(base);
        probe.model().load_lora(lora_off);
        for (auto& [n, p] : probe.model().gather_parameters()) CHECK(at::equal(p, base0.at(n)));
      }
      if (dtype != at::kFloat) continue;

      // The plain model's gradients at the learner's adapters after two steps match a third
      // step's shard gradients (one rank: the shard is the flat gradient).
      {
        c10::NoGradGuard no_grad;
        for (auto& [n, p] : plain.lora_parameters()) p.copy_(adapters2.at(n));
      }
      for (auto& [n, p] : plain.lora_parameters()) p.mutable_grad() = at::Tensor();
      double tokens = 0;
      at::Tensor loss = at::zeros({});
      for (const auto& sq : sequences()) {
        auto ids = at::tensor(std::vector<int64_t>(sq.tokens.begin(), sq.tokens.end())).view({1, -1});
        auto logp = at::log_softmax(plain.forward({.tokens = ids}), -1);
        for (size_t t = 1; t < sq.tokens.size(); ++t)
          if (sq.loss_mask[t]) loss = loss - logp[0][static_cast<int64_t>(t - 1)][sq.tokens[t]], tokens += 1;
      }
      (loss / tokens).backward();
      std::map<std::string, at::Tensor> want;
      for (auto& [n, p] : plain.lora_parameters()) want[n] = p.grad();
      const auto gather_grads = [&] {
        std::map<std::string, at::Tensor> got;
        for (auto* u : l.model().trained_units())
          for (const auto& sl : u->slots) got[sl.name] = u->shard.grad().narrow(0, sl.offset, sl.numel).view(sl.shape).clone();
        return got;
      };
      // What step() does before it updates: forward, backward, the root's reduction.
      for (auto t : l.trained_tensors()) t.mutable_grad() = at::Tensor();
      for (const auto& mb : rlx::pack_micro_batches(sequences(), lo.packing)) {
        auto logp = rlx::gather_logprobs(l.model().logits(l.model().forward_hidden({.tokens = mb.tokens, .segments = mb.segments})),
                                         mb.targets);
        (-(logp * mb.loss_mask).sum() / tokens).backward();
      }
      l.model().finish_backward();
      auto got = gather_grads();
      for (auto& [n, g] : want) CHECK(at::allclose(got.at(n), g, 1e-4, 1e-6));
    }
  }
}

TEST_CASE("lora: the base of a LoRA policy is KL's reference, with no model of its own", "[learner][lora]") {
  const auto cfg = shape();
  auto comm = rlx::dist::single_process();
  rlx::Transformer base(cfg);
  base.init_weights(5);
  rlx::LearnerOptions lo;
  lo.optimizer.lr = 5e-2;
  lo.fsdp.lora = spec();
  auto owned_l = trained(base, *comm, lo, 2);
  auto& l = *owned_l;
  rlx::ReferenceModel ref(l.model());
  rlx::ReferenceModel own(cfg, *comm);
  own.load_from(base);
  const auto mb = rlx::pack_micro_batches(sequences(), lo.packing).front();
  auto ref_lp = ref.logprobs(mb), own_lp = own.logprobs(mb), policy_lp = l.logprobs(mb);
  CHECK(at::allclose(ref_lp, own_lp, 1e-5, 1e-6));
  CHECK_FALSE(at::allclose(policy_lp, own_lp, 1e-3, 1e-3));  // the adapters are back on after the reference pass
  CHECK(at::equal(l.logprobs(mb), policy_lp));
  CHECK_THROWS_WITH(ref.load_from(base), Catch::Contains("policy's own weights"));
  rlx::Learner full(cfg, *comm, {});
  CHECK_THROWS_WITH(rlx::ReferenceModel(full.model()), Catch::Contains("no adapters"));
}

TEST_CASE("lora: dropout masks are the same when a checkpointed block runs again", "[learner][lora]") {
  const auto cfg = shape();
  auto comm = rlx::dist::single_process();
  rlx::Transformer base(cfg);
  base.init_weights(5);
  std::vector<std::map<std::string, at::Tensor>> after;
  for (bool checkpointing : {false, true}) {
    rlx::LearnerOptions lo;
    lo.optimizer.lr = 1e-2;
    lo.fsdp.lora = spec();
    lo.fsdp.lora.dropout = 0.3;
    lo.fsdp.activation_checkpointing = checkpointing;
    after.push_back(by_name(trained(base, *comm, lo, 3)->model().gather_lora_parameters()));
  }
  for (auto& [n, p] : after[0]) CHECK(at::allclose(p, after[1].at(n), 1e-5, 1e-7));
  // Without gradients (old log-probs, rollouts) there is no dropout: the same value twice.
  rlx::LearnerOptions lo;
  lo.fsdp.lora = spec();
  lo.fsdp.lora.dropout = 0.5;
  rlx::Learner l(cfg, *comm, lo);
  l.load_from(base);
  randomise(l.model().module().lora_parameters(), 2);
  const auto mb = rlx::pack_micro_batches(sequences(), lo.packing).front();
  CHECK(at::equal(l.logprobs(mb), l.logprobs(mb)));
}

TEST_CASE("lora: checkpoints hold the adapters, resume exactly, and refuse another adapter setting",
          "[learner][lora][checkpoint]") {
  rlx::test::TempDir dir;
  const auto cfg = shape();
  auto comm = rlx::dist::single_process();
  rlx::Transformer base(cfg);
  base.init_weights(5);
  rlx::LearnerOptions lo;
  lo.optimizer.lr = 1e-2;
  lo.fsdp.lora = spec();
  const rlx::CheckpointOptions co{.root = dir / "ckpt", .keep_last = 2};
  auto owned_a = trained(base, *comm, lo, 2);
  auto& a = *owned_a;
  rlx::save_checkpoint(a, co);
  // Only the adapters (and their optimizer state) are in the checkpoint.
  auto info = rlx::verify_checkpoint(rlx::list_checkpoints(co.root).front());
  REQUIRE(info.ok);
  CHECK(info.learner["units"].size() == static_cast<size_t>(cfg.num_layers));
  CHECK(info.learner["lora"]["rank"] == 4);
  auto file = rlx::SafetensorsFile::open(info.dir / "rank-00000-of-00001.safetensors");
  CHECK(file.header().entries.size() == 3 * static_cast<size_t>(cfg.num_layers));

  rlx::Learner b(cfg, *comm, lo);
  b.load_from(base);  // the base comes from the model, as a resumed run loads model.path
  auto loaded = rlx::load_latest_checkpoint(b, co);
  REQUIRE(loaded);
  CHECK(b.step_count() == 2);
  auto ra = nll_step(a), rb = nll_step(b);
  CHECK(ra.loss == rb.loss);
  auto pa = by_name(a.model().gather_lora_parameters()), pb = by_name(b.model().gather_lora_parameters());
  for (auto& [n, p] : pa) CHECK(at::equal(p, pb.at(n)));

  rlx::Learner full(cfg, *comm, {});
  CHECK_THROWS_WITH(rlx::load_latest_checkpoint(full, co),
                    Catch::Contains("LoRA adapters") && Catch::Contains("this run trains every weight"));
  auto other = lo;
  other.fsdp.lora.rank = 2;
  rlx::Learner c(cfg, *comm, other);
  CHECK_THROWS_WITH(rlx::load_latest_checkpoint(c, co), Catch::Contains("model.lora"));
}

TEST_CASE("lora: exported as a merged HF directory and as a PEFT adapter", "[learner][lora]") {
  rlx::test::TempDir dir;
  const auto cfg = shape();
  auto comm = rlx::dist::single_process();
  rlx::Transformer base(cfg);
  base.init_weights(5);
  rlx::LearnerOptions lo;
  lo.optimizer.lr = 5e-2;
  lo.fsdp.lora = spec(4, {"q_proj", "k_proj", "down_proj"});
  auto owned_l = trained(base, *comm, lo, 2);
  auto& l = *owned_l;
  rlx::export_hf(l, dir / "merged");
  rlx::export_peft_adapter(l, dir / "adapter", "/models/base");

  const auto config = nlohmann::json::parse(rlx::test::read_file(dir / "adapter" / "adapter_config.json"));
  CHECK(config["peft_type"] == "LORA");
  CHECK(config["task_type"] == "CAUSAL_LM");
  CHECK(config["r"] == 4);
  CHECK(config["lora_alpha"] == 8.0);
  CHECK(config["target_modules"] == nlohmann::json({"q_proj", "k_proj", "down_proj"}));
  CHECK(config["base_model_name_or_path"] == "/models/base");
  auto adapter = rlx::SafetensorsFile::open(dir / "adapter" / "adapter_model.safetensors");
  CHECK(adapter.header().entries.size() == 2 * 3 * static_cast<size_t>(cfg.num_layers));
  auto a = adapter.tensor("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight");
  auto b = adapter.tensor("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  CHECK(a.sizes() == at::IntArrayRef{4, cfg.intermediate_size});
  CHECK(b.sizes() == at::IntArrayRef{cfg.hidden_size, 4});

  // The merged directory is the base with scale * B A added, as PEFT's merge_and_unload makes it.
  auto merged = rlx::load_hf(dir / "merged", {});
  auto weights = by_name(merged->hf_parameters()), base_w = by_name(base.hf_parameters());
  CHECK(at::allclose(weights.at("model.layers.1.mlp.down_proj.weight"),
                     base_w.at("model.layers.1.mlp.down_proj.weight") + lo.fsdp.lora.scale() * at::matmul(b, a), 1e-6,
                     1e-6));
  CHECK(at::equal(weights.at("model.layers.1.mlp.up_proj.weight"), base_w.at("model.layers.1.mlp.up_proj.weight")));
  rlx::Learner full(cfg, *comm, {});
  CHECK_THROWS_WITH(rlx::export_peft_adapter(full, dir / "none", ""), Catch::Contains("no adapters"));
}

TEST_CASE("lora: an engine's update carries only the adapters, and its tokens are the learner's", "[rollout][lora]") {
  const auto cfg = shape();
  auto comm = rlx::dist::single_process();
  auto base = std::make_shared<rlx::Transformer>(cfg);
  base->init_weights(5);
  rlx::LearnerOptions lo;
  lo.optimizer.lr = 5e-2;
  lo.fsdp.lora = spec();
  auto owned_l = trained(*base, *comm, lo, 3);
  auto& l = *owned_l;
  const auto update = l.model().sync_parameters();
  int64_t bytes = 0, full_bytes = 0;
  for (auto& [n, t] : update) bytes += t.numel() * 4;
  for (auto& [n, t] : base->hf_parameters()) full_bytes += t.numel() * 4;
  CHECK(bytes == rlx::launch::lora_parameter_count(cfg, lo.fsdp.lora) * 4);
  CHECK(bytes < full_bytes);

  // The learner's merged weights, as the reference for greedy tokens.
  auto reference = std::make_shared<rlx::Transformer>(cfg);
  {
    auto merged = by_name(l.model().gather_parameters());
    c10::NoGradGuard no_grad;
    for (auto& [n, p] : reference->hf_parameters()) p.copy_(merged.at(n));
  }
  const auto greedy = [&](std::shared_ptr<rlx::Transformer> m, bool update_it) {
    rlx::Engine engine(m, {.block_size = 4, .kv_cache_blocks = 64});
    if (update_it) engine.load_weights(1, update);
    rlx::GenerationRequest r;
    r.id = "a";
    r.prompt = {1, 5, 7, 3};
    r.params.max_new_tokens = 8;
    r.params.temperature = 0;
    return engine.generate({r}).front().samples.front().tokens;
  };
  const auto want = greedy(reference, false);
  for (auto mode : {rlx::LoraMode::merged, rlx::LoraMode::unmerged}) {
    auto m = std::make_shared<rlx::Transformer>(cfg);
    c10::NoGradGuard no_grad;
    for (auto& [n, p] : m->hf_parameters()) p.copy_(by_name(base->hf_parameters()).at(n));
    m->add_lora(lo.fsdp.lora, mode);
    CHECK(greedy(m, true) == want);
  }
  // A full set of weights is refused by an engine with adapters, naming what it expected.
  auto m = std::make_shared<rlx::Transformer>(cfg);
  m->add_lora(lo.fsdp.lora, rlx::LoraMode::merged);
  rlx::Engine engine(m, {.block_size = 4, .kv_cache_blocks = 16});
  CHECK_THROWS_WITH(engine.load_weights(1, base->hf_parameters()), Catch::Contains("is not a parameter of the model"));
}

TEST_CASE("lora: the memory plan trains the adapters only and has no reference copy", "[launch][lora]") {
  const auto cfg = shape();
  rlx::Transformer m(cfg);
  m.add_lora(spec(4, {"q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"}), rlx::LoraMode::unmerged);
  int64_t n = 0;
  for (auto& [name, p] : m.lora_parameters()) n += p.numel();
  CHECK(rlx::launch::lora_parameter_count(cfg, m.lora()) == n);
  CHECK(rlx::launch::lora_parameter_count(cfg, {.rank = 0}) == 0);
}
