// The rollout worker role: rl::Worker (leases -> episodes -> groups) in a process, with
// its environments in process or behind sandboxed env servers, signals, status and statistics.
#include "rlx/launch/roles.hpp"

#include "role_common.hpp"
#include "worker_envs.hpp"

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
#include "rlx/rl/worker.hpp"
namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::atomic<bool> g_end{false};  // the worker's SIGTERM
extern "C" void on_end(int) { g_end = true; }
std::atomic<bool> g_leave{false};  // the worker's SIGUSR1 (`rlx scale` down)
extern "C" void on_leave(int) { g_leave = true; }

}  // namespace

int run_worker(const RoleContext& ctx) {
  const auto& cfg = ctx.cfg;
  ::signal(SIGUSR1, on_leave);  // `rlx scale` down: finish the leases held, send them, exit
  ::signal(SIGINT, SIG_IGN);    // a terminal's SIGINT is the launcher's: it stops workers after the learner
  // SIGTERM (the run is over, or the launcher died): stop at the next lease boundary, so that
  // the env servers are shut down and their logs and this worker's summary reach its log.
  ::signal(SIGTERM, on_end);
  // The launcher started it with SIGUSR1 and SIGTERM blocked: one sent while it started
  // arrives now, to the handlers.
  sigset_t held;
  sigemptyset(&held);
  sigaddset(&held, SIGUSR1);
  sigaddset(&held, SIGTERM);
  ::pthread_sigmask(SIG_UNBLOCK, &held, nullptr);
  set_threads(cfg);
  env::register_bundled();
  status::set("loading the model");
  auto tok = run_tokenizer(cfg);
  auto model = initial_model(cfg, *tok);
  add_engine_adapters(*model, cfg);
  Engine engine(model, engine_config(cfg), tok);
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
  WorkerEnvs envs(ctx, tok, [] { return g_end.load(); }, [] { return g_leave.load(); });
  const std::string who = fmt::format("worker-{}", ctx.index);
  bus::Client client({.address = ctx.hub_address(), .who = who});
  // The hub stops with the launcher; SIGTERM ends a wait for the hub's answer (a hub
  // stopped first, or gone with its node, would hold it for request_timeout_s).
  client.give_up_when([] { return g_end || launcher_gone(); });
  // Fault injection for tests: RLX_FAULT=kill-after-episode-checkpoint:W:N makes worker W
  // kill itself (SIGKILL) right after its N-th episode checkpoint, once per run directory.
  std::function<void(uint64_t)> after_checkpoint;
  if (fault::armed(fault::Point::kill_after_episode_checkpoint))
    after_checkpoint = [index = ctx.index, marker = ctx.run_dir.fault_marker()](uint64_t saved) {
      fault::crash_at(fault::Point::kill_after_episode_checkpoint, {.rank = index, .count = saved, .once_file = marker});
    };
  // Seconds alive and seconds rolling out (run_dir/stats/worker-N.json, for busy fractions).
  const double born = now_s();
  const auto stats_file = ctx.run_dir.worker_stats(ctx.index);
  fs::create_directories(stats_file.parent_path());
  std::unique_ptr<rl::Worker> worker;
  auto write_stats = [&] {
    try {
      write_file_atomic(stats_file,
                        json{{"pid", ::getpid()}, {"wall_s", now_s() - born}, {"busy_s", worker->busy_s()},
                             {"groups", worker->groups_sent()}, {"peak_mem_mb", peak_memory_mb(cfg)}}.dump(),
                        /*durable=*/false);
    } catch (const std::exception&) {  // a full disk: the busy fraction is missing, not the run
    }
  };
  auto options = worker_options(ctx, who, model->config().vocab_size);
  options.after_episode_checkpoint = after_checkpoint;
  options.status = [](const std::string& what) { status::set(what); };
  options.after_round = [&] {
    status::ready();  // the hub answered
    write_stats();
    if (auto* t = TraceWriter::installed()) t->flush();
  };
  worker = std::make_unique<rl::Worker>(std::move(options),
      engine, envs.source(), client, weights);
  const int64_t groups_sent = worker->run(g_end, g_leave);
  client.close(g_end ? 5 : 30);  // SIGTERM: the hub may be gone too (the launcher died)
  log::info("{}: {} groups sent{}", who, groups_sent, g_leave ? "; leaving (rlx scale)" : g_end ? "; stopped (SIGTERM)" : "");
  return 0;
}

}  // namespace rlx::launch
