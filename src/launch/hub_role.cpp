// The hub role: prompts (the dataset, or tasks the environment generates), leases, the
// replay buffer, trajectories.h5, served until SIGTERM.
#include <signal.h>

#include <map>

#include "role_common.hpp"
#include "rlx/bus/hub.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/status.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/launch/roles.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bus::HubOptions hub_options(const RoleContext& ctx) {
  auto o = ctx.cfg.hub;
  o.address = ctx.tcp ? "tcp://0.0.0.0:0" : ctx.hub_address();
  // Leases run at most max_staleness versions ahead of the learner; synchronous mode is
  // on-policy: every group of step k is sampled by version k - 1.
  if (o.groups_per_version == 0) o.groups_per_version = ctx.cfg.train.groups_per_step;
  if (ctx.cfg.train.mode == TrainMode::sync) o.replay.max_staleness = 0;
  if (o.trajectory_file.empty()) o.trajectory_file = ctx.run_dir.trajectories().string();
  if (o.state_file.empty()) o.state_file = ctx.run_dir.hub_state().string();
  return o;
}

}  // namespace

int run_hub(const RoleContext& ctx) {
  set_compute_threads(1);
  auto o = hub_options(ctx);
  if (!ctx.tcp) fs::create_directories(ctx.run_dir.socket_dir());  // /tmp/rlx-NAME-HASH for a deep run directory
  std::unique_ptr<bus::Hub> hub;
  if (!o.dataset.empty()) {
    hub = std::make_unique<bus::Hub>(o);
  } else {  // tasks from the environment's own generator
    env::register_bundled();
    std::vector<std::string> records;
    const auto options = ctx.cfg.env.options_json();
    for (uint64_t i = 0; i < ctx.cfg.train.generated_tasks; ++i)
      records.push_back(env::Registry::global().generate(ctx.cfg.env.name, ctx.cfg.run.seed, i, options).dump());
    hub = std::make_unique<bus::Hub>(o, std::move(records));
  }
  // SIGTERM (from the launcher, after the learner's last checkpoint) saves and stops; a
  // terminal's SIGINT is the launcher's to handle.
  install_stop_handler();
  ::signal(SIGINT, SIG_IGN);
  if (ctx.tcp) {  // peers on any host find it by the run directory's hub.endpoint
    const auto bound = hub->endpoint();
    write_file_atomic(ctx.run_dir.hub_endpoint(),
                      fmt::format("tcp://{}:{}\n", dist::host_name(), bound.substr(bound.rfind(':') + 1)));
  }
  log::info("hub: serving {} ({} groups of {} per step)", hub->endpoint(), ctx.cfg.train.groups_per_step,
            o.group_size);
  status::set(fmt::format("serving {}", hub->endpoint()));
  status::ready();
  hub->run(g_stop);
  std::map<std::string, double> st;
  for (const auto& [k, v] : hub->stats()) st[k] = v;
  log::info("hub: stopped; {:.0f} groups accepted, {:.0f} leases outstanding; state saved",
            st["accepted_total"], st["leases_outstanding"]);
  return 0;
}

}  // namespace rlx::launch
