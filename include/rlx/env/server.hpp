// Environment servers: environment code in its own (sandboxed) process, called by rollout
// workers over the bus transport (ZeroMQ, framed and checksummed bus messages).
//
//   server process:   rlx env serve --address ipc:///run/rlx/env-0.sock --tokenizer tok.json
//                     (EnvServer below; one ROUTER socket, many episodes)
//   supervisor:       EnvServerProcess starts it — inside `rlx sandbox run` when asked —
//                     and restarts it when it dies (bounded)
//   worker side:      RemoteEnv, an Env whose calls go to the server with a timeout; a call
//                     that times out restarts a dead server, reloads the episode from the
//                     state the last reply carried, and retries. The server answers a
//                     repeated (episode, turn) from its cache, so a step is applied once.
//                     When retries run out the call throws env::InfraError: the lease is
//                     retried elsewhere, never scored 0.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rlx/env/env.hpp"
#include "rlx/env/sandbox.hpp"

namespace rlx::env {

struct EnvServerOptions {
  std::string address;          // ipc://PATH or tcp://HOST:PORT
  uint32_t max_episodes = 1024;  // open episodes at once (a reset beyond it is refused)
  uint64_t max_frame_mb = 64;
};

// Serves `registry`'s environments until `stop` (or SIGTERM in `rlx env serve`).
void serve_envs(const EnvServerOptions& options, const Registry& registry, const Context& context,
                const std::atomic<bool>& stop);

// Starts and restarts a server process: `argv` (for example {rlx, "env", "serve", ...}),
// wrapped in `rlx sandbox run` with `sandbox` limits when `sandboxed`. Its output passes
// through to this process's stderr; the last lines are kept to say why it ended.
class EnvServerProcess {
 public:
  struct Options {
    std::vector<std::string> argv;  // the server command
    std::string rlx = "rlx";        // the rlx binary (for `rlx sandbox run`)
    bool sandboxed = true;
    SandboxOptions sandbox;         // limits of the server's sandbox (wall_s: its whole life)
    std::vector<std::string> writable;  // host paths writable inside (the ipc socket's directory)
    std::vector<std::string> env;       // NAME=VALUE for the server inside its sandbox
    uint64_t library_mb = 0;            // address space its libraries map, on top of sandbox.limits.memory_mb
    uint32_t max_restarts = 5;
    // Ends in a row before its first answer (a server that cannot start) that make
    // ensure_running() throw FatalError: the run cannot work, restarting will not help.
    uint32_t max_failed_starts = 2;
    bool pass_output = true;  // the server's output to this process's stderr (else only kept)
  };
  explicit EnvServerProcess(Options options);
  ~EnvServerProcess();  // SIGTERM, then SIGKILL
  EnvServerProcess(const EnvServerProcess&) = delete;
  EnvServerProcess& operator=(const EnvServerProcess&) = delete;
  // Restarts the server if it has exited; true if it had. Throws FatalError when it ended
  // max_failed_starts times in a row before answering (with its last output: the sandbox's
  // own message, the path, the limit), rlx::Error after max_restarts restarts.
  bool ensure_running();
  // The server answered a call: it started (RemoteEnv says so).
  void answered() { answered_ = true; }
  pid_t pid() const { return pid_; }
  uint32_t restarts() const { return restarts_; }

  // Runs `options.argv` once to its end, as start() would (sandboxed), for a trial: "" when
  // it exited 0 within timeout_s, else why, with its last output.
  static std::string trial(Options options, double timeout_s);

 private:
  struct Output;
  void start();
  std::string describe_end(int status) const;
  Options o_;
  pid_t pid_ = -1;
  uint32_t restarts_ = 0, failed_starts_ = 0;
  bool answered_ = false;
  std::shared_ptr<Output> output_;
};

struct RemoteEnvOptions {
  std::string address;
  std::string env;            // environment name on the server
  double timeout_s = 10;      // per call
  uint32_t retries = 3;       // per call, after the first try
  EnvServerProcess* server = nullptr;  // restarted on a timeout when given
  // Asked every 200 ms while a call waits: true ends the call at once (InfraError) — the
  // worker is stopping, the lease goes back.
  std::function<bool()> cancel;
  // Asked every 200 ms too: true ends a call that is retrying, or that has waited
  // leave_after_s on its try (InfraError) — the worker is leaving (`rlx scale` down); the
  // calls of a server that answers still finish.
  std::function<bool()> leave;
  double leave_after_s = 2;
};

class RemoteEnv final : public Env {
 public:
  explicit RemoteEnv(RemoteEnvOptions options);
  ~RemoteEnv() override;  // closes the episode on the server (waits briefly) unless close_all did
  std::vector<TokenId> reset(const nlohmann::json& task) override;
  StepResult step(std::span<const TokenId> action) override;
  std::string save_state() const override;
  void load_state(std::string_view state) override;
  uint64_t recoveries() const;  // calls that needed a server restart or a reload

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  friend struct Pipeline;
};

// One call per episode for many episodes at once (a grant's samples): every RemoteEnv's
// request is sent first, then the answers are gathered, so the lot costs about one round
// trip plus the server's work instead of a round trip each. Each episode keeps its own
// retries and recovery (a missing answer falls back to its plain call; the server answers
// a repeated turn from its cache), and its timeout counts from the previous answer, so a
// server working through a long queue is not taken for a dead one. Other Envs are called
// in turn. Each outcome holds the call's result or what it threw; once a call to a server
// ends in InfraError (its retries spent, cancelled, the worker leaving), that server's other
// calls in the batch end with it at once, and a FatalError (a server that cannot start) is
// thrown.
template <class T>
struct Outcome {
  T value{};
  std::exception_ptr error;  // set: the call threw this (InfraError, Error, ...)
};
std::vector<Outcome<std::vector<TokenId>>> reset_all(std::span<Env* const> envs,
                                                     std::span<const nlohmann::json* const> tasks);
std::vector<Outcome<StepResult>> step_all(std::span<Env* const> envs, std::span<const std::vector<TokenId>> actions);
// Closes RemoteEnvs' episodes together (their destructors then do not call the server).
void close_all(std::span<Env* const> envs);

}  // namespace rlx::env
