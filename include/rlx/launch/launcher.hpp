// The launcher of `rlx run CONFIG`: it writes the run directory (config.yaml, logs/), starts
// the roles (roles.hpp) as processes of one binary, and watches them: when the learner
// finishes, the others are stopped; a dead worker is restarted, a dead hub or learner rank
// restarts the run from its last checkpoint; past its restarts the run stops and the error
// names the role, its index and how it ended.
//
//   rlx::RunConfig cfg = rlx::config::load_file<rlx::RunConfig>("grpo.yaml", overrides);
//   return rlx::launch::launch(cfg, "/proc/self/exe");
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "rlx/launch/config.hpp"

namespace rlx::launch {

struct LaunchOptions {
  bool resume = false;  // continue the run directory from its newest checkpoint
  bool force = false;   // start over in a run directory that holds a run
  // SIGHUP to the launcher reads the config again through this (the file and the command
  // line's overrides, validated): a changed rollout.workers scales the workers as `rlx
  // scale` does; other changed keys are named and left as they are (they need a restart,
  // --resume). A config that no longer loads is reported and the run goes on unchanged.
  std::function<RunConfig()> reload;
};

// `rlx run`: the run directory, the roles as processes of `exe`, and their watch.
// Returns the exit code (128 + signal when SIGINT/SIGTERM stopped it after a checkpoint).
int launch(const RunConfig& cfg, const std::string& exe, const LaunchOptions& options = {});

// `rlx scale RUN_DIR N`: asks the running launcher of RUN_DIR for N rollout workers. New
// workers join at once (they catch up to the current weights); surplus ones finish and
// send the leases they hold, then exit. Nothing is lost or repeated either way.
void scale(const std::filesystem::path& run_dir, uint32_t workers);

}  // namespace rlx::launch
