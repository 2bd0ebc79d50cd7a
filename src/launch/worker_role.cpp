// The rollout worker role: rollout::Worker (leases -> episodes -> groups) in a process, with
// its environments in process or behind sandboxed env servers, signals, status and statistics.
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
#include "rlx/rollout/worker.hpp"
namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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
  // For the worker: make() per sample, and the sampler's stop sequences, asked of an
  // in-process instance (a server's RemoteEnv does not carry them).
  rollout::EnvSource source() {
    return {.make = [this] { return make(); },
            .stop_strings = env::Registry::global().make(ctx_.cfg.env.name, context_)->stop_strings()};
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
  // Fault injection for tests: RLX_FAULT=kill-after-episode-checkpoint:W:N makes worker W
  // kill itself (SIGKILL) right after its N-th episode checkpoint, once per run directory.
  std::function<void(uint64_t)> after_checkpoint;
  if (const auto fault = Fault::from_env(); fault.kind == "kill-after-episode-checkpoint" && fault.worker == ctx.index)
    after_checkpoint = [fault, run_dir = ctx.run_dir](uint64_t saved) {
      if (saved >= fault.count && fault.fires(run_dir)) ::raise(SIGKILL);
    };
  // Seconds alive and seconds rolling out (run_dir/stats/worker-N.json, for busy fractions).
  const double born = now_s();
  const auto stats_file = ctx.run_dir / "stats" / fmt::format("worker-{}.json", ctx.index);
  fs::create_directories(stats_file.parent_path());
  std::unique_ptr<rollout::Worker> worker;
  auto write_stats = [&] {
    try {
      write_file_atomic(stats_file,
                        json{{"pid", ::getpid()}, {"wall_s", now_s() - born}, {"busy_s", worker->busy_s()},
                             {"groups", worker->groups_sent()}}.dump(),
                        /*durable=*/false);
    } catch (const std::exception&) {  // a full disk: the busy fraction is missing, not the run
    }
  };
  worker = std::make_unique<rollout::Worker>(
      rollout::WorkerOptions{
          .who = who,
          .rollout = {.max_turns = cfg.env.max_turns,
                      .sampling = {.temperature = cfg.rollout.temperature, .max_new_tokens = cfg.rollout.max_new_tokens},
                      .seed = cfg.run.seed},
          .leases_per_request = cfg.rollout.leases_per_request,
          .weights_timeout_s = cfg.train.batch_timeout_s,
          .episode_dir = ctx.run_dir / "episodes",
          .episode_checkpoint_turns = cfg.rollout.episode_checkpoint_turns,
          .after_episode_checkpoint = after_checkpoint,
          .status = [](const std::string& what) { status::set(what); },
          .after_round =
              [&] {
                status::ready();  // the hub answered
                write_stats();
                if (auto* t = TraceWriter::installed()) t->flush();
              }},
      engine, envs.source(), client, weights);
  const int64_t groups_sent = worker->run(g_end, g_leave);
  client.close(g_end ? 5 : 30);  // SIGTERM: the hub may be gone too (the launcher died)
  log::info("{}: {} groups sent{}", who, groups_sent, g_leave ? "; leaving (rlx scale)" : g_end ? "; stopped (SIGTERM)" : "");
  return 0;
}

}  // namespace rlx::launch
