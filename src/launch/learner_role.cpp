// The learner role: batches from the hub -> sequences -> train_on_batch -> weights
// published -> metrics line -> checkpoints, on every learner rank (rank 0 talks to the hub).
#include "rlx/launch/roles.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <numeric>
#include <set>

#include "role_common.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/status.hpp"
#include "rlx/core/trace.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/launch/hooks.hpp"
#include "rlx/learner/algorithm_loss.hpp"
#include "rlx/learner/checkpoint.hpp"
#include "rlx/model/hf.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
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

// Rank 0's value on every rank.
int64_t broadcast_value(dist::Communicator& comm, int64_t value, const char* what) {
  if (comm.size() == 1) return value;
  auto t = at::tensor({value}, at::kLong);
  comm.broadcast(t, 0, what)->wait();
  return t.item<int64_t>();
}

// Rank 0's batch on every rank: its head and group frames as they came from the hub, which
// each rank checks and reads in place.
bus::BatchView broadcast_batch(dist::Communicator& comm, bus::BatchView batch) {
  auto bytes = std::make_shared<std::string>();
  if (comm.rank() == 0) *bytes = bus::pack_batch(batch);
  const auto n = broadcast_value(comm, static_cast<int64_t>(bytes->size()), "learner: batch size");
  RLX_CHECK(n >= 0 && n <= (int64_t{1} << 34), "learner: a batch of {} bytes", n);
  bytes->resize(static_cast<size_t>(n));
  auto t = at::from_blob(bytes->data(), {n}, at::kByte);
  comm.broadcast(t, 0, "learner: batch")->wait();
  if (comm.rank() == 0) return batch;
  // Rank 0's client held the frames to its own max_frame_mb; here, its largest setting.
  return bus::unpack_batch(std::move(bytes), bus::Limits{.max_frame_bytes = uint64_t{4096} << 20});
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
    double sum = 0;
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
      line["busy_" + name.substr(0, 6) + "_" + name.substr(7)] = frac;
      sum += frac, ++n;
    }
    if (n > 0) line["busy_rollout"] = sum / n;
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
  // The learner group: ranks wait in collectives while rank 0 waits for a batch.
  std::unique_ptr<dist::Communicator> comm;
  if (cfg.train.learner_ranks > 1) {
    auto ro = dist::rendezvous_from_env();
    ro.timeout_s = std::max(ro.timeout_s, cfg.train.batch_timeout_s + 60);
    // Ranks on CUDA devices use NCCL where it is built, unless RLX_COMM_BACKEND says otherwise.
    if (std::getenv("RLX_COMM_BACKEND") == nullptr)
      ro.nccl = cfg.learner.options(cfg.run.seed).fsdp.device.is_cuda() && dist::nccl_available();
    comm = dist::connect(ro);
  } else {
    comm = dist::single_process();
  }
  algo::register_bundled_algorithms();
  auto algorithm = algo::make_algorithm(cfg.algorithm);
  auto lo = cfg.learner.options(cfg.run.seed);
  const bool head = algorithm->needs_critic() && cfg.algorithm.critic == algo::CriticKind::head;
  lo.value_head = head;
  lo.entropy = true;  // the metric GRPO users watch most; in the loss when algorithm.entropy_coef > 0
  Learner policy(start->config(), *comm, lo);
  policy.load_from(*start);
  std::unique_ptr<ReferenceModel> reference;
  if (algorithm->needs_reference()) {
    reference = std::make_unique<ReferenceModel>(start->config(), *comm, lo.fsdp);
    reference->load_from(*start);
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
  start.reset();

  // Resume: the newest verified checkpoint (the launcher restored the hub's state saved
  // with it). Version k is the policy after k steps; version 0 every role builds itself.
  const CheckpointOptions policy_ckpt{.root = ctx.run_dir / "checkpoints", .keep_last = cfg.learner.checkpoint_keep_last};
  const CheckpointOptions critic_ckpt{.root = ctx.run_dir / "checkpoints-critic", .keep_last = cfg.learner.checkpoint_keep_last};
  int64_t step = 0;
  if (auto loaded = load_latest_checkpoint(policy, policy_ckpt)) {
    step = loaded->step;
    if (critic) {
      auto c = load_latest_checkpoint(*critic, critic_ckpt);
      RLX_CHECK(c && c->step == step, "resume: the critic's checkpoint does not match the policy's step {}", step);
    }
    algorithm->set_kl_coef(loaded->references.value("kl_coef", algorithm->kl_coef()));  // adaptive KL's state
    log::info("learner: resumed from {} (step {})", loaded->dir.string(), step);
  }
  // Rank 0 talks to the hub and publishes weights; every rank trains its share.
  const bool lead = comm->rank() == 0;
  const int world = comm->size();
  auto params = policy.model().gather_parameters();
  std::unique_ptr<dist::WeightPublisher> pub;
  std::unique_ptr<bus::Client> client;
  if (lead) {
    pub = ctx.weight_publisher(dist::WeightLayout::of(params, to_scalar_type(cfg.model.dtype)));
    client = std::make_unique<bus::Client>(
        bus::ClientOptions{.address = ctx.hub_address(),
                           .who = "learner",
                           .role = "learner",
                           .prefetch_batches = cfg.learner.prefetch_batch ? 1 : 0});
    client->give_up_when(launcher_gone);  // the hub stops with the launcher
    status::set(fmt::format("publishing weights v{}", step));
    if (step > 0) {
      pub->publish(step, params);
      client->publish_version(step);
    } else if (cfg.learner.prefetch_batch) {
      client->publish_version(0);  // so that the batch asked ahead of step 1 is picked for version 1
    }
  }
  uint64_t trained_batch = 0;  // the hub's id of the last batch trained
  // Fault injection for tests: RLX_FAULT=slow-checkpoint:SECONDS makes the first checkpoint
  // of a run directory take SECONDS longer (a stop request arrives while it is written).
  const auto fault = Fault::from_env();
  auto checkpoint = [&] {      // collective
    status::Scope doing(fmt::format("checkpointing step {}", step));
    if (fault.kind == "slow-checkpoint" && lead && fault.fires(ctx.run_dir)) {
      std::this_thread::sleep_for(std::chrono::duration<double>(fault.seconds));
    }
    const auto name = fmt::format("hub-step_{:08d}.state", step);
    if (lead) client->control(fmt::format("checkpoint {} {}", name, trained_batch));  // confirms it; saves the hub
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
  const double t_start = now_s();
  bool saved = step > 0, stopped = false;
  RolloutBusy rollout_busy(ctx.run_dir);
  for (;;) {
    const double t0 = now_s();
    const int64_t t0_us = TraceWriter::now_us();
    // Rank 0 takes the batch (waiting in slices so that SIGINT/SIGTERM is noticed while
    // rollout is slow) and decides for every rank: train it, or stop.
    bus::BatchView batch;  // its groups read in place from the frames the hub sent
    enum : int64_t { kTrain = 0, kStop = 1, kEnd = 2 };
    int64_t what = kTrain;
    status::ready();
    status::set(lead ? fmt::format("waiting for a batch of {} groups from the hub (step {})", cfg.train.groups_per_step, step + 1)
                     : fmt::format("waiting for rank 0's batch (step {})", step + 1));
    if (lead) {
      if (step >= cfg.train.steps) what = kEnd;
      while (what == kTrain && !g_stop) {
        try {
          batch = client->next_batch_view({.max_groups = cfg.train.groups_per_step}, 1.0);
          break;
        } catch (const bus::TimeoutError&) {
          RLX_CHECK(now_s() - t0 < cfg.train.batch_timeout_s, "learner: no batch from the hub within {} s (step {})",
                    cfg.train.batch_timeout_s, step + 1);
        }
      }
      if (what == kTrain && batch.groups.empty()) {
        if (g_stop) {
          what = kStop;
        } else {
          RLX_CHECK(batch.end, "learner: the hub sent an empty batch that is not the end");
          log::info("learner: the hub has no more groups; stopping at step {}", step);
          what = kEnd;
        }
      }
      RLX_CHECK(what != kTrain || batch.groups.size() >= static_cast<size_t>(world),
                "learner: a batch of {} groups cannot feed {} ranks", batch.groups.size(), world);
    }
    what = broadcast_value(*comm, what, "learner: train or stop");
    if (what != kTrain) {
      stopped = what == kStop;
      break;
    }
    const double t_wait = now_s() - t0;
    trace_span("wait_batch", t0_us);
    if (world > 1) batch = broadcast_batch(*comm, std::move(batch));
    // Groups in prompt order: the step does not depend on which worker finished first;
    // the ranks share them balanced by tokens.
    std::vector<size_t> order(batch.groups.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      const auto &a = batch.groups[x], &b = batch.groups[y];
      return std::tie(a.epoch, a.prompt_index) < std::tie(b.epoch, b.prompt_index);
    });
    std::vector<int64_t> group_tokens;
    for (const size_t i : order) group_tokens.push_back(batch.groups[i].num_tokens());
    const auto rank_of = assign_ranks(group_tokens, static_cast<uint32_t>(world));
    std::vector<Sequence> seqs;
    std::vector<double> rewards;
    std::vector<size_t> sizes;
    int64_t vmin = INT64_MAX, vmax = -1, tokens = 0;
    for (size_t gi = 0; gi < order.size(); ++gi) {
      const auto& g = batch.groups[order[gi]];
      const auto [lo_v, hi_v] = g.version_range();
      if (lo_v >= 0) vmin = std::min(vmin, lo_v), vmax = std::max(vmax, hi_v);
      tokens += g.num_tokens();
      if (static_cast<int>(rank_of[gi]) != comm->rank()) continue;
      sizes.push_back(g.samples.size());
      for (const auto& t : g.samples) {
        Sequence sq;
        sq.tokens.resize(t.tokens.size());
        for (size_t i = 0; i < t.tokens.size(); ++i) sq.tokens[i] = t.tokens[i];
        t.loss_mask.append_to(sq.loss_mask);
        t.logprobs.append_to(sq.values["behaviour_logprobs"]);
        rewards.push_back(t.reward);
        seqs.push_back(std::move(sq));
      }
    }
    const double t1 = now_s();
    const int64_t t1_us = TraceWriter::now_us();
    status::set(fmt::format("training step {}", step + 1));
    for (const auto& h : hooks())
      if (h.on_rewards) {
        const size_t n = rewards.size();
        h.on_rewards(step + 1, rewards, sizes);
        RLX_CHECK(rewards.size() == n, "a trainer's on_rewards hook changed the number of rewards ({} -> {})", n,
                  rewards.size());
      }
    auto m = train_on_batch(*algorithm, {.policy = policy, .critic = critic.get(), .reference = reference.get()}, seqs,
                            rewards, sizes);
    const double t_train = now_s() - t1;
    trace_span("train", t1_us);
    ++step;
    trained_batch = batch.batch_id;
    params = policy.model().gather_parameters();
    const double t2 = now_s();
    const int64_t t2_us = TraceWriter::now_us();
    status::set(fmt::format("publishing weights v{}", step));
    if (lead) {
      pub->publish(step, params);
      client->publish_version(step);
    }
    const double t_sync = now_s() - t2;
    trace_span("publish_weights", t2_us);
    saved = false;
    const double t3 = now_s();
    if (cfg.learner.checkpoint_every > 0 && step % cfg.learner.checkpoint_every == 0) {
      const int64_t t3_us = TraceWriter::now_us();
      checkpoint(), saved = true;
      trace_span("checkpoint", t3_us);
    }
    const double t_ckpt = now_s() - t3;
    if (auto* t = TraceWriter::installed()) t->flush();
    if (!lead) continue;
    json line = {{"step", step},
                 {"time_s", now_s() - t_start},
                 {"groups", batch.groups.size()},
                 {"learner_ranks", world},
                 {"sequence_tokens", tokens},  // prompts, actions and observations
                 {"tokens_per_s", static_cast<double>(tokens) / std::max(now_s() - t0, 1e-9)},
                 {"sample_version_min", vmin == INT64_MAX ? -1 : vmin},
                 {"sample_version_max", vmax},
                 {"version_lag", vmin == INT64_MAX ? 0 : step - 1 - vmin},  // trained version minus oldest sample
                 {"wait_s", t_wait},
                 {"train_s", t_train},
                 {"sync_s", t_sync},
                 {"checkpoint_s", t_ckpt},
                 // the learner's share of the step spent working (training, publishing, checkpointing)
                 {"busy_learner", (t_train + t_sync + t_ckpt) / std::max(now_s() - t0, 1e-9)}};
    rollout_busy.add_to(line);
    for (const auto& [k, v] : m) line[k] = v;
    for (const auto& h : hooks())
      if (h.on_step) h.on_step(step, line);
    metrics_out << line.dump() << std::endl;
    const double per_step = (now_s() - t_start) / static_cast<double>(step);
    std::cerr << fmt::format("step {}/{}  reward {:.3f}  tokens/s {:.0f}  lag {}  eta {:.0f}s", step, cfg.train.steps,
                             m["reward_mean"], line["tokens_per_s"].get<double>(), line["version_lag"].get<int64_t>(),
                             per_step * static_cast<double>(cfg.train.steps - step))
              << std::endl;
  }
  // The end, or SIGINT/SIGTERM: a checkpoint of the last finished step. Not when the
  // launcher died (PDEATHSIG): the hub stops at the same moment, and a checkpoint needs
  // it to save its state; the last committed one stays the place to resume from.
  if (stopped && launcher_gone()) {
    log::warn("learner: the launcher is gone; stopping at step {} without a checkpoint of it", step);
    return 1;
  }
  if (!saved) checkpoint();
  if (stopped) {
    log::info("learner: stopped at step {}; `rlx run --resume` continues", step);
    return 0;
  }
  export_hf(policy, ctx.run_dir / "final");
  if (lead) write_tokenizer(cfg, ctx.run_dir / "final" / "tokenizer.json");
  return 0;
}


}  // namespace rlx::launch
