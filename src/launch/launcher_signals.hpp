// The launcher's signals (internal): the handlers only record what came; the watch loops
// (launcher.cpp, task_runner.cpp) take it from here.
#pragma once

namespace rlx::launch {

// SIGINT/SIGTERM: the run stops (the learner checkpoints first).
void watch_stop_signals();
// SIGHUP: the config is read again (launcher.cpp reload_config).
void watch_reload_signal();
// Roles inherit SIGUSR1 blocked: a worker asked to leave while it is still starting gets
// the signal once it installed its handler (run_worker unblocks it), instead of dying.
void block_leave_signal();
// The stop signal that came since the last call, else 0.
int take_stop_signal();
// Whether SIGHUP came since the last call.
bool take_reload_signal();

}  // namespace rlx::launch
