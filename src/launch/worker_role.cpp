// The rollout worker role: leases -> episodes -> groups, environments in process or behind
// env servers, episode checkpoints, weight subscription; and the held-out evaluation that
// rolls tasks out the same way.
#include "rlx/launch/roles.hpp"

#include "role_common.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <iostream>
#include <thread>

#include "rlx/bus/client.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/status.hpp"
#include "rlx/core/trace.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/env/server.hpp"
#include "rlx/launch/hooks.hpp"
#include "rlx/rollout/engine.hpp"
namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The episodes of one lease (a group), stepped in lockstep with the other leases of a
// grant so that every turn is one batched engine call.
struct GroupRollout {
  bus::Lease lease;
  std::vector<std::unique_ptr<env::Env>> envs;
  std::vector<env::Episode> episodes;
  std::vector<std::vector<int64_t>> versions;  // per token: the weight version, -1 outside actions
  std::string error;                           // an error ends the group (reported to the hub)
  std::string error_kind = "infra";            // infra: retried elsewhere; data: the task is bad
  int start_turn = 0;                          // > 0: continued from an episode checkpoint
};

// The directory of librlx (a trainer's binary may live elsewhere; its servers load it).
fs::path library_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&library_dir), &info) == 0 || !info.dli_fname) return {};
  return fs::canonical(info.dli_fname).parent_path();
}

// Whether the run's environment runs code: it then gets a sandbox of its own inside the
// server, which runs outside one (namespaces do not nest under the sandbox's filter).
bool runs_code(const RunConfig& cfg) { return env::Registry::global().needs(cfg.env.name).runs_code; }

// An env server of this run: its command, sandbox, and ipc address. `name` names its
// socket's directory (worker-W.S).
struct EnvServerPlan {
  env::EnvServerProcess::Options process;
  std::string address;
};
EnvServerPlan env_server_plan(const RoleContext& ctx, const std::string& name) {
  const auto& e = ctx.cfg.env;
  // Each server's socket in a directory of its own: the sandbox makes its writable
  // paths its own user's, so servers (and the run directory) must not share one.
  const auto sock_dir = socket_dir(ctx.run_dir) / "env-sockets" / name;
  fs::create_directories(sock_dir);
  const auto sock = sock_dir / "env.sock";
  fs::copy_file(ctx.run_dir / "tokenizer.json", sock_dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  EnvServerPlan plan{.address = "ipc://" + sock.string()};
  std::vector<std::string> argv{ctx.exe, "env", "serve", "--address", plan.address, "--tokenizer",
                                (sock_dir / "tokenizer.json").string(), "--options", e.options_json().dump(),
                                "--seed", std::to_string(ctx.cfg.run.seed)};
  if (runs_code(ctx.cfg)) argv.push_back("--code-sandbox");
  // The server's binary and its libraries must be visible (read-only) inside.
  // A server lives as long as the worker: the time limits bound one server's life,
  // a stuck call is caught by env.timeout_s.
  auto sandbox = e.sandbox;
  sandbox.limits.wall_s = sandbox.limits.cpu_s = 86400;
  const auto bin = fs::path(ctx.exe).parent_path();
  for (const auto& dir : {bin, bin.parent_path() / "lib", library_dir()})
    if (!dir.empty() && fs::exists(dir) && std::find(sandbox.readonly_paths.begin(), sandbox.readonly_paths.end(), dir.string()) ==
                               sandbox.readonly_paths.end())
      sandbox.readonly_paths.push_back(dir.string());
  plan.process = {.argv = argv, .rlx = ctx.exe, .sandboxed = !runs_code(ctx.cfg), .sandbox = sandbox,
                  .writable = {sock_dir.string()}, .max_restarts = e.max_restarts};
  return plan;
}

std::atomic<bool> g_end{false};  // the worker's SIGTERM
extern "C" void on_end(int) { g_end = true; }
std::atomic<bool> g_leave{false};  // the worker's SIGUSR1 (`rlx scale` down)
extern "C" void on_leave(int) { g_leave = true; }

// Environments of a worker: in-process, or behind sandboxed env servers (env.servers).
class WorkerEnvs {
 public:
  WorkerEnvs(const RoleContext& ctx, std::shared_ptr<const Tokenizer> tok) : ctx_(ctx), tok_(std::move(tok)) {
    const auto& e = ctx.cfg.env;
    context_ = {.tokenizer = tok_.get(), .options = e.options_json(), .seed = ctx.cfg.run.seed};
    if (runs_code(ctx.cfg)) {  // (with servers, only to ask the environment for its stop strings)
      sandbox_ = std::make_unique<Sandbox>(e.sandbox);
      context_.sandbox = sandbox_.get();
    }
    for (uint32_t s = 0; s < e.servers; ++s) {
      auto plan = env_server_plan(ctx, fmt::format("worker-{}.{}", ctx.index, s));
      servers_.push_back(std::make_unique<env::EnvServerProcess>(std::move(plan.process)));
      addresses_.push_back(plan.address);
    }
  }
  // The sampler's stop sequences: asked of an in-process instance (a server's RemoteEnv
  // does not carry them).
  std::vector<std::string> stop_strings() {
    if (!stops_) stops_ = env::Registry::global().make(ctx_.cfg.env.name, context_)->stop_strings();
    return *stops_;
  }

  std::unique_ptr<env::Env> make() {
    const auto& e = ctx_.cfg.env;
    if (servers_.empty()) return env::Registry::global().make(e.name, context_);
    const size_t s = next_++ % servers_.size();
    servers_[s]->ensure_running();
    return std::make_unique<env::RemoteEnv>(env::RemoteEnvOptions{.address = addresses_[s], .env = e.name, .timeout_s = e.timeout_s,
                                                                  .retries = e.retries, .server = servers_[s].get(),
                                                                  .cancel = [] { return g_end.load(); },
                                                                  .leave = [] { return g_leave.load(); }});
  }

 private:
  const RoleContext& ctx_;
  std::shared_ptr<const Tokenizer> tok_;
  env::Context context_;
  std::unique_ptr<Sandbox> sandbox_;
  std::vector<std::unique_ptr<env::EnvServerProcess>> servers_;
  std::vector<std::string> addresses_;
  size_t next_ = 0;
  std::optional<std::vector<std::string>> stops_;
};

}  // namespace

std::string check_env_server(const RoleContext& ctx, double timeout_s) {
  auto plan = env_server_plan(ctx, "check");
  plan.process.argv.insert(plan.process.argv.end(), {"--check", ctx.cfg.env.name});
  auto why = env::EnvServerProcess::trial(std::move(plan.process), timeout_s);
  std::error_code ec;
  fs::remove_all(socket_dir(ctx.run_dir) / "env-sockets" / "check", ec);
  return why;
}

namespace {

// Checkpoints of unfinished multi-turn episodes, one file per lease in run_dir/episodes/
// (p{prompt}.e{epoch}), replaced atomically every rollout.episode_checkpoint_turns turns
// and removed when the group is sent. Whoever takes the lease next (this worker restarted,
// or another) continues from it: each sample's tokens, masks, log-probs, versions and
// reward so far, and its environment's saved state. Sampling is keyed by (prompt, epoch,
// sample, turn), so the turns after it sample what an uninterrupted worker would have.
// The file is the xxh64 of its body (16 hex digits), a newline, then the body (JSON).
class EpisodeCheckpoints {
 public:
  EpisodeCheckpoints(fs::path dir, uint32_t every) : dir_(std::move(dir)), every_(every) {}

  bool due(int finished_turns) const { return every_ > 0 && finished_turns % static_cast<int>(every_) == 0; }

  void save(const GroupRollout& g, int next_turn) {
    json samples = json::array();
    for (size_t k = 0; k < g.episodes.size(); ++k)
      samples.push_back({{"episode", g.episodes[k].to_json()}, {"env_state", g.envs[k]->save_state()},
                         {"versions", g.versions[k]}});
    const auto body = json{{"format", "rlx-episodes/1"}, {"prompt_index", g.lease.prompt_index}, {"epoch", g.lease.epoch},
                           {"task_xxh64", hash_name(g.lease.task)}, {"next_turn", next_turn}, {"samples", samples}}
                          .dump();
    fs::create_directories(dir_);
    write_file_atomic(file(g.lease), fmt::format("{:016x}\n{}", hash_name(body), body));
    ++saved_;
  }

  // Continues `g` from its lease's checkpoint, if there is one that matches the lease.
  // A damaged or mismatched checkpoint is reported and removed; the group starts over.
  bool restore(GroupRollout& g, WorkerEnvs& envs);

  void remove(const bus::Lease& l) {
    std::error_code ec;
    fs::remove(file(l), ec);
  }
  uint64_t saved() const { return saved_; }

 private:
  fs::path file(const bus::Lease& l) const { return dir_ / fmt::format("p{}.e{}", l.prompt_index, l.epoch); }
  fs::path dir_;
  uint32_t every_;
  uint64_t saved_ = 0;
};

bool EpisodeCheckpoints::restore(GroupRollout& g, WorkerEnvs& envs) {
  const auto path = file(g.lease);
  if (every_ == 0 || !fs::exists(path)) return false;
  try {
    const auto text = read_file(path, uint64_t{1} << 30);
    const auto nl = text.find('\n');
    RLX_CHECK(nl == 16, "no checksum line");
    const std::string_view body = std::string_view(text).substr(17);
    RLX_CHECK(fmt::format("{:016x}", hash_name(body)) == text.substr(0, 16), "checksum mismatch (damaged file)");
    const auto j = json::parse(body);
    RLX_CHECK(j.at("format") == "rlx-episodes/1", "unknown format {}", j.at("format").dump());
    RLX_CHECK(j.at("prompt_index").get<uint64_t>() == g.lease.prompt_index && j.at("epoch").get<uint64_t>() == g.lease.epoch &&
                  j.at("task_xxh64").get<uint64_t>() == hash_name(g.lease.task),
              "it belongs to another task");
    const auto& samples = j.at("samples");
    RLX_CHECK(samples.size() == g.lease.group_size, "{} samples, the lease has {}", samples.size(), g.lease.group_size);
    for (const auto& s : samples) {
      g.envs.push_back(envs.make());
      g.envs.back()->load_state(s.at("env_state").get<std::string>());
      g.episodes.push_back(env::Episode::from_json(s.at("episode")));
      g.versions.push_back(s.at("versions").get<std::vector<int64_t>>());
      RLX_CHECK(g.versions.back().size() == g.episodes.back().tokens.size(), "versions do not match the tokens");
    }
    g.start_turn = j.at("next_turn").get<int>();
    return true;
  } catch (const FatalError&) {
    throw;  // not the checkpoint's fault: the run cannot go on
  } catch (const std::exception& e) {
    log::warn("episode checkpoint {}: {}; the episode starts over", path.string(), e.what());
    g.envs.clear(), g.episodes.clear(), g.versions.clear();
    remove(g.lease);
    return false;
  }
}

// Runs f for a group: an environment that failed (InfraError) sends the lease back to be
// retried, a task the environment rejects (Error) ends it as a data error; a FatalError
// ends the run.
template <class F>
void guarded(GroupRollout& gr, F&& f) {
  try {
    f();
  } catch (const env::InfraError& e) {
    gr.error_kind = "infra", gr.error = e.what();
  } catch (const FatalError&) {
    throw;  // the run cannot go on: not this task's fault
  } catch (const Error& e) {
    gr.error_kind = "data", gr.error = e.what();
  }
}

// Runs every lease's group to the end: turn 0 samples each group's shared prompt once
// with n = group size (the samples share its KV blocks); later turns continue each
// unfinished episode. Sampling randomness is keyed by the prompt, epoch, sample and turn,
// so a re-issued lease samples the same tokens under the same weights.
std::vector<GroupRollout> rollout_groups(const RoleContext& ctx, Engine& engine, WorkerEnvs& envs,
                                         const std::vector<bus::Lease>& leases, EpisodeCheckpoints* checkpoints = nullptr,
                                         const std::function<void()>& after_checkpoint = {},
                                         const std::atomic<bool>* stop = nullptr) {
  const auto& cfg = ctx.cfg;
  std::vector<GroupRollout> groups(leases.size());
  const auto stops = envs.stop_strings();
  for (size_t g = 0; g < leases.size(); ++g) {
    auto& gr = groups[g];
    gr.lease = leases[g];
    // An environment that failed (InfraError) sends the lease back to be retried; a task
    // the environment rejects ends the lease as a data error. A server past its restarts
    // (envs.make() throws) ends the worker.
    json task;
    try {
      task = json::parse(gr.lease.task);
    } catch (const json::exception& e) {
      gr.error_kind = "data", gr.error = fmt::format("lease {}: the task is not JSON: {}", gr.lease.lease_id, e.what());
      continue;
    }
    if (checkpoints && checkpoints->restore(gr, envs)) {
      log::info("lease {} (prompt {}): continues its episodes at turn {}", gr.lease.lease_id, gr.lease.prompt_index,
                gr.start_turn);
      continue;
    }
    for (uint32_t k = 0; k < gr.lease.group_size && gr.error.empty(); ++k) {
      gr.envs.push_back(envs.make());
      guarded(gr, [&] {
        gr.episodes.emplace_back().start(gr.envs.back()->reset(task));
        gr.versions.emplace_back(gr.episodes.back().tokens.size(), -1);
      });
    }
  }
  for (int turn = 0; turn < cfg.env.max_turns; ++turn) {
    std::vector<GenerationRequest> requests;
    std::vector<std::pair<size_t, int64_t>> owner;  // group, sample (-1: all samples)
    auto params = SamplingParams{.temperature = cfg.rollout.temperature, .max_new_tokens = cfg.rollout.max_new_tokens,
                                 .stop_strings = stops};
    for (size_t g = 0; g < groups.size(); ++g) {
      auto& gr = groups[g];
      if (!gr.error.empty() || turn < gr.start_turn) continue;
      const auto& l = gr.lease;
      const bool shared = turn == 0 && std::all_of(gr.episodes.begin(), gr.episodes.end(),
                                                   [&](const env::Episode& e) { return e.tokens == gr.episodes[0].tokens; });
      if (shared) {
        auto p = params;
        p.n = l.group_size;
        requests.push_back({.id = fmt::format("p{}.e{}.t0", l.prompt_index, l.epoch), .prompt = gr.episodes[0].tokens,
                            .params = p, .seed = cfg.run.seed});
        owner.emplace_back(g, -1);
        continue;
      }
      for (size_t k = 0; k < gr.episodes.size(); ++k) {
        if (gr.episodes[k].done) continue;
        requests.push_back({.id = fmt::format("p{}.e{}.s{}.t{}", l.prompt_index, l.epoch, k, turn),
                            .prompt = gr.episodes[k].tokens, .params = params, .seed = cfg.run.seed});
        owner.emplace_back(g, static_cast<int64_t>(k));
      }
    }
    if (requests.empty()) break;
    const int64_t gen_us = TraceWriter::now_us();
    auto results = engine.generate(std::move(requests), stop);
    trace_span("generate", gen_us);
    if (stop && *stop) {  // the samples are cut short: nothing of these groups may be sent
      for (auto& gr : groups)
        if (gr.error.empty()) gr.error_kind = "infra", gr.error = "the worker was stopped";
      return groups;
    }
    const int64_t env_us = TraceWriter::now_us();
    for (size_t r = 0; r < results.size(); ++r) {
      auto& gr = groups[owner[r].first];
      for (size_t s = 0; s < results[r].samples.size() && gr.error.empty(); ++s) {
        const size_t k = owner[r].second < 0 ? s : static_cast<size_t>(owner[r].second);
        auto& out = results[r].samples[s];
        auto& ep = gr.episodes[k];
        auto& ver = gr.versions[k];
        ep.add_action(out.tokens, out.logprobs);
        ver.insert(ver.end(), out.versions.begin(), out.versions.end());
        guarded(gr, [&] {
          auto step = gr.envs[k]->step(out.tokens);
          ++ep.turns;
          ep.reward += step.reward;
          ep.done = step.done;
          if (!ep.done) {
            ep.add_observation(step.observation);
            ver.resize(ep.tokens.size(), -1);
          }
        });
      }
    }
    trace_span("env_step", env_us);
    // Unfinished episodes are saved every K turns (not after the last one).
    if (!checkpoints || !checkpoints->due(turn + 1) || turn + 1 >= cfg.env.max_turns) continue;
    bool saved = false;
    for (auto& gr : groups) {
      if (!gr.error.empty() || turn < gr.start_turn ||
          std::all_of(gr.episodes.begin(), gr.episodes.end(), [](const env::Episode& e) { return e.done; }))
        continue;
      try {
        checkpoints->save(gr, turn + 1);
        saved = true;
      } catch (const env::InfraError& e) {  // a remote environment's state could not be read
        gr.error_kind = "infra", gr.error = e.what();
      }
    }
    if (saved && after_checkpoint) after_checkpoint();
  }
  return groups;
}

}  // namespace

namespace {
// Held-out tasks come from a generator stream that training never draws from.
constexpr uint64_t kHeldOutSeed = 0x68656c646f7574;  // "heldout"

std::vector<bus::Lease> generated_leases(const RunConfig& cfg, uint64_t seed, uint64_t first, uint64_t count) {
  std::vector<bus::Lease> out;
  const auto options = cfg.env.options_json();
  for (uint64_t i = 0; i < count; ++i)
    out.push_back({.lease_id = first + i, .prompt_index = first + i, .group_size = 1,
                   .task = env::Registry::global().generate(cfg.env.name, seed, first + i, options).dump()});
  return out;
}

}  // namespace

double greedy_accuracy(const RunConfig& cfg, const std::shared_ptr<Transformer>& model,
                       const std::shared_ptr<const Tokenizer>& tok) {
  RoleContext ctx{.cfg = cfg};
  ctx.cfg.rollout.temperature = 0;
  ctx.cfg.env.servers = 0;
  Engine engine(model, {.block_size = static_cast<int32_t>(cfg.rollout.block_size), .kv_cache_blocks = cfg.rollout.kv_cache_blocks},
                tok);
  WorkerEnvs envs(ctx, tok);
  double total = 0;
  for (const auto& g : rollout_groups(ctx, engine, envs, generated_leases(cfg, cfg.run.seed ^ kHeldOutSeed, 0, cfg.sft.eval_tasks))) {
    RLX_CHECK(g.error.empty(), "eval: task {}: {}", g.lease.prompt_index, g.error);
    total += g.episodes[0].reward;
  }
  return total / cfg.sft.eval_tasks;
}

double evaluate(const RunConfig& cfg) {
  set_threads(cfg);
  env::register_bundled();
  auto tok = run_tokenizer(cfg);
  return greedy_accuracy(cfg, initial_model(cfg, *tok), tok);
}

int run_worker(const RoleContext& ctx) {
  const auto& cfg = ctx.cfg;
  ::signal(SIGUSR1, on_leave);  // `rlx scale` down: finish the leases held, send them, exit
  sigset_t leave;               // the launcher started it with SIGUSR1 blocked: one sent meanwhile arrives now
  sigemptyset(&leave);
  sigaddset(&leave, SIGUSR1);
  ::pthread_sigmask(SIG_UNBLOCK, &leave, nullptr);
  ::signal(SIGINT, SIG_IGN);    // a terminal's SIGINT is the launcher's: it stops workers after the learner
  // SIGTERM (the run is over, or the launcher died): stop at the next lease boundary, so that
  // the env servers are shut down and their logs and this worker's summary reach its log.
  ::signal(SIGTERM, on_end);
  set_threads(cfg);
  env::register_bundled();
  status::set("loading the model");
  auto tok = run_tokenizer(cfg);
  auto model = initial_model(cfg, *tok);
  Engine engine(model, {.block_size = static_cast<int32_t>(cfg.rollout.block_size), .kv_cache_blocks = cfg.rollout.kv_cache_blocks},
                tok);
  // SIGTERM while it waits for the learner's first weights (a worker restarted as the run
  // ended, when the learner and its segment are gone): it stops there.
  std::unique_ptr<dist::WeightSubscriber> subscriber;
  status::set("waiting for the learner's first weights");
  try {
    subscriber = ctx.weight_subscriber([] { return g_end.load(); });
  } catch (const Error& e) {
    if (!g_end) throw;
    log::info("worker-{}: stopped (SIGTERM) before its first weights ({})", ctx.index, e.what());
    return 0;
  }
  auto& weights = *subscriber;
  status::set(cfg.env.servers > 0 ? fmt::format("starting {} env servers", cfg.env.servers) : "starting");
  WorkerEnvs envs(ctx, tok);
  const std::string who = fmt::format("worker-{}", ctx.index);
  bus::Client client({.address = ctx.hub_address(), .who = who});
  // The hub stops with the launcher; SIGTERM ends a wait for the hub's answer (a hub
  // stopped first, or gone with its node, would hold it for request_timeout_s).
  client.give_up_when([] { return g_end || launcher_gone(); });
  auto apply_weights = [&] {
    if (auto u = weights.poll()) engine.update_weights(u->version, u->tensors);
  };
  EpisodeCheckpoints episodes(ctx.run_dir / "episodes", cfg.rollout.episode_checkpoint_turns);
  // Fault injection for tests: RLX_FAULT=kill-after-episode-checkpoint:W:N makes worker W
  // kill itself (SIGKILL) right after its N-th episode checkpoint, once per run directory.
  std::function<void()> after_checkpoint;
  if (const auto fault = Fault::from_env(); fault.kind == "kill-after-episode-checkpoint" && fault.worker == ctx.index)
    after_checkpoint = [&episodes, fault, run_dir = ctx.run_dir] {
      if (episodes.saved() >= fault.count && fault.fires(run_dir)) ::raise(SIGKILL);
    };
  int64_t groups_sent = 0;
  // Seconds alive and seconds rolling out (run_dir/stats/worker-N.json, for busy fractions).
  const double born = now_s();
  double busy_s = 0;
  const auto stats_file = ctx.run_dir / "stats" / fmt::format("worker-{}.json", ctx.index);
  fs::create_directories(stats_file.parent_path());
  auto write_stats = [&] {
    try {
      write_file_atomic(stats_file, json{{"pid", ::getpid()}, {"wall_s", now_s() - born}, {"busy_s", busy_s}, {"groups", groups_sent}}.dump(),
                        /*durable=*/false);
    } catch (const std::exception&) {  // a full disk: the busy fraction is missing, not the run
    }
  };
  int64_t wait_us = TraceWriter::now_us();  // since the last grant was done
  while (!g_leave && !g_end) {
    apply_weights();
    bus::LeaseGrant grant;
    status::set("asking the hub for leases");
    try {
      grant = client.request_leases(cfg.rollout.leases_per_request);
    } catch (const Error&) {
      if (g_end) break;  // stopped while waiting for the hub's answer
      throw;
    }
    status::ready();
    if (grant.exhausted) break;
    if (grant.leases.empty()) {
      status::set(fmt::format("no lease to take (has weights v{}; the hub waits for the learner's next version, or its "
                              "leases are all out)",
                              weights.version()));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      write_stats();
      continue;
    }
    // A lease asks for weights at least as new as its min_version (synchronous mode:
    // the current one); the learner has published them by the time the hub knows them.
    int64_t need = 0;
    for (const auto& l : grant.leases) need = std::max(need, l.min_version);
    const double deadline = now_s() + cfg.train.batch_timeout_s;
    if (weights.version() < need) status::set(fmt::format("waiting for weights v{} (has v{})", need, weights.version()));
    while (weights.version() < need && !g_end && !g_leave) {  // staged in the engine, applied before its next step
      RLX_CHECK(now_s() < deadline, "{}: weights version {} did not arrive within {} s (have {})", who, need,
                cfg.train.batch_timeout_s, weights.version());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      apply_weights();
    }
    if (g_end) break;  // the leases held are re-issued if the run goes on
    trace_span("wait_leases", wait_us);
    const double busy_from = now_s();
    const int64_t rollout_us = TraceWriter::now_us();
    status::set(fmt::format("rolling out {} leases", grant.leases.size()));
    auto groups = rollout_groups(ctx, engine, envs, grant.leases, &episodes, after_checkpoint, &g_end);
    if (g_end) break;  // cut short: the hub re-issues these leases if the run goes on
    for (auto& gr : groups) {
      if (!gr.error.empty()) {
        if (gr.error_kind == "data") episodes.remove(gr.lease);  // infra: the retry continues from it
        log::warn("{}: lease {} (prompt {}): {} error: {}", who, gr.lease.lease_id, gr.lease.prompt_index, gr.error_kind,
                  gr.error);
        client.report_error(gr.lease.lease_id, gr.error_kind, gr.error);
        continue;
      }
      bus::TrajectoryGroup group{.lease_id = gr.lease.lease_id, .prompt_index = gr.lease.prompt_index,
                                 .epoch = gr.lease.epoch, .worker = who};
      for (size_t k = 0; k < gr.episodes.size(); ++k) {
        auto& ep = gr.episodes[k];
        bus::Trajectory t;
        t.tokens.assign(ep.tokens.begin(), ep.tokens.end());
        t.loss_mask = std::move(ep.loss_mask);
        t.logprobs = std::move(ep.logprobs);
        t.versions = bus::TokenVersions(gr.versions[k]);
        t.prompt_len = ep.prompt_len;
        t.reward = static_cast<float>(ep.reward);
        t.finish = ep.done ? "stop" : "length";
        group.samples.push_back(std::move(t));
      }
      try {
        client.submit(std::move(group));
      } catch (const Error&) {
        if (g_end) break;  // stopped while out of credit: the hub re-issues this lease if the run goes on
        throw;
      }
      episodes.remove(gr.lease);
      ++groups_sent;
    }
    trace_span("rollout", rollout_us);
    wait_us = TraceWriter::now_us();
    busy_s += now_s() - busy_from;
    write_stats();
    if (auto* t = TraceWriter::installed()) t->flush();
  }
  client.close(g_end ? 5 : 30);  // SIGTERM: the hub may be gone too (the launcher died)
  log::info("{}: {} groups sent{}", who, groups_sent, g_leave ? "; leaving (rlx scale)" : g_end ? "; stopped (SIGTERM)" : "");
  return 0;
}

}  // namespace rlx::launch
