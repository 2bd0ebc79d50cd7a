#include "rlx/dist/fsdp.hpp"

#include <catch2/catch.hpp>

#include "../helpers.hpp"
#include "../test_models.hpp"
#include "rlx/learner/learner.hpp"
#include "rlx/learner/optimizer.hpp"

namespace {
rlx::ModelConfig small() {
  return rlx::test::test_model({.vocab = 29, .hidden = 16, .heads = 2, .head_dim = 8, .intermediate = 23, .qwen2 = true});
}
}  // namespace

TEST_CASE("a single-process communicator copies", "[dist]") {
  auto comm = rlx::dist::single_process();
  CHECK(comm->size() == 1);
  auto in = at::arange(4).to(at::kFloat), out = at::zeros({4});
  comm->all_gather(out, in, "x")->wait();
  CHECK(at::equal(out, in));
  out.zero_();
  comm->reduce_scatter(out, in, "x")->wait();
  CHECK(at::equal(out, in));
  CHECK_THROWS_WITH(comm->broadcast(in, 1, "x"), Catch::Contains("root 1"));
}

TEST_CASE("rendezvous settings come from the environment, and bad ones are named", "[dist]") {
  ::setenv("RLX_WORLD_SIZE", "2", 1);
  ::setenv("RLX_RANK", "1", 1);
  ::setenv("RLX_STORE", "10.0.0.2:29511", 1);
  auto o = rlx::dist::rendezvous_from_env();
  CHECK(o.rank == 1);
  CHECK(o.world_size == 2);
  CHECK(o.store_host == "10.0.0.2");
  CHECK(o.store_port == 29511);
  ::setenv("RLX_RANK", "2", 1);
  CHECK_THROWS_WITH(rlx::dist::rendezvous_from_env(), Catch::Contains("RLX_RANK"));
  ::setenv("RLX_RANK", "0", 1);
  ::setenv("RLX_STORE", "host:http", 1);
  CHECK_THROWS_WITH(rlx::dist::rendezvous_from_env(), Catch::Contains("RLX_STORE"));
  ::unsetenv("RLX_STORE");
  CHECK_THROWS_WITH(rlx::dist::rendezvous_from_env(), Catch::Contains("needs RLX_STORE"));
  ::unsetenv("RLX_WORLD_SIZE");
  ::unsetenv("RLX_RANK");
  CHECK(rlx::dist::rendezvous_from_env().world_size == 1);
  CHECK_FALSE(rlx::dist::rendezvous_from_env().nccl);
  ::setenv("RLX_COMM_BACKEND", "nccl", 1);
  auto n = rlx::dist::rendezvous_from_env();
  CHECK(n.nccl);
  if (!rlx::dist::nccl_available()) {
    // A group that asks for NCCL where it is not built fails at once, saying so.
    n.host_store = true;
    CHECK_THROWS_WITH(rlx::dist::connect(n), Catch::Contains("without NCCL"));
  }
  ::setenv("RLX_COMM_BACKEND", "mpi", 1);
  CHECK_THROWS_WITH(rlx::dist::rendezvous_from_env(), Catch::Contains("RLX_COMM_BACKEND"));
  ::unsetenv("RLX_COMM_BACKEND");
}

TEST_CASE("the sharded model computes what the plain model computes, gradients included", "[dist]") {
  auto cfg = small();
  auto comm = rlx::dist::single_process();
  rlx::Transformer plain(cfg);
  plain.init_weights(11);
  for (bool checkpointing : {false, true}) {
    rlx::dist::ShardedTransformer sharded(cfg, *comm, {.activation_checkpointing = checkpointing});
    sharded.load_from(plain);
    CHECK(sharded.total_numel() == sharded.local_numel());
    auto ids = at::randint(0, cfg.vocab_size, {2, 9}, at::kLong);
    auto segments = at::tensor({1, 1, 1, 1, 2, 2, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1}, at::kLong).view({2, 9});
    auto target = at::randn({2, 9, cfg.vocab_size});

    for (auto& [n, p] : plain.hf_parameters()) p.mutable_grad() = at::Tensor();
    auto ref = plain.forward({.tokens = ids, .segments = segments});
    (ref * target).sum().backward();
    auto out = sharded.logits(sharded.forward_hidden({.tokens = ids, .segments = segments}));
    CHECK(at::allclose(out, ref, 1e-5, 1e-6));
    (out * target).sum().backward();
    sharded.finish_backward();
    // Each unit's shard gradient is its parameters' gradients, flattened.
    std::map<std::string, at::Tensor> grads;
    for (auto& [n, p] : plain.hf_parameters()) grads[n] = p.grad();
    for (auto& u : sharded.units()) {
      REQUIRE(u.shard.grad().defined());
      for (const auto& s : u.slots)
        CHECK(at::allclose(u.shard.grad().narrow(0, s.offset, s.numel), grads.at(s.name).reshape({-1}), 1e-4, 1e-6));
      // Everything freed after backward, except on one fp32 rank, where nothing is ever gathered:
      // the parameters are views of the shard.
      CHECK(u.gathered == sharded.in_place());
    }
    REQUIRE(sharded.in_place());
    {
      // An update of the shards (as the optimizer makes, in place) is the module's weights at once.
      c10::NoGradGuard no_grad;
      for (auto& u : sharded.units()) u.shard.mul_(0.5);
      auto halved = sharded.logits(sharded.forward_hidden({.tokens = ids, .segments = segments}));
      for (auto& u : sharded.units()) u.shard.mul_(2.0);
      CHECK_FALSE(at::allclose(halved, out, 1e-3, 1e-3));
      auto again = sharded.logits(sharded.forward_hidden({.tokens = ids, .segments = segments}));
      CHECK(at::allclose(again, out, 1e-5, 1e-6));
      sharded.release_all();
    }
    std::map<std::string, at::Tensor> weights;
    for (auto& [n, p] : plain.hf_parameters()) weights[n] = p;
    auto params = sharded.gather_parameters();
    REQUIRE(params.size() == weights.size());
    for (auto& [n, p] : params) CHECK(at::equal(p, weights.at(n)));
    // What a weight update carries, gathered in the engines' dtype: the masters rounded once.
    auto bf16 = sharded.sync_parameters(at::kBFloat16);
    REQUIRE(bf16.size() == params.size());
    for (size_t i = 0; i < bf16.size(); ++i) {
      CHECK(bf16[i].first == params[i].first);
      CHECK(bf16[i].second.scalar_type() == at::kBFloat16);
      CHECK(at::equal(bf16[i].second, params[i].second.to(at::kBFloat16)));
    }
  }
}

TEST_CASE("gather_logprobs is log_softmax picked at the targets", "[dist]") {
  auto logits = at::randn({3, 5, 11});
  auto targets = at::randint(0, 11, {3, 5}, at::kLong);
  auto expected = at::log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  CHECK(at::allclose(rlx::gather_logprobs(logits, targets), expected, 1e-5, 1e-6));
}

TEST_CASE("one bf16 rank keeps its cast weights until the shards change", "[dist]") {
  auto cfg = small();
  auto comm = rlx::dist::single_process();
  rlx::Transformer plain(cfg);
  plain.init_weights(12);
  rlx::dist::ShardedTransformer sharded(cfg, *comm, {.compute_dtype = at::kBFloat16});
  sharded.load_from(plain);
  REQUIRE_FALSE(sharded.in_place());
  auto ids = at::randint(0, cfg.vocab_size, {2, 7}, at::kLong);
  auto forward = [&] {
    c10::NoGradGuard no_grad;
    auto out = sharded.logits(sharded.forward_hidden({.tokens = ids})).to(at::kFloat);
    sharded.release_all();
    return out;
  };
  auto first = forward();
  CHECK(at::equal(forward(), first));  // the kept cast: the same weights
  // An optimizer step (AdamW writes the shards through a pointer) must reach the next forward.
  rlx::AdamW opt({.lr = 1e-1});
  for (auto& u : sharded.units()) {
    opt.add(u.shard, u.decay_mask);
    u.shard.mutable_grad() = at::ones_like(u.shard);
  }
  opt.step(1e-1);
  auto stepped = forward();
  CHECK_FALSE(at::allclose(stepped, first, 1e-2, 1e-2));
  // ... and equal a model cast afresh from the updated shards.
  rlx::dist::ShardedTransformer fresh(cfg, *comm, {.compute_dtype = at::kBFloat16});
  {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < sharded.units().size(); ++i) fresh.units()[i].shard.copy_(sharded.units()[i].shard);
  }
  c10::NoGradGuard no_grad;
  auto expected = fresh.logits(fresh.forward_hidden({.tokens = ids})).to(at::kFloat);
  CHECK(at::equal(stepped, expected));
}

TEST_CASE("a unit lays a block's q, k and v weights, and gate and up, back to back", "[dist]") {
  // The training forward's GEMM operands are then views of the unit (fused::join_rows), not
  // copies; with Qwen2's biases too (the unit keeps them after its matrices).
  for (bool qwen2 : {false, true}) {
    INFO("qwen2 " << qwen2);
    auto cfg = rlx::test::test_model(
        {.vocab = 29, .hidden = 16, .heads = 2, .head_dim = 8, .intermediate = 23, .qwen2 = qwen2});
    auto comm = rlx::dist::single_process();
    rlx::dist::ShardedTransformer sharded(cfg, *comm, {});
    std::map<std::string, at::Tensor> p;
    for (auto& [n, t] : sharded.module().hf_parameters()) p[n] = t;
    const auto after = [&](const std::string& a, const std::string& b) {
      const auto &x = p.at(a), &y = p.at(b);
      return x.storage().is_alias_of(y.storage()) && y.storage_offset() == x.storage_offset() + x.numel();
    };
    for (int l = 0; l < cfg.num_layers; ++l) {
      const auto layer = "model.layers." + std::to_string(l) + ".";
      INFO("layer " << l);
      for (const char* part : {"weight", "bias"}) {
        if (std::string(part) == "bias" && !qwen2) continue;
        CHECK(after(layer + "self_attn.q_proj." + part, layer + "self_attn.k_proj." + part));
        CHECK(after(layer + "self_attn.k_proj." + part, layer + "self_attn.v_proj." + part));
      }
      CHECK(after(layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight"));
    }
  }
}
