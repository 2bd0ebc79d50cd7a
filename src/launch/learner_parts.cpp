#include "learner_parts.hpp"

#include <algorithm>
#include <set>
#include <thread>

#include "role_common.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/status.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/launch/hooks.hpp"
#include "rlx/launch/memory_plan.hpp"
#include "rlx/rl/sample_log.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/rollout/paged_kv_cache.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

at::Device learner_rank_device(const RunConfig& cfg) {
  const auto ro = cfg.train.learner_ranks > 1 ? dist::rendezvous_from_env() : dist::RendezvousOptions{};
  return learner_device(cfg.model.device, ro.rank, ro.world_size, compat::cuda_device_count());
}

LearnerGroup join_learner_group(const RunConfig& cfg, at::Device device) {
  LearnerGroup g;
  if (cfg.train.learner_ranks <= 1) {
    g.comm = dist::single_process();
    return g;
  }
  // The ranks wait in collectives while rank 0 waits for a batch.
  auto ro = dist::rendezvous_from_env();
  ro.timeout_s = std::max(ro.timeout_s, cfg.train.batch_timeout_s + 60);
  // Ranks on CUDA devices use NCCL where it is built, unless RLX_COMM_BACKEND says otherwise;
  // each rank's device is its current one (NCCL stages host tensors there).
  compat::set_current_device(device);
  if (std::getenv("RLX_COMM_BACKEND") == nullptr) ro.nccl = device.is_cuda() && dist::nccl_available();
  if (const char* r = std::getenv(kLearnerReformEnv); r && std::string_view(r) == "1") {
    auto group = dist::connect_reformable(ro);
    if (group->finished()) {
      log::info("learner: rank {}: the learner group finished before this rank could join it", group->rank());
      g.finished = true;
      return g;
    }
    g.reformable = group.get();
    if (group->generation() > 0)
      log::info("learner: rank {} joined the learner group's generation {} (replacing a rank that died)", group->rank(),
                group->generation());
    g.comm = std::move(group);
  } else {
    g.comm = dist::connect(ro);
  }
  return g;
}

namespace {

// The memory plan, checked against what the device has free before anything else is
// allocated (the starting model, already there, stays as a colocated engine's weights).
void check_memory_plan(const RunConfig& cfg, const Transformer& start, const LearnerModels& m, int rank) {
  const bool colocated = cfg.train.placement == Placement::colocated;
  int64_t parameters = 0, start_bytes = 0;
  for (const auto& [name, p] : start.hf_parameters())
    parameters += p.numel(), start_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  const int64_t block =
      PagedKVCache::block_bytes(start.config(), static_cast<int32_t>(cfg.rollout.block_size), start.dtype());
  const int64_t kv = colocated ? cfg.rollout.kv_cache_blocks * block : 0;
  const int64_t val_kv = rank == 0 && cfg.validation.every_steps > 0 ? cfg.validation.kv_cache_blocks * block : 0;
  const auto& a = *m.algorithm;
  const auto plan =
      plan_memory(cfg, start.config(), parameters, kv, a.needs_reference(), a.needs_critic() && !m.value_head,
                  a.needs_teacher() ? read_hf_config(cfg.algorithm.teacher).num_parameters() : 0, val_kv);
  if (rank == 0)
    log::info("learner: memory plan on {} ({} parameters{}):\n{}", cfg.model.device, parameters,
              colocated ? ", colocated with the rollout engine" : "", plan.describe());
  // The starting model is already on this rank's device: its bytes count as free.
  const auto device = start.device().str();
  const int64_t free = free_memory_bytes(device);
  plan.check(free < 0 ? free : free + start_bytes, device);
}

// On-policy distillation: the teacher, frozen and sharded like the reference model.
std::unique_ptr<ReferenceModel> load_teacher(const RunConfig& cfg, const Transformer& start, dist::Communicator& comm,
                                             const LearnerOptions& lo) {
  status::set("loading the teacher");
  auto t = load_hf(cfg.algorithm.teacher,
                   {.dtype = to_scalar_type(cfg.model.dtype), .device = at::Device(cfg.model.device)});
  RLX_CHECK(t->config().vocab_size == start.config().vocab_size,
            "algorithm.teacher {}: its vocabulary ({} tokens) is not the student's ({}): distillation scores the "
            "student's tokens with the teacher, so both need the same tokenizer",
            cfg.algorithm.teacher, t->config().vocab_size, start.config().vocab_size);
  auto teacher = std::make_unique<ReferenceModel>(t->config(), comm, lo.fsdp);
  teacher->load_from(*t);
  if (comm.rank() == 0)
    log::info("learner: teacher {} ({} layers, hidden {})", cfg.algorithm.teacher, t->config().num_layers,
              t->config().hidden_size);
  return teacher;
}

}  // namespace

LearnerModels build_models(const RunConfig& cfg, const Transformer& start, dist::Communicator& comm) {
  algo::register_bundled_algorithms();
  LearnerModels m;
  m.algorithm = algo::make_algorithm(cfg.algorithm);
  auto& lo = m.options = learner_options(cfg.learner, cfg.run.seed, start.device());
  lo.fsdp.lora = cfg.model.lora;
  m.value_head = m.algorithm->needs_critic() && cfg.algorithm.critic == algo::CriticKind::head;
  lo.value_head = m.value_head;
  lo.entropy = true;  // the metric GRPO users watch most; in the loss when algorithm.entropy_coef > 0
  lo.routing_replay = cfg.algorithm.routing_replay;
  check_memory_plan(cfg, start, m, comm.rank());
  m.policy = std::make_unique<Learner>(start.config(), comm, lo);
  m.policy->load_from(start);
  if (m.algorithm->needs_reference() && lo.fsdp.lora.enabled()) {
    m.reference = std::make_unique<ReferenceModel>(m.policy->model());  // the base: the adapters switched off
  } else if (m.algorithm->needs_reference()) {
    m.reference = std::make_unique<ReferenceModel>(start.config(), comm, lo.fsdp);
    m.reference->load_from(start);
  }
  if (m.algorithm->needs_teacher()) m.teacher = load_teacher(cfg, start, comm, lo);
  if (m.algorithm->needs_critic() && !m.value_head) {
    auto co = lo;
    co.policy_head = false;
    co.value_head = true;
    co.entropy = false;
    if (cfg.algorithm.critic_lr > 0) co.optimizer.lr = cfg.algorithm.critic_lr;
    m.critic = std::make_unique<Learner>(start.config(), comm, co);
    m.critic->load_from(start);
  }
  return m;
}

void LearnerModels::abandon() {
  policy->model().abandon();
  if (critic) critic->model().abandon();
  if (reference) reference->abandon();
  if (teacher) teacher->abandon();
}

namespace {
// Removes the hub states that no kept checkpoint references (they go with the checkpoints).
void prune_hub_states(const RunDir& run_dir) {
  std::set<std::string> kept;
  for (const auto& c : list_checkpoints(run_dir.checkpoints()))
    if (std::ifstream f(c / "learner.json"); f) {  // the checkpoint's own layout (learner/checkpoint.hpp)
      const auto j = json::parse(f, nullptr, false);
      if (!j.is_discarded()) kept.insert(j.value("references", json::object()).value("hub_state", std::string()));
    }
  for (const auto& p : run_dir.hub_states())
    if (!kept.contains(p.filename().string())) fs::remove(p);
}
}  // namespace

Checkpointer::Checkpointer(const RoleContext& ctx, LearnerModels& models, bool lead)
    : ctx_(ctx),
      m_(models),
      lead_(lead),
      policy_{.root = ctx.run_dir.checkpoints(), .keep_last = ctx.cfg.learner.checkpoint_keep_last},
      critic_{.root = ctx.run_dir.critic_checkpoints(), .keep_last = ctx.cfg.learner.checkpoint_keep_last} {}

std::optional<LoadedCheckpoint> Checkpointer::restore(const char* who) {
  auto loaded = load_latest_checkpoint(*m_.policy, policy_);
  if (!loaded) return loaded;
  if (m_.critic) {
    auto c = load_latest_checkpoint(*m_.critic, critic_);
    RLX_CHECK(c && c->step == loaded->step,
              "{}: the critic's checkpoint does not match the policy's (optimizer step {})", who, loaded->step);
  }
  m_.algorithm->set_kl_coef(loaded->references.value("kl_coef", m_.algorithm->kl_coef()));  // adaptive KL's state
  return loaded;
}

void Checkpointer::save(int64_t step, uint64_t trained_batch, bus::Client* client) {
  status::Scope doing(fmt::format("checkpointing step {}", step));
  // Fault injection for tests: RLX_FAULT=slow-checkpoint:SECONDS makes the first checkpoint
  // of a run directory take SECONDS longer (a stop request arrives while it is written).
  if (lead_)
    if (auto f = fault::fires(fault::Point::slow_checkpoint, {.rank = 0, .once_file = ctx_.run_dir.fault_marker()}))
      std::this_thread::sleep_for(std::chrono::duration<double>(f->seconds));
  const auto name = RunDir::hub_state_name(step);
  if (lead_) client->checkpoint_saved(name, trained_batch);  // confirms it; saves the hub
  if (m_.critic) save_checkpoint(*m_.critic, critic_);
  const auto dir = save_checkpoint(
      *m_.policy, policy_, {{"hub_state", name}, {"weights_version", step}, {"kl_coef", m_.algorithm->kl_coef()}});
  if (lead_) prune_hub_states(ctx_.run_dir);
  if (lead_)
    for (const auto& h : hooks())
      if (h.on_checkpoint) h.on_checkpoint(step, dir);
}

LearnerReports::LearnerReports(const RoleContext& ctx, bool lead) : cfg_(ctx.cfg) {
  if (!lead) return;
  metrics_.open(ctx.run_dir.metrics(), std::ios::app);
  if (cfg_.log.tensorboard) {
    if (tensorboard_available())
      tensorboard_.emplace(ctx.run_dir.tensorboard());
    else
      log::warn("log.tensorboard: this rlx was built without protobuf (RLX_TENSORBOARD=OFF); metrics.jsonl only");
  }
  // log.samples_every: some of the step's samples as text (samples.jsonl, the TEXT tab).
  if (cfg_.log.samples_every > 0) samples_.open(ctx.run_dir.samples(), std::ios::app);
}

void LearnerReports::step(int64_t step, const json& line) {
  metrics_ << line.dump() << std::endl;
  if (tensorboard_) {
    tensorboard_->add_scalars(step, line);
    tensorboard_->flush();
  }
}

void LearnerReports::samples(int64_t step, const bus::BatchView& batch, const Tokenizer& tok) {
  if (cfg_.log.samples_every <= 0 || step % cfg_.log.samples_every != 0) return;
  const auto picked = rl::readable_samples(batch, tok, step, cfg_.log.samples_per_step);
  for (const auto& sample : picked) samples_ << rl::json_line(sample) << "\n";
  samples_.flush();
  if (tensorboard_) tensorboard_->add_text(step, "samples", rl::samples_markdown(step, picked));
}

void RolloutBusy::add_to(json& line) {
  std::error_code ec;
  double sum = 0, rolling = 0;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const auto name = e.path().stem().string();
    if (!name.starts_with(RunDir::kWorkerStatsPrefix) || e.path().extension() != ".json") continue;
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
    const auto index = name.substr(std::string_view(RunDir::kWorkerStatsPrefix).size());
    line["busy_worker_" + index] = frac;
    if (j.contains("peak_mem_mb")) line["peak_mem_mb_worker_" + index] = j.value("peak_mem_mb", 0.0);
    sum += frac, rolling += std::max(0.0, db), ++n;
  }
  if (n > 0) line["busy_rollout"] = sum / n;
  if (n > 0) line["generate_s"] = rolling / n;  // each worker's seconds rolling out, mean
}

}  // namespace rlx::launch
