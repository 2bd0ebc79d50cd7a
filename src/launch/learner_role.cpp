// The learner role: batches from the hub -> sequences -> train_on_batch -> weights
// published -> metrics line -> checkpoints, on every learner rank (rank 0 talks to the hub).
// Composed of the parts in learner_parts.hpp: the group, the models, the checkpointer, the
// reports; and, colocated, the rollout engine of this process (colocated.hpp).
#include "rlx/launch/roles.hpp"

#include <iostream>
#include <optional>

#include "colocated.hpp"
#include "learner_parts.hpp"
#include "role_common.hpp"
#include "validation.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/status.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/launch/hooks.hpp"
#include "rlx/rl/loop.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Rank 0's link to the hub and the weights' publisher (its own, or the colocated engine's),
// with the weights of a resumed run's `step` published again.
struct LeadLink {
  std::unique_ptr<dist::WeightPublisher> own;
  dist::WeightPublisher* publisher = nullptr;
  std::unique_ptr<bus::Client> client;
};
LeadLink connect_lead(const RoleContext& ctx, ColocatedRollout* rollout, int64_t step,
                      const std::vector<std::pair<std::string, at::Tensor>>& params) {
  const auto& cfg = ctx.cfg;
  LeadLink l;
  if (!rollout) l.own = ctx.weight_publisher(dist::WeightLayout::of(params, to_scalar_type(cfg.model.dtype)));
  l.client = std::make_unique<bus::Client>(bus::ClientOptions{.address = ctx.hub_address(),
                                                              .who = "learner",
                                                              .role = "learner",
                                                              .prefetch_batches = cfg.learner.prefetch_batch ? 1 : 0});
  l.client->give_up_when(launcher_gone);  // the hub stops with the launcher
  l.publisher = rollout ? &rollout->publisher() : l.own.get();
  status::set(fmt::format("publishing weights v{}", step));
  if (step > 0) {
    l.publisher->publish(step, params);
    l.client->publish_version(step);
  } else if (cfg.learner.prefetch_batch) {
    l.client->publish_version(0);  // so that the batch asked ahead of step 1 is picked for version 1
  }
  return l;
}

// validation.every_steps: rank 0 validates with an engine of its own at the step's weights
// (the starting model's copy; colocated, the engine has the starting model itself).
std::unique_ptr<Validator> make_validator(const RunConfig& cfg, const std::shared_ptr<Transformer>& start,
                                          bool colocated, const std::shared_ptr<const Tokenizer>& tok) {
  status::set("loading the validation set");
  auto model = colocated ? initial_model(cfg, *tok) : start;
  add_engine_adapters(*model, cfg);
  return std::make_unique<Validator>(cfg, std::move(model), tok,
                                     Validator::Options{.tasks = cfg.validation.tasks,
                                                        .kv_cache_blocks = cfg.validation.kv_cache_blocks,
                                                        .timeout_s = cfg.validation.timeout_s});
}

// What the loop calls back on rank 0: hooks, samples, validation, the step's line.
struct LeadOutputs {
  const RunConfig& cfg;
  const Tokenizer& tok;
  LearnerReports& reports;
  Validator* validator;
  ColocatedRollout* rollout;
  RolloutBusy busy;
  double t_start = now_s();
  int64_t first_step = 0;

  void validate_start() {  // the curve's first point: the starting model
    if (!validator || first_step != 0) return;
    status::set("validating step 0");
    auto line = validator->run();
    line["step"] = 0;
    reports.step(0, line);
    std::cerr << fmt::format("step 0/{} {}", cfg.train.steps, validation_summary(line)) << std::endl;
  }
  void on_weights(int64_t s, const std::vector<std::pair<std::string, at::Tensor>>& weights, json& line) {
    if (!validator || !validation_due(cfg.validation.every_steps, s, cfg.train.steps)) return;
    status::set(fmt::format("validating step {}", s));
    validator->load(s, weights);
    line.update(validator->run());
  }
  void on_step(int64_t s, json& line) {
    if (rollout)
      rollout->add_metrics(line);
    else
      busy.add_to(line);
    line["peak_mem_mb_learner"] = peak_memory_mb(cfg);
    for (const auto& h : hooks())
      if (h.on_step) h.on_step(s, line);
    reports.step(s, line);
    const double per_step = (now_s() - t_start) / static_cast<double>(s - first_step);
    std::cerr << fmt::format("step {}/{}  reward {:.3f}  tokens/s {:.0f}  lag {}  eta {:.0f}s{}", s, cfg.train.steps,
                             line.value("reward_mean", 0.0), line["tokens_per_s"].get<double>(),
                             line["version_lag"].get<int64_t>(), per_step * static_cast<double>(cfg.train.steps - s),
                             validation_summary(line))
              << std::endl;
  }
  rl::LoopOptions loop_options() {
    return {.steps = cfg.train.steps,
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
            .on_batch = [this](int64_t s, const bus::BatchView& batch) { reports.samples(s, batch, tok); },
            .on_weights = [this](int64_t s, const auto& weights, json& line) { on_weights(s, weights, line); },
            .on_step = [this](int64_t s, json& line) { on_step(s, line); },
            .weights_dtype = to_scalar_type(cfg.model.dtype)};
  }
};

}  // namespace

int run_learner(const RoleContext& ctx) {
  const auto& cfg = ctx.cfg;
  // SIGINT/SIGTERM ends the start-up at once (the default action: nothing new to save, the
  // last checkpoint stands); from the step loop on, it checkpoints first (below).
  set_threads(cfg);
  status::set("loading the model");
  auto tok = run_tokenizer(cfg);
  // On this rank's device (a group's ranks on their own GPUs), where its learners train.
  const auto device = learner_rank_device(cfg);
  auto start = initial_model(cfg, *tok, device);
  const bool colocated = cfg.train.placement == Placement::colocated;
  auto group = join_learner_group(cfg, device);
  if (group.finished) return 0;
  auto& comm = *group.comm;
  auto models = build_models(cfg, *start, comm);
  // Resume: the newest verified checkpoint (the launcher restored the hub's state saved
  // with it). Version k is the policy after k steps; version 0 every role builds itself.
  Checkpointer checkpointer(ctx, models, comm.rank() == 0);
  int64_t step = 0;
  if (const auto loaded = checkpointer.restore("resume")) {
    step = run_step(*loaded);
    log::info("learner: resumed from {} (step {})", loaded->dir.string(), step);
  }
  // Rank 0 talks to the hub and publishes weights; every rank trains its share.
  const bool lead = comm.rank() == 0;
  // What a weight update carries (every weight, or with LoRA the adapters, in the engines'
  // dtype): its layout, and at a resume the first version. A full copy of the model: released
  // once published, not kept through the run.
  const auto weights_dtype = to_scalar_type(cfg.model.dtype);
  auto params = models.policy->model().sync_parameters(weights_dtype);
  // Colocated: the starting model becomes the rollout engine's (worker 0 runs in this process).
  std::unique_ptr<ColocatedRollout> rollout;
  if (colocated) {
    add_engine_adapters(*start, cfg);
    rollout = std::make_unique<ColocatedRollout>(ctx, start, tok,
                                                 dist::WeightLayout::of(params, to_scalar_type(cfg.model.dtype)));
  }
  std::unique_ptr<Validator> validator;
  if (lead && cfg.validation.every_steps > 0) validator = make_validator(cfg, start, rollout != nullptr, tok);
  start.reset();
  LeadLink link;
  if (lead) link = connect_lead(ctx, rollout.get(), step, params);
  params = {};
  uint64_t trained_batch = 0;  // the hub's id of the last batch trained
  auto checkpoint = [&] { checkpointer.save(step, trained_batch, link.client.get()); };  // collective

  install_stop_handler();
  LearnerReports reports(ctx, lead);
  LeadOutputs out{.cfg = cfg,
                  .tok = *tok,
                  .reports = reports,
                  .validator = validator.get(),
                  .rollout = rollout.get(),
                  .busy = RolloutBusy(ctx.run_dir),
                  .first_step = step};
  out.validate_start();
  if (rollout) rollout->start(g_stop);
  rl::LearnerLoop loop(out.loop_options(),
                   {.models = models.train(),
                    .algorithm = *models.algorithm,
                    .comm = comm,
                    .client = link.client.get(),
                    .publisher = link.publisher,
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
                      if (!group.reformable || !group.reformable->broken()) throw e;
                      log::warn("learner: {}; re-forming the learner group (generation {})", e.what(),
                                group.reformable->generation() + 1);
                      status::set("re-forming the learner group");
                      models.abandon();
                      group.reformable->reform();
                      auto loaded = checkpointer.restore("learner");
                      RLX_CHECK(
                          loaded,
                          "learner: the group re-formed, but there is no checkpoint to restore it from yet: the run "
                          "starts over");
                      // The start's gather of the weights, as the replacement makes it (its result unused).
                      models.policy->model().sync_parameters(weights_dtype);
                      log::info("learner: the group re-formed (generation {}); restored step {} from {}",
                                group.reformable->generation(), run_step(*loaded), loaded->dir.string());
                      return run_step(*loaded);
                    }});
  const auto end = loop.run(step, g_stop);
  if (rollout) rollout->finish();  // worker 0 stops (its groups in flight go back); its failure ends the role here
  trained_batch = loop.trained_batch();
  const bool stopped = end == rl::LearnerLoop::End::stopped;
  const bool saved = step == out.first_step ? out.first_step > 0 : loop.saved();
  // The end, or SIGINT/SIGTERM: a checkpoint of the last finished step. Not when the
  // launcher died (PDEATHSIG): the hub stops at the same moment, and a checkpoint needs
  // it to save its state; the last committed one stays the place to resume from.
  if (stopped && launcher_gone()) {
    log::warn("learner: the launcher is gone; stopping at step {} without a checkpoint of it", step);
    return 1;
  }
  if (!saved) checkpoint();
  if (stopped) {
    if (group.reformable) group.reformable->finish();
    log::info("learner: stopped at step {}; `rlx run --resume` continues", step);
    return 0;
  }
  export_hf(*models.policy, ctx.run_dir.final_model());
  if (cfg.model.lora.enabled()) export_peft_adapter(*models.policy, ctx.run_dir.final_adapter(), cfg.model.path);
  if (lead) write_tokenizer(cfg, ctx.run_dir.final_tokenizer());
  if (group.reformable) group.reformable->finish();  // the group's last collective is behind: a late replacement ends
  return 0;
}

}  // namespace rlx::launch
