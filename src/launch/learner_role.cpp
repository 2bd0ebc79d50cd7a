// The learner role: batches from the hub -> sequences -> train_on_batch -> weights
// published -> metrics line -> checkpoints, on every learner rank (rank 0 talks to the hub).
#include "rlx/launch/roles.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <numeric>
#include <optional>
#include <set>

#include "colocated.hpp"
#include "role_common.hpp"
#include "validation.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/status.hpp"
#include "rlx/core/tensorboard.hpp"
#include "rlx/core/trace.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/launch/hooks.hpp"
#include "rlx/learner/algorithm_loss.hpp"
#include "rlx/learner/checkpoint.hpp"
#include "rlx/learner/loop.hpp"
#include "rlx/learner/sample_log.hpp"
#include "rlx/launch/memory_plan.hpp"
#include "rlx/rollout/paged_kv_cache.hpp"
#include "rlx/model/hf.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
int64_t run_step(const LoadedCheckpoint& c) { return checkpoint_run_step(c.references, c.step); }

// Removes the hub states that no kept checkpoint references (they go with the checkpoints).
void prune_hub_states(const fs::path& run_dir) {
  std::set<std::string> kept;
  for (const auto& c : list_checkpoints(run_dir / "checkpoints"))
    if (std::ifstream f(c / "learner.json"); f) {
      const auto j = json::parse(f, nullptr, false);
      if (!j.is_discarded()) kept.insert(j.value("references", json::object()).value("hub_state", std::string()));
    }
  for (const auto& e : fs::directory_iterator(run_dir)) {
    const auto name = e.path().filename().string();
    if (name.starts_with("hub-step_") && !kept.contains(name)) fs::remove(e.path());
  }
}

}  // namespace

namespace {

// Busy fractions of the rollout workers: each worker keeps run_dir/stats/worker-N.json
// (its pid, seconds alive, seconds rolling out); the learner reports each worker's busy
// share since the previous step (busy_worker_N) and their mean (busy_rollout).
class RolloutBusy {
 public:
  explicit RolloutBusy(fs::path run_dir) : dir_(std::move(run_dir) / "stats") {}
  void add_to(json& line) {
    std::error_code ec;
    double sum = 0, rolling = 0;
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const auto name = e.path().stem().string();
      if (!name.starts_with("worker-") || e.path().extension() != ".json") continue;
      std::ifstream f(e.path());
      const auto j = json::parse(f, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;
      const auto pid = j.value("pid", int64_t{0});
      const double wall = j.value("wall_s", 0.0), busy = j.value("busy_s", 0.0);
      auto& last = last_[name];
      const bool same = last.pid == pid;
      const double dw = wall - (same ? last.wall : 0), db = busy - (same ? last.busy : 0);
      last = {pid, wall, busy};
      if (dw <= 0) continue;
      const double frac = std::clamp(db / dw, 0.0, 1.0);
      const auto index = name.substr(7);
      line["busy_worker_" + index] = frac;
      if (j.contains("peak_mem_mb")) line["peak_mem_mb_worker_" + index] = j.value("peak_mem_mb", 0.0);
      sum += frac, rolling += std::max(0.0, db), ++n;
    }
    if (n > 0) line["busy_rollout"] = sum / n;
    if (n > 0) line["generate_s"] = rolling / n;  // each worker's seconds rolling out, mean
  }

 private:
  struct Seen {
    int64_t pid = -1;
    double wall = 0, busy = 0;
  };
  fs::path dir_;
  std::map<std::string, Seen> last_;
};
}  // namespace

int run_learner(const RoleContext& ctx) {
  const auto& cfg = ctx.cfg;
  // SIGINT/SIGTERM ends the start-up at once (the default action: nothing new to save, the
  // last checkpoint stands); from the step loop on, it checkpoints first (below).
  set_threads(cfg);
  status::set("loading the model");
  auto tok = run_tokenizer(cfg);
  auto start = initial_model(cfg, *tok);
  const bool colocated = cfg.train.placement == Placement::colocated;
  // The learner group: ranks wait in collectives while rank 0 waits for a batch.
  std::unique_ptr<dist::Communicator> comm;
  dist::ReformableGroup* reformable = nullptr;  // the launcher restarts a dead rank > 0: the group re-forms
  if (cfg.train.learner_ranks > 1) {
    auto ro = dist::rendezvous_from_env();
    ro.timeout_s = std::max(ro.timeout_s, cfg.train.batch_timeout_s + 60);
    // Ranks on CUDA devices use NCCL where it is built, unless RLX_COMM_BACKEND says otherwise.
    if (std::getenv("RLX_COMM_BACKEND") == nullptr)
      ro.nccl = learner_options(cfg.learner, cfg.run.seed).fsdp.device.is_cuda() && dist::nccl_available();
    if (const char* r = std::getenv(kLearnerReformEnv); r && std::string_view(r) == "1") {
      auto group = dist::connect_reformable(ro);
      if (group->finished()) {  // a replacement started as the others ended: nothing left to train
        log::info("learner: rank {}: the learner group finished before this rank could join it", group->rank());
        return 0;
      }
      reformable = group.get();
      if (group->generation() > 0)
        log::info("learner: rank {} joined the learner group's generation {} (replacing a rank that died)",
                  group->rank(), group->generation());
      comm = std::move(group);
    } else {
      comm = dist::connect(ro);
    }
  } else {
    comm = dist::single_process();
  }
  algo::register_bundled_algorithms();
  auto algorithm = algo::make_algorithm(cfg.algorithm);
  auto lo = learner_options(cfg.learner, cfg.run.seed);
  lo.fsdp.lora = cfg.model.lora;
  const bool head = algorithm->needs_critic() && cfg.algorithm.critic == algo::CriticKind::head;
  lo.value_head = head;
  lo.entropy = true;  // the metric GRPO users watch most; in the loss when algorithm.entropy_coef > 0
  lo.routing_replay = cfg.algorithm.routing_replay;
  // The memory plan, checked against what the device has free before anything else is
  // allocated (the starting model, already there, stays as a colocated engine's weights).
  {
    int64_t parameters = 0, start_bytes = 0;
    for (const auto& [name, p] : start->hf_parameters())
      parameters += p.numel(), start_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t block =
        PagedKVCache::block_bytes(start->config(), static_cast<int32_t>(cfg.rollout.block_size), start->dtype());
    const int64_t kv = colocated ? cfg.rollout.kv_cache_blocks * block : 0;
    const int64_t val_kv = comm->rank() == 0 && cfg.validation.every_steps > 0 ? cfg.validation.kv_cache_blocks * block : 0;
    const auto plan = plan_memory(cfg, start->config(), parameters, kv, algorithm->needs_reference(),
                                  algorithm->needs_critic() && !head,
                                  algorithm->needs_teacher() ? read_hf_config(cfg.algorithm.teacher).num_parameters() : 0,
                                  val_kv);
    if (comm->rank() == 0)
      log::info("learner: memory plan on {} ({} parameters{}):\n{}", cfg.model.device, parameters,
                colocated ? ", colocated with the rollout engine" : "", plan.describe());
    const int64_t free = free_memory_bytes(cfg.model.device);
    plan.check(free < 0 ? free : free + start_bytes, cfg.model.device);
  }
  Learner policy(start->config(), *comm, lo);
  policy.load_from(*start);
  std::unique_ptr<ReferenceModel> reference;
  if (algorithm->needs_reference() && lo.fsdp.lora.enabled()) {
    reference = std::make_unique<ReferenceModel>(policy.model());  // the base: the adapters switched off
  } else if (algorithm->needs_reference()) {
    reference = std::make_unique<ReferenceModel>(start->config(), *comm, lo.fsdp);
    reference->load_from(*start);
  }
  // On-policy distillation: the teacher, frozen and sharded like the reference model.
  std::unique_ptr<ReferenceModel> teacher;
  if (algorithm->needs_teacher()) {
    status::set("loading the teacher");
    auto t = load_hf(cfg.algorithm.teacher, {.dtype = to_scalar_type(cfg.model.dtype), .device = at::Device(cfg.model.device)});
    RLX_CHECK(t->config().vocab_size == start->config().vocab_size,
              "algorithm.teacher {}: its vocabulary ({} tokens) is not the student's ({}): distillation scores the "
              "student's tokens with the teacher, so both need the same tokenizer",
              cfg.algorithm.teacher, t->config().vocab_size, start->config().vocab_size);
    teacher = std::make_unique<ReferenceModel>(t->config(), *comm, lo.fsdp);
    teacher->load_from(*t);
    if (comm->rank() == 0)
      log::info("learner: teacher {} ({} layers, hidden {})", cfg.algorithm.teacher, t->config().num_layers,
                t->config().hidden_size);
  }
  std::unique_ptr<Learner> critic;
  if (algorithm->needs_critic() && !head) {
    auto co = lo;
    co.policy_head = false;
    co.value_head = true;
    co.entropy = false;
    if (cfg.algorithm.critic_lr > 0) co.optimizer.lr = cfg.algorithm.critic_lr;
    critic = std::make_unique<Learner>(start->config(), *comm, co);
    critic->load_from(*start);
  }

  // Resume: the newest verified checkpoint (the launcher restored the hub's state saved
  // with it). Version k is the policy after k steps; version 0 every role builds itself.
  const CheckpointOptions policy_ckpt{.root = ctx.run_dir / "checkpoints", .keep_last = cfg.learner.checkpoint_keep_last};
  const CheckpointOptions critic_ckpt{.root = ctx.run_dir / "checkpoints-critic", .keep_last = cfg.learner.checkpoint_keep_last};
  int64_t step = 0;
  if (auto loaded = load_latest_checkpoint(policy, policy_ckpt)) {
    step = run_step(*loaded);
    if (critic) {
      auto c = load_latest_checkpoint(*critic, critic_ckpt);
      RLX_CHECK(c && c->step == loaded->step, "resume: the critic's checkpoint does not match the policy's (optimizer step {})",
                loaded->step);
    }
    algorithm->set_kl_coef(loaded->references.value("kl_coef", algorithm->kl_coef()));  // adaptive KL's state
    log::info("learner: resumed from {} (step {})", loaded->dir.string(), step);
  }
  // Rank 0 talks to the hub and publishes weights; every rank trains its share.
  const bool lead = comm->rank() == 0;
  // What a weight update carries: every weight, or with LoRA the adapters.
  auto params = policy.model().sync_parameters();
  // Colocated: the starting model becomes the rollout engine's (worker 0 runs in this process).
  std::unique_ptr<ColocatedRollout> rollout;
  if (colocated) {
    add_engine_adapters(*start, cfg);
    rollout = std::make_unique<ColocatedRollout>(ctx, start, tok, dist::WeightLayout::of(params, to_scalar_type(cfg.model.dtype)));
  }
  // validation.every_steps: rank 0 validates with an engine of its own at the step's weights
  // (the starting model's copy; colocated, the engine has the starting model itself).
  std::unique_ptr<Validator> validator;
  if (lead && cfg.validation.every_steps > 0) {
    status::set("loading the validation set");
    auto model = rollout ? initial_model(cfg, *tok) : start;
    add_engine_adapters(*model, cfg);
    validator = std::make_unique<Validator>(
        cfg, std::move(model), tok,
        Validator::Options{.tasks = cfg.validation.tasks, .kv_cache_blocks = cfg.validation.kv_cache_blocks,
                           .timeout_s = cfg.validation.timeout_s});
  }
  start.reset();
  std::unique_ptr<dist::WeightPublisher> pub;
  dist::WeightPublisher* publisher = nullptr;  // pub, or the colocated engine's
  std::unique_ptr<bus::Client> client;
  if (lead) {
    if (!rollout) pub = ctx.weight_publisher(dist::WeightLayout::of(params, to_scalar_type(cfg.model.dtype)));
    client = std::make_unique<bus::Client>(
        bus::ClientOptions{.address = ctx.hub_address(),
                           .who = "learner",
                           .role = "learner",
                           .prefetch_batches = cfg.learner.prefetch_batch ? 1 : 0});
    client->give_up_when(launcher_gone);  // the hub stops with the launcher
    publisher = rollout ? &rollout->publisher() : pub.get();
    status::set(fmt::format("publishing weights v{}", step));
    if (step > 0) {
      publisher->publish(step, params);
      client->publish_version(step);
    } else if (cfg.learner.prefetch_batch) {
      client->publish_version(0);  // so that the batch asked ahead of step 1 is picked for version 1
    }
  }
  uint64_t trained_batch = 0;  // the hub's id of the last batch trained
  // Fault injection for tests: RLX_FAULT=slow-checkpoint:SECONDS makes the first checkpoint
  // of a run directory take SECONDS longer (a stop request arrives while it is written).
  auto checkpoint = [&] {      // collective
    status::Scope doing(fmt::format("checkpointing step {}", step));
    const fault::Site here{.rank = comm->rank(), .once_file = fault_marker(ctx.run_dir)};
    if (auto f = fault::fires(fault::Point::slow_checkpoint, here))
      std::this_thread::sleep_for(std::chrono::duration<double>(f->seconds));
    const auto name = fmt::format("hub-step_{:08d}.state", step);
    if (lead) client->checkpoint_saved(name, trained_batch);  // confirms it; saves the hub
    if (critic) save_checkpoint(*critic, critic_ckpt);
    const auto dir = save_checkpoint(policy, policy_ckpt,
                                     {{"hub_state", name}, {"weights_version", step}, {"kl_coef", algorithm->kl_coef()}});
    if (lead) prune_hub_states(ctx.run_dir);
    if (lead)
      for (const auto& h : hooks())
        if (h.on_checkpoint) h.on_checkpoint(step, dir);
  };

  install_stop_handler();
  std::ofstream metrics_out;
  if (lead) metrics_out.open(ctx.run_dir / "metrics.jsonl", std::ios::app);
  std::optional<TensorBoardWriter> tensorboard;  // a new events file per process: TensorBoard merges them
  if (lead && cfg.log.tensorboard) {
    if (tensorboard_available())
      tensorboard.emplace(ctx.run_dir / "tensorboard");
    else
      log::warn("log.tensorboard: this rlx was built without protobuf (RLX_TENSORBOARD=OFF); metrics.jsonl only");
  }
  // log.samples_every: some of the step's samples as text (samples.jsonl, the TEXT tab).
  std::ofstream samples_out;
  if (lead && cfg.log.samples_every > 0) samples_out.open(ctx.run_dir / "samples.jsonl", std::ios::app);
  const double t_start = now_s();
  const int64_t first_step = step;
  RolloutBusy rollout_busy(ctx.run_dir);
  if (validator && first_step == 0) {  // the curve's first point: the starting model
    status::set("validating step 0");
    auto line = validator->run();
    line["step"] = 0;
    metrics_out << line.dump() << std::endl;
    if (tensorboard) tensorboard->add_scalars(0, line), tensorboard->flush();
    std::cerr << fmt::format("step 0/{} {}", cfg.train.steps, validation_summary(line)) << std::endl;
  }
  if (rollout) rollout->start(g_stop);
  LearnerLoop loop(
      {.steps = cfg.train.steps,
       .groups_per_step = cfg.train.groups_per_step,
       .batch_timeout_s = cfg.train.batch_timeout_s,
       .checkpoint_every = cfg.learner.checkpoint_every,
       .status =
           [](const std::string& what) {
             status::ready();
             status::set(what);
           },
       .on_rewards =
           [](int64_t s, std::vector<double>& rewards, const std::vector<size_t>& sizes) {
             for (const auto& h : hooks())
               if (h.on_rewards) h.on_rewards(s, rewards, sizes);
           },
       .on_batch =
           [&](int64_t s, const bus::BatchView& batch) {
             if (cfg.log.samples_every <= 0 || s % cfg.log.samples_every != 0) return;
             const auto picked = readable_samples(batch, *tok, s, cfg.log.samples_per_step);
             for (const auto& sample : picked) samples_out << json_line(sample) << "\n";
             samples_out.flush();
             if (tensorboard) tensorboard->add_text(s, "samples", samples_markdown(s, picked));
           },
       .on_weights =
           [&](int64_t s, const std::vector<std::pair<std::string, at::Tensor>>& weights, json& line) {
             if (!validator || !validation_due(cfg.validation.every_steps, s, cfg.train.steps)) return;
             status::set(fmt::format("validating step {}", s));
             validator->load(s, weights);
             line.update(validator->run());
           },
       .on_step =
           [&](int64_t s, json& line) {
             if (rollout) rollout->add_metrics(line);
             else rollout_busy.add_to(line);
             line["peak_mem_mb_learner"] = peak_memory_mb(cfg);
             for (const auto& h : hooks())
               if (h.on_step) h.on_step(s, line);
             metrics_out << line.dump() << std::endl;
             if (tensorboard) {
               tensorboard->add_scalars(s, line);
               tensorboard->flush();
             }
             const double per_step = (now_s() - t_start) / static_cast<double>(s - first_step);
             std::cerr << fmt::format("step {}/{}  reward {:.3f}  tokens/s {:.0f}  lag {}  eta {:.0f}s{}", s, cfg.train.steps,
                                      line.value("reward_mean", 0.0), line["tokens_per_s"].get<double>(),
                                      line["version_lag"].get<int64_t>(), per_step * static_cast<double>(cfg.train.steps - s),
                                      validation_summary(line))
                       << std::endl;
           }},
      {.models = {.policy = policy, .critic = critic.get(), .reference = reference.get(), .teacher = teacher.get()},
       .algorithm = *algorithm,
       .comm = *comm,
       .client = client.get(),
       .publisher = publisher,
       .turns = rollout ? rollout->turns() : nullptr,
       .checkpoint =
           [&](int64_t, uint64_t batch) {
             trained_batch = batch;
             checkpoint();
           },
       .recover = [&](const dist::CommError& e) -> int64_t {
         // A rank died: the launcher started its replacement, which joins the next generation
         // and resumes from the newest checkpoint, as this rank does here (the same collectives
         // as its start: load the policy, the critic, gather the weights).
         if (!reformable || !reformable->broken()) throw e;
         log::warn("learner: {}; re-forming the learner group (generation {})", e.what(), reformable->generation() + 1);
         status::set("re-forming the learner group");
         policy.model().abandon();
         if (critic) critic->model().abandon();
         if (reference) reference->abandon();
         if (teacher) teacher->abandon();
         reformable->reform();
         auto loaded = load_latest_checkpoint(policy, policy_ckpt);
         RLX_CHECK(loaded, "learner: the group re-formed, but there is no checkpoint to restore it from yet: the run "
                   "starts over");
         if (critic) {
           auto c = load_latest_checkpoint(*critic, critic_ckpt);
           RLX_CHECK(c && c->step == loaded->step,
                     "learner: the critic's checkpoint does not match the policy's (optimizer step {})", loaded->step);
         }
         algorithm->set_kl_coef(loaded->references.value("kl_coef", algorithm->kl_coef()));
         params = policy.model().sync_parameters();
         log::info("learner: the group re-formed (generation {}); restored step {} from {}", reformable->generation(),
                   run_step(*loaded), loaded->dir.string());
         return run_step(*loaded);
       }});
  const auto end = loop.run(step, g_stop);
  if (rollout) rollout->finish();  // worker 0 stops (its groups in flight go back); its failure ends the role here
  trained_batch = loop.trained_batch();
  const bool stopped = end == LearnerLoop::End::stopped;
  const bool saved = step == first_step ? first_step > 0 : loop.saved();
  // The end, or SIGINT/SIGTERM: a checkpoint of the last finished step. Not when the
  // launcher died (PDEATHSIG): the hub stops at the same moment, and a checkpoint needs
  // it to save its state; the last committed one stays the place to resume from.
  if (stopped && launcher_gone()) {
    log::warn("learner: the launcher is gone; stopping at step {} without a checkpoint of it", step);
    return 1;
  }
  if (!saved) checkpoint();
  if (stopped) {
    if (reformable) reformable->finish();
    log::info("learner: stopped at step {}; `rlx run --resume` continues", step);
    return 0;
  }
  export_hf(policy, ctx.run_dir / "final");
  if (cfg.model.lora.enabled()) export_peft_adapter(policy, ctx.run_dir / "final" / "adapter", cfg.model.path);
  if (lead) write_tokenizer(cfg, ctx.run_dir / "final" / "tokenizer.json");
  if (reformable) reformable->finish();  // the group's last collective is behind: a late replacement ends
  return 0;
}


}  // namespace rlx::launch
