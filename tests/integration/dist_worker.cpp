// One rank of the distributed-learner tests (tests/integration/dist_test.cpp starts
// it as real processes). It trains a small, oddly sized model on deterministic
// synthetic sequences and writes the final parameters for comparison.
//
//   --mode sharded    the Learner (FSDP over the group in RLX_RANK / RLX_WORLD_SIZE / RLX_STORE)
//   --mode reference  an unsharded model trained with plain autograd in one process
//   --mode ppo        PPO through train_on_batch: policy, separate critic, reference, adaptive KL
//   --mode subscribe  a weight-sync subscriber (shm, tcp or broadcast; tests/integration/dist_test.cpp publishes)
#include <c10/core/GradMode.h>
#include <CLI/CLI.hpp>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <thread>

#include "rlx/core/clock.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/weight_broadcast.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/learner/algorithm_loss.hpp"
#include "rlx/learner/checkpoint.hpp"
#include "rlx/learner/learner.hpp"
#include "rlx/learner/reference.hpp"
#include "rlx/model/safetensors.hpp"
#include "rlx/rollout/engine.hpp"
#include "../unit/test_models.hpp"

namespace {

rlx::ModelConfig test_model() {
  return rlx::test::test_model(
      {.vocab = 37, .hidden = 24, .layers = 3, .heads = 3, .head_dim = 8, .intermediate = 41, .qwen2 = true, .tied = false});
}

// The whole group's batch of step `step`: the same on every rank.
std::vector<rlx::Sequence> global_batch(int64_t step, int64_t n) {
  rlx::RngStream rng(1234, static_cast<uint64_t>(step));
  std::vector<rlx::Sequence> out;
  for (int64_t i = 0; i < n; ++i) {
    rlx::Sequence s;
    const int64_t len = rng.uniform_int(3, 20);
    for (int64_t t = 0; t < len; ++t) {
      s.tokens.push_back(rng.uniform_int(0, 36));
      s.loss_mask.push_back(t >= 2 ? 1 : 0);
    }
    out.push_back(std::move(s));
  }
  return out;
}

rlx::LearnerOptions learner_options(bool checkpointing, uint64_t seed, bool bf16 = false, int64_t lora_rank = 0) {
  rlx::LearnerOptions o;
  o.fsdp.lora.rank = lora_rank;  // all seven projections, alpha 16
  o.optimizer.lr = 3e-3;
  o.optimizer.weight_decay = 0.1;
  o.schedule.kind = rlx::LrScheduleKind::cosine;
  o.schedule.warmup_steps = 2;
  o.schedule.total_steps = 20;
  o.schedule.min_lr_ratio = 0.1;
  o.max_grad_norm = 0.5;  // small enough that clipping happens
  o.packing.micro_batch_tokens = 40;  // several micro-batches per rank: accumulation
  o.packing.row_tokens = 20;
  o.fsdp.activation_checkpointing = checkpointing;
  if (bf16) {
    o.fsdp.compute_dtype = at::kBFloat16;
    o.fsdp.reduce_dtype = at::kBFloat16;
  }
  o.seed = seed;
  return o;
}

// With `lora_rank`, only adapters (initialised as the sharded learner's, seed 99) are
// trained, and only they are written.
int run_reference(int64_t steps, int64_t batch, const std::string& out, int64_t lora_rank) {
  auto cfg = test_model();
  auto opts = learner_options(false, 0, false, lora_rank);
  rlx::Transformer model(cfg);
  model.init_weights(7);
  if (lora_rank > 0) {
    model.add_lora(opts.fsdp.lora, rlx::LoraMode::unmerged);
    model.init_lora(99);
    for (auto& [name, p] : model.hf_parameters()) p.requires_grad_(false);
  }
  rlx::AdamW opt(opts.optimizer);
  std::vector<at::Tensor> params;
  for (auto& [name, p] : lora_rank > 0 ? model.lora_parameters() : model.hf_parameters()) {
    params.push_back(p);
    opt.add(p, p.dim() >= 2 ? at::ones_like(p) : at::zeros_like(p));
  }
  for (int64_t s = 0; s < steps; ++s) {
    auto seqs = global_batch(s, batch);
    double tokens = 0;
    for (const auto& q : seqs)
      for (size_t t = 1; t < q.tokens.size(); ++t) tokens += q.loss_mask[t];
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    for (const auto& q : seqs) {  // one sequence at a time, unpacked
      auto ids = at::tensor(q.tokens, at::kLong).unsqueeze(0);
      auto logits = model.forward({.tokens = ids});
      auto n = ids.size(1);
      auto logp = rlx::gather_logprobs(logits.narrow(1, 0, n - 1), ids.narrow(1, 1, n - 1));
      std::vector<float> m(q.loss_mask.begin() + 1, q.loss_mask.end());
      auto mask = at::tensor(m).unsqueeze(0);
      auto loss = -(logp * mask).sum() / tokens;
      loss.backward();
    }
    const double norm = std::sqrt(rlx::grad_sq_norm(params));
    opt.step(opts.schedule.at(opt.step_count(), opts.optimizer.lr), rlx::clip_factor(norm, opts.max_grad_norm));
  }
  rlx::save_safetensors(out, lora_rank > 0 ? model.lora_parameters() : model.hf_parameters());
  return 0;
}

int run_sharded(const rlx::algo::Algorithm* algorithm, int64_t steps, int64_t batch, const std::string& out, bool checkpointing, const std::string& ckpt,
                int64_t save_every, const std::string& crash_at, int64_t crash_save, bool rng_noise, double timeout_s,
                bool bf16, int64_t lora_rank, bool reform, double pause_s) {
  auto rdv = rlx::dist::rendezvous_from_env();
  rdv.timeout_s = timeout_s;
  // --reform: a rank that dies is restarted by the test; the others re-form the group and
  // every rank resumes from the newest checkpoint.
  rlx::dist::ReformableGroup* reformable = nullptr;
  std::unique_ptr<rlx::dist::Communicator> comm;
  if (reform) {
    auto g = rlx::dist::connect_reformable(rdv);
    reformable = g.get();
    std::cout << "generation " << g->generation() << std::endl;
    comm = std::move(g);
  } else {
    comm = rlx::dist::connect(rdv);
  }
  const int rank = comm->rank(), world = comm->size();
  rlx::Learner learner(test_model(), *comm, learner_options(checkpointing, 99, bf16, lora_rank));
  learner.init_weights(7);
  rlx::CheckpointOptions co{.root = ckpt, .keep_last = 2};
  auto resume = [&] {
    if (auto loaded = rlx::load_latest_checkpoint(learner, co)) {
      std::cout << "resumed " << loaded->step << " cursor " << loaded->references.value("data_cursor", -1) << "\n";
      for (const auto& s : loaded->skipped) std::cout << "skipped " << s << "\n";
    }
  };
  if (!ckpt.empty()) resume();
  int64_t saves = 0;
  while (learner.step_count() < steps) try {
    if (pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause_s));
    const int64_t s = learner.step_count();
    auto all = global_batch(s, batch);
    std::vector<rlx::Sequence> mine;
    for (size_t i = static_cast<size_t>(rank); i < all.size(); i += static_cast<size_t>(world)) mine.push_back(all[i]);
    // The random stream is part of what a checkpoint restores: with --rng-noise the loss
    // depends on it, so a resume that lost it would diverge.
    const double noise = rng_noise ? learner.rng().uniform() : 0.0;
    rlx::LossFn loss = [&](const rlx::MicroBatch& mb, const rlx::TokenOutputs& out, const rlx::StepContext& ctx,
                           rlx::MetricSums&) {
      return -(out.logprobs * mb.loss_mask).sum() * (1.0 + 0.1 * noise) / ctx.global_loss_tokens;
    };
    std::vector<std::string> metrics;
    if (algorithm) {
      // Deterministic per-sequence advantages and old log-probs, whatever rank holds the sequence.
      for (size_t i = static_cast<size_t>(rank), k = 0; i < all.size(); i += static_cast<size_t>(world), ++k) {
        rlx::set_advantage(mine[k], static_cast<double>(i % 3) - 1.0 + 0.1 * static_cast<double>(i));
        mine[k].values["old_logprobs"] = std::vector<float>(mine[k].tokens.size(), -3.5f);
      }
      loss = rlx::algorithm_loss(*algorithm);
      metrics = algorithm->metric_names();
    }
    auto r = learner.step(mine, loss, metrics);
    std::cout << fmt::format("step {} loss {:.17g} norm {:.17g} clip {:.6g} mbs {}", r.step, r.loss, r.grad_norm,
                             r.clip_factor, r.micro_batches)
              << std::endl;
    if (!ckpt.empty() && save_every > 0 && r.step % save_every == 0) {
      ++saves;
      if (saves == crash_save && !crash_at.empty()) ::setenv("RLX_CHECKPOINT_CRASH_AT", crash_at.c_str(), 1);
      rlx::save_checkpoint(learner, co, {{"data_cursor", r.step}, {"hub_state", "hub/state.bin"}});
      std::cout << "saved " << r.step << std::endl;
    }
  } catch (const rlx::dist::CommError& e) {
    if (!reformable || !reformable->broken() || ckpt.empty()) throw;
    std::cout << "failed at step " << learner.step_count() << ": " << e.what() << std::endl;
    learner.model().abandon();
    reformable->reform();
    std::cout << "reformed generation " << reformable->generation() << std::endl;
    resume();
  }
  auto params = lora_rank > 0 ? learner.model().gather_lora_parameters() : learner.model().gather_parameters();
  if (rank == 0 && !out.empty()) rlx::save_safetensors(out, params);
  return 0;
}

// PPO over the group: each rank takes every world-th sequence of the global batch.
// Writes the policy's parameters and the critic's value head (rank 0).
int run_ppo(int64_t steps, int64_t batch, int64_t epochs, const std::string& out, double timeout_s) {
  auto rdv = rlx::dist::rendezvous_from_env();
  rdv.timeout_s = timeout_s;
  auto comm = rlx::dist::connect(rdv);
  const int rank = comm->rank(), world = comm->size();
  auto opts = learner_options(false, 99);
  rlx::Learner policy(test_model(), *comm, opts);
  policy.init_weights(7);
  auto critic_opts = opts;
  critic_opts.policy_head = false;
  critic_opts.value_head = true;
  rlx::Learner critic(test_model(), *comm, critic_opts);
  critic.init_weights(7);
  rlx::ReferenceModel reference(test_model(), *comm);
  reference.init_weights(7);
  rlx::algo::register_bundled_algorithms();
  auto ppo = rlx::algo::make_algorithm({.name = "ppo",
                                        .kl_coef = 0.05,
                                        .kl_placement = rlx::algo::KlPlacement::reward,
                                        .kl_target = 0.01,
                                        .kl_horizon = 100,
                                        .epochs = epochs});
  for (int64_t s = 0; s < steps; ++s) {
    auto all = global_batch(s, batch);
    std::vector<rlx::Sequence> mine;
    std::vector<double> rewards;
    for (size_t i = static_cast<size_t>(rank); i < all.size(); i += static_cast<size_t>(world)) {
      mine.push_back(all[i]);
      rewards.push_back(static_cast<double>((i * 7 + static_cast<size_t>(s)) % 5) / 4.0);
    }
    auto m = rlx::train_on_batch(*ppo, {.policy = policy, .critic = &critic, .reference = &reference}, mine, rewards,
                                 std::vector<size_t>(mine.size(), 1));
    std::cout << fmt::format("ppo {} reward {:.17g} adv_std {:.17g} loss {:.17g} critic {:.17g} kl_coef {:.17g}", s,
                             m.at("reward_mean"), m.at("advantage_std"), m.at("loss"), m.at("critic_loss"),
                             m.at("kl_coef"))
              << std::endl;
  }
  auto params = policy.model().gather_parameters();
  params.emplace_back("critic.value_head", critic.value_head().detach().clone());
  if (rank == 0 && !out.empty()) rlx::save_safetensors(out, params);
  return 0;
}

// A weight-sync subscriber. With --engine it applies each version to an engine of the
// test model and runs a generation step after it; with --uniform it checks that every
// version it gets has every element equal to version x 1e-3 (what the test publishes),
// and that after each engine step the engine's parameters hold exactly one version.
int run_subscriber(const std::string& name, const std::string& tcp, const std::string& broadcast, int64_t until,
                   int64_t count, bool engine_on, bool uniform, const std::string& out) {
  std::unique_ptr<rlx::dist::WeightSubscriber> subscriber;
  if (!broadcast.empty())
    subscriber = std::make_unique<rlx::dist::BroadcastWeightSubscriber>(rlx::dist::BroadcastSyncOptions{
        .advertise_host = "127.0.0.1", .endpoint = broadcast, .timeout_s = 5, .heartbeat_s = 0.2});
  else if (tcp.empty()) subscriber = std::make_unique<rlx::dist::ShmWeightSubscriber>(rlx::dist::ShmSyncOptions{.name = name, .attach_timeout_s = 30});
  else subscriber = std::make_unique<rlx::dist::TcpWeightSubscriber>(rlx::dist::TcpSyncOptions{.endpoint = tcp});
  auto& sub = *subscriber;
  auto model = std::make_shared<rlx::Transformer>(test_model());
  model->init_weights(1);
  std::unique_ptr<rlx::Engine> engine;
  if (engine_on) engine = std::make_unique<rlx::Engine>(model, rlx::EngineConfig{.block_size = 4, .kv_cache_blocks = 64});
  auto uniform_at = [](const at::Tensor& t, int64_t v) {
    return t.eq(static_cast<float>(static_cast<double>(v) * 1e-3)).all().item<bool>();
  };
  int64_t versions = 0, torn = 0, mixed = 0, retries = 0, first = -1, last = 0;
  const double deadline = rlx::now_s() + 120;
  while (last < until && versions < count && rlx::now_s() < deadline) {
    if (auto u = sub.poll()) {
      ++versions;
      retries += u->retries;
      if (first < 0) first = u->version;
      last = u->version;
      if (uniform)
        for (const auto& [n, t] : u->tensors) torn += uniform_at(t, u->version) ? 0 : 1;
      if (engine) engine->update_weights(u->version, u->tensors);
      std::cout << "applied " << u->version << std::endl;
    }
    if (engine) {
      engine->generate({{.id = fmt::format("r{}", versions), .prompt = {1, 2, 3}, .params = {.max_new_tokens = 1}}});
      if (uniform && engine->weight_version() > 0) {
        const int64_t v = engine->weight_version();
        for (auto& [n, p] : model->hf_parameters()) mixed += uniform_at(p, v) ? 0 : 1;
      }
    }
  }
  if (engine && !out.empty()) {
    c10::NoGradGuard g;
    auto logits = model->forward({.tokens = at::arange(1, 11, at::kLong).unsqueeze(0)});
    rlx::save_safetensors(out, {{"logits", logits.contiguous()}});
  }
  std::cout << fmt::format("versions {} torn {} mixed {} retries {} first {} last {}", versions, torn, mixed, retries,
                           first, last)
            << std::endl;
  return last >= until || versions >= count ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  rlx::prepare_blas(argv);
  rlx::set_compute_threads(1);
  CLI::App app("rlx distributed-learner test rank");
  std::string mode = "sharded", out, ckpt, crash_at;
  int64_t steps = 4, batch = 7, save_every = 0, crash_save = 0;
  bool checkpointing = false, rng_noise = false, bf16 = false;
  double timeout_s = 60;
  app.add_option("--mode", mode)->check(CLI::IsMember({"sharded", "reference", "ppo", "subscribe"}));
  int64_t epochs = 2;
  app.add_option("--epochs", epochs, "ppo: passes over each batch");
  std::string shm;
  int64_t until = 1;
  bool engine_on = false, uniform = false;
  app.add_option("--shm", shm, "subscribe: the weight-sync segment");
  std::string tcp;
  app.add_option("--tcp", tcp, "subscribe: the tcp weight-sync publisher's endpoint (instead of --shm)");
  std::string broadcast;
  app.add_option("--broadcast", broadcast, "subscribe: the broadcast publisher's control endpoint (instead of --shm)");
  app.add_option("--until", until, "subscribe: run until this version is applied");
  int64_t count = std::numeric_limits<int64_t>::max();
  app.add_option("--count", count, "subscribe: run until this many versions are applied");
  app.add_flag("--engine", engine_on, "subscribe: apply each version to an engine");
  app.add_flag("--uniform", uniform, "subscribe: check versions are whole (every element = version x 1e-3)");
  app.add_option("--steps", steps);
  app.add_option("--batch", batch);
  app.add_option("--out", out);
  app.add_option("--checkpoints", ckpt);
  app.add_option("--save-every", save_every);
  app.add_option("--crash-at", crash_at, "a checkpoint crash point (shards, manifest, renamed)");
  app.add_option("--crash-save", crash_save, "which save (1-based) crashes");
  app.add_flag("--activation-checkpointing", checkpointing);
  app.add_flag("--rng-noise", rng_noise);
  app.add_flag("--bf16", bf16, "bf16 compute and gradient reduction (fp32 masters)");
  std::string algo, aggregation = "token_mean";
  app.add_option("--algo", algo, "train with this algorithm's loss instead of SFT");
  app.add_option("--aggregation", aggregation);
  app.add_option("--timeout", timeout_s);
  int64_t lora_rank = 0;
  app.add_option("--lora", lora_rank, "sharded, reference: train LoRA adapters of this rank only");
  bool reform = false;
  app.add_flag("--reform", reform, "sharded: a re-formable group; after a rank dies, resume from the newest checkpoint");
  double pause_s = 0;
  app.add_option("--pause", pause_s, "sharded: seconds to wait before each step");
  CLI11_PARSE(app, argc, argv);
  try {
    if (mode == "reference") return run_reference(steps, batch, out, lora_rank);
    if (mode == "ppo") return run_ppo(steps, batch, epochs, out, timeout_s);
    if (mode == "subscribe") return run_subscriber(shm, tcp, broadcast, until, count, engine_on, uniform, out);
    std::unique_ptr<rlx::algo::Algorithm> algorithm;
    if (!algo.empty()) {
      rlx::algo::register_bundled_algorithms();
      algorithm = rlx::algo::make_algorithm(
          {.name = algo, .aggregation = rlx::algo::aggregation_from_string(aggregation), .max_tokens = 20});
    }
    return run_sharded(algorithm.get(), steps, batch, out, checkpointing, ckpt, save_every, crash_at, crash_save, rng_noise, timeout_s, bf16,
                       lora_rank, reform, pause_s);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
