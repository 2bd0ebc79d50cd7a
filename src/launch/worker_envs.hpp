// What a rollout worker of a run is built from, shared by the worker role (worker_role.cpp)
// and a colocated learner (colocated.cpp): its environments, its engine's settings, its
// options (internal).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rlx/env/env.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/env/server.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/launch/rollout_config.hpp"
#include "rlx/rollout/engine.hpp"
#include "rlx/rl/worker.hpp"

namespace rlx::launch {

// A worker's environments: in-process, or behind sandboxed env servers (env.servers).
// `cancel` ends an env call at once (the worker stops); `leave` ends one that retries (the
// worker leaves: its leases go back to the hub).
class WorkerEnvs {
 public:
  WorkerEnvs(const RoleContext& ctx, std::shared_ptr<const Tokenizer> tok, std::function<bool()> cancel,
             std::function<bool()> leave);
  // For the worker: make() per sample, and the sampler's stop sequences, asked of an
  // in-process instance (a server's RemoteEnv does not carry them).
  rl::EnvSource source();
  std::unique_ptr<env::Env> make();

 private:
  const RoleContext& ctx_;
  std::shared_ptr<const Tokenizer> tok_;
  std::function<bool()> cancel_, leave_;
  env::Context context_;
  std::unique_ptr<env::Sandbox> sandbox_;
  std::vector<std::unique_ptr<env::EnvServerProcess>> servers_;
  std::vector<std::string> addresses_;
  size_t next_ = 0;
};

// A worker's options in this run; the caller adds status, statistics and its device turns.
// With reward_model.path, loads the reward model (its vocabulary must be `vocab_size`, the policy's).
rl::WorkerOptions worker_options(const RoleContext& ctx, const std::string& who, int64_t vocab_size);

}  // namespace rlx::launch
