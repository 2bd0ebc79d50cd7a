#include "rlx/launch/memory_plan.hpp"

#include "../helpers.hpp"

using rlx::launch::plan_memory;
using rlx::RunConfig;

TEST_CASE("memory plan: a colocated run's peak is its larger phase, not the sum", "[launch][colocated]") {
  RunConfig cfg;
  cfg.train.placement = rlx::Placement::colocated;
  cfg.learner.micro_batch_tokens = 2048;  // activations well below the KV pool: generation is the peak
  cfg.learner.row_tokens = 256;
  const auto model = rlx::model_preset("small", rlx::Arch::qwen2);
  const int64_t n = 4'000'000, kv = int64_t{2} << 30;
  const auto plan = plan_memory(cfg, model, n, kv, /*reference=*/false, /*critic=*/false);
  // fp32 masters, gradients and AdamW's two moments: 16 bytes a parameter in both phases;
  // the engine's fp32 weights 4 more; activations only in training, the KV pool only in generation.
  int64_t activations = -1;
  for (const auto& i : plan.items)
    if (i.name.starts_with("activations")) activations = i.bytes;
  REQUIRE(activations > 0);
  REQUIRE(plan.train_bytes() == 20 * n + activations);
  REQUIRE(plan.generate_bytes() == 20 * n + kv);
  REQUIRE(plan.peak_bytes() == std::max(plan.train_bytes(), plan.generate_bytes()));
  REQUIRE(plan.describe().find("rollout KV pool") != std::string::npos);

  plan.check(plan.peak_bytes(), "cpu");  // fits exactly
  plan.check(-1, "cpu");                 // unknown free memory: no check
  // Too little: the error names the phase, the device and the key that sizes the largest item.
  const auto why = rlx::test::error_of([&] { plan.check(plan.peak_bytes() - 1, "cuda:0"); });
  INFO(why);
  REQUIRE(why.find("generation phase") != std::string::npos);
  REQUIRE(why.find("cuda:0") != std::string::npos);
  REQUIRE(why.find("rollout.kv_cache_blocks") != std::string::npos);

  // A split run has no engine in the learner: neither the engine's weights nor a KV pool.
  cfg.train.placement = rlx::Placement::split;
  const auto split = plan_memory(cfg, model, n, 0, false, false);
  REQUIRE(split.peak_bytes() == 16 * n + activations);
}

TEST_CASE("memory plan: activations on the flash path keep no attention probabilities", "[launch][colocated]") {
  RunConfig cfg;
  cfg.learner.micro_batch_tokens = 16384;
  cfg.learner.row_tokens = 2048;
  cfg.learner.compute_dtype = rlx::DType::bfloat16;
  const auto model = rlx::model_preset("qwen2.5-0.5b", rlx::Arch::qwen2);
  auto activations = [&](const RunConfig& c) {
    for (const auto& i : plan_memory(c, model, 494'000'000, 0, false, false).items)
      if (i.name.starts_with("activations")) return i.bytes;
    return int64_t{-1};
  };
  cfg.model.device = "cpu";
  const int64_t mask_path = activations(cfg);
  cfg.model.device = "cuda";
  const int64_t flash = activations(cfg);
  // The probabilities of 14 heads over rows of 2048 tokens, per token and layer, fp32.
  REQUIRE(mask_path - flash == int64_t{16384} * 24 * 14 * (2048 * 4 - 4));
  cfg.learner.activation_checkpointing = true;  // one block's activations at a time, plus each block's input
  REQUIRE(activations(cfg) < flash / 4);
}

TEST_CASE("memory plan: learner rank 0's validation engine", "[launch][validation]") {
  RunConfig cfg;
  cfg.train.placement = rlx::Placement::split;
  const auto model = rlx::model_preset("small", rlx::Arch::qwen2);
  const int64_t n = 4'000'000, val_kv = int64_t{4} << 30;  // the largest item
  const auto without = plan_memory(cfg, model, n, 0, false, false);
  // Its fp32 weights and its pool: the pool exists only while it validates, between steps,
  // so it counts in the training phase.
  const auto with = plan_memory(cfg, model, n, 0, false, false, 0, val_kv);
  REQUIRE(with.peak_bytes() == without.peak_bytes() + 4 * n + val_kv);
  REQUIRE(with.describe().find("validation KV pool") != std::string::npos);
  const auto why = rlx::test::error_of([&] { with.check(without.peak_bytes() + 4 * n, "cpu"); });
  INFO(why);
  REQUIRE(why.find("validation.kv_cache_blocks") != std::string::npos);

  // Colocated: the weights in both phases, the pool not in the rollout engine's generation phase.
  cfg.train.placement = rlx::Placement::colocated;
  const int64_t kv = int64_t{1} << 30;
  const auto base = plan_memory(cfg, model, n, kv, false, false);
  const auto colocated = plan_memory(cfg, model, n, kv, false, false, 0, val_kv);
  REQUIRE(colocated.train_bytes() == base.train_bytes() + 4 * n + val_kv);
  REQUIRE(colocated.generate_bytes() == base.generate_bytes() + 4 * n);
}
