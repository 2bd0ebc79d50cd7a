// The start of every role's process (`rlx role NAME ...`, what `rlx run` starts), written
// once for the three: it dies with its launcher, takes its context, beats, traces, and
// turns a FatalError into "cannot run" for the supervisor.
#include <signal.h>
#include <sys/prctl.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "role_common.hpp"
#include "rlx/bus/hub.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/launch/roles.hpp"

namespace rlx::launch {

int run_role(const RoleArgs& a) {
  // A role dies with its launcher (SIGTERM: the learner checkpoints, the hub saves).
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // A peer that dies mid-write (a learner rank killed in a collective) is an EPIPE for the
  // caller to report and recover from, not a SIGPIPE that kills this process too: gloo's
  // TCP pairs write without MSG_NOSIGNAL (Python ignores SIGPIPE at start; a C++ main must).
  ::signal(SIGPIPE, SIG_IGN);
  bus::keep_frame_memory();  // before any thread starts: M_ARENA_MAX binds only threads yet to allocate
  if (launcher_gone()) return 1;  // it died before the line above took effect
  RoleContext ctx{.cfg = config::load_file<RunConfig>(a.config), .run_dir = RunDir(a.run_dir), .weights = a.weights, .exe = a.exe};
  ctx.index = a.role == "learner" && std::getenv("RLX_RANK") ? std::atoi(std::getenv("RLX_RANK")) : a.index;
  ctx.tcp = a.transport == "tcp";
  // Fault injection for tests: RLX_FAULT=slow-start:ROLE:SECONDS makes the first start of
  // ROLE (index 0) in a run directory take SECONDS longer before its first heartbeat.
  if (auto f = fault::fires(fault::Point::slow_start,
                            {.rank = ctx.index, .role = a.role, .once_file = ctx.run_dir.fault_marker()}))
    std::this_thread::sleep_for(std::chrono::duration<double>(f->seconds));
  const Role role = parse_role(a.role).value();  // the option's check lets only the three through
  start_heartbeat(ctx.run_dir, role, ctx.index);
  start_trace(ctx, role);
  try {
    if (role == Role::hub) return run_hub(ctx);
    if (role == Role::learner) return run_learner(ctx);
    return run_worker(ctx);
  } catch (const FatalError& e) {
    // Not for a restart: the launcher stops the run with this message.
    std::cerr << fmt::format("rlx role {} {}: cannot run: {}", a.role, ctx.index, e.what()) << std::endl;
    const auto file = ctx.run_dir.failure(role, ctx.index);
    std::filesystem::create_directories(file.parent_path());
    write_file_atomic(file, std::string(e.what()) + "\n");
    return kExitCannotRun;
  }
}

}  // namespace rlx::launch
