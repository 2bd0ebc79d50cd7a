#include "rlx/env/server.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "../bus/transport.hpp"
#include "rlx/bus/message.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"

namespace rlx::env {

using bus::EnvReply;
using bus::EnvRequest;

// --- the server ------------------------------------------------------------------------

void serve_envs(const EnvServerOptions& o, const Registry& registry, const Context& context, const std::atomic<bool>& stop) {
  RLX_CHECK(!o.address.empty(), "env server: an address is required");
  const bus::Limits limits{.max_frame_bytes = o.max_frame_mb << 20};
  zmq::socket_t router(bus::detail::shared_context(), zmq::socket_type::router);
  bus::detail::configure_socket(router, limits, 1000);
  router.set(zmq::sockopt::router_mandatory, 1);
  try {
    router.bind(o.address);
  } catch (const zmq::error_t& e) {
    throw Error(fmt::format("env server: cannot bind {}: {}", o.address, e.what()));
  }
  struct Open {
    std::unique_ptr<Env> env;
    uint64_t turn = 0;
    std::string op, reply;  // the last answered call, for repeats
  };
  std::map<uint64_t, Open> episodes;
  uint64_t rejected = 0;
  log::info("env server: serving {} environments on {}", registry.list().size(), o.address);
  while (!stop) {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    bus::detail::poll(&item, 1, std::chrono::milliseconds(100));
    zmq::message_t route, body;
    while (router.recv(route, zmq::recv_flags::dontwait)) {
      if (!route.more()) continue;
      (void)router.recv(body, zmq::recv_flags::none);
      if (body.more()) {
        while (body.more()) (void)router.recv(body, zmq::recv_flags::none);
        continue;
      }
      EnvRequest req;
      bus::Frame frame;
      try {
        frame = bus::decode_frame(std::string_view(static_cast<const char*>(body.data()), body.size()), limits);
        req = bus::unpack<EnvRequest>(frame, limits);
      } catch (const bus::FrameError& e) {
        if (++rejected <= 20) log::warn("env server: rejected a frame ({}): {}", bus::to_string(e.reason()), e.what());
        continue;
      }
      auto answer = [&](const std::string& packed) {
        bus::detail::try_send_to(router, route.to_string(), packed);
      };
      auto it = episodes.find(req.episode);
      if (it != episodes.end() && it->second.turn == req.turn && it->second.op == req.op && !it->second.reply.empty()) {
        answer(it->second.reply);  // a retry: the same answer, nothing applied twice
        continue;
      }
      EnvReply rep{.episode = req.episode, .turn = req.turn};
      try {
        if (req.op == "reset" || req.op == "load") {
          if (it == episodes.end()) {
            RLX_CHECK(episodes.size() < o.max_episodes, "env server: {} episodes are open (max_episodes)", episodes.size());
            it = episodes.emplace(req.episode, Open{}).first;
          }
          it->second.env = registry.make(req.env, context);
          if (req.op == "reset") {
            nlohmann::json task;
            try {
              task = nlohmann::json::parse(req.payload);
            } catch (const nlohmann::json::exception& e) {
              throw Error(fmt::format("the task is not JSON: {}", e.what()));
            }
            rep.observation = it->second.env->reset(task);
          } else {
            it->second.env->load_state(req.payload);
          }
        } else if (req.op == "step") {
          // Not the task's fault: this server never opened the episode, or lost it when it was
          // restarted. Infra, so the lease is retried rather than ended as bad data.
          if (it == episodes.end() || !it->second.env)
            throw InfraError(fmt::format("episode {:x} is not open on this server (restarted since its reset?)", req.episode));
          if (req.turn != it->second.turn + 1)
            throw InfraError(fmt::format("episode {:x}: turn {} after turn {}", req.episode, req.turn, it->second.turn));
          StepResult r = it->second.env->step(req.action);
          rep.observation = std::move(r.observation);
          rep.reward = r.reward;
          rep.done = r.done;
          rep.info = r.info.dump();
        } else if (req.op == "close") {
          if (it != episodes.end()) episodes.erase(it);
          answer(bus::pack(rep, frame.seq));
          continue;
        } else {
          throw Error(fmt::format("unknown op '{}'", req.op));
        }
        rep.state = it->second.env->save_state();
      } catch (const InfraError& e) {
        rep.error = e.what();
        rep.error_kind = "infra";
      } catch (const std::exception& e) {
        rep.error = e.what();
        rep.error_kind = "data";
      }
      std::string packed = bus::pack(rep, frame.seq);
      if (it != episodes.end() && rep.error.empty()) {
        it->second.turn = req.turn;
        it->second.op = req.op;
        it->second.reply = packed;
      }
      answer(packed);
    }
  }
}

// --- the supervisor ----------------------------------------------------------------------

EnvServerProcess::EnvServerProcess(Options options) : o_(std::move(options)) {
  RLX_CHECK(!o_.argv.empty(), "env server process: a command is required");
  start();
}

EnvServerProcess::~EnvServerProcess() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 50; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

void EnvServerProcess::start() {
  std::vector<std::string> argv;
  if (o_.sandboxed) {
    const auto& L = o_.sandbox.limits;
    argv = {o_.rlx, "sandbox", "run", "--stream", "--wall-s", fmt::format("{}", L.wall_s), "--cpu-s", fmt::format("{}", L.cpu_s),
            "--memory-mb", std::to_string(L.memory_mb), "--processes", std::to_string(L.processes),
            "--open-files", std::to_string(L.open_files), "--scratch-mb", std::to_string(L.scratch_mb)};
    for (const auto& p : o_.sandbox.readonly_paths) argv.insert(argv.end(), {"--ro", p});
    for (const auto& p : o_.writable) argv.insert(argv.end(), {"--rw", p});
    argv.push_back("--");
  }
  argv.insert(argv.end(), o_.argv.begin(), o_.argv.end());
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  RLX_CHECK(pid >= 0, "env server: fork: {}", std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the server dies with its supervisor
    if (::getppid() != parent) ::_exit(127);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  pid_ = pid;
}

bool EnvServerProcess::ensure_running() {
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  RLX_CHECK(restarts_ < o_.max_restarts, "env server `{}` died {} times (last: {}); giving up", o_.argv.front(),
            restarts_ + 1,
            WIFSIGNALED(status) ? fmt::format("signal {}", WTERMSIG(status)) : fmt::format("exit {}", WEXITSTATUS(status)));
  ++restarts_;
  log::warn("env server `{}` (pid {}) ended ({}); restart {} of {}", o_.argv.front(), pid_,
            WIFSIGNALED(status) ? fmt::format("signal {}", WTERMSIG(status)) : fmt::format("exit {}", WEXITSTATUS(status)),
            restarts_, o_.max_restarts);
  start();
  return true;
}

// --- the client ----------------------------------------------------------------------------

struct RemoteEnv::Impl {
  RemoteEnvOptions o;
  bus::Limits limits;
  zmq::socket_t dealer;
  uint64_t episode, turn = 0;
  bool started = false;
  std::string state;
  uint64_t recoveries = 0;

  explicit Impl(RemoteEnvOptions options) : o(std::move(options)) {
    RLX_CHECK(!o.address.empty() && !o.env.empty(), "remote env: an address and an environment name are required");
    std::random_device rd;
    episode = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    connect();
  }

  void connect() {
    dealer = zmq::socket_t(bus::detail::shared_context(), zmq::socket_type::dealer);
    bus::detail::configure_socket(dealer, limits, 100);
    dealer.connect(o.address);
  }

  // One try: the reply to `req`, or nothing within the timeout.
  std::optional<EnvReply> try_call(const EnvRequest& req) {
    const std::string frame = bus::pack(req, req.turn);
    if (!bus::detail::try_send(dealer, frame)) return std::nullopt;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
      bus::detail::poll(&item, 1, std::min(left, std::chrono::milliseconds(o.server ? 200 : left.count())));
      // A supervised server that died is restarted now rather than at the end of the timeout.
      if (o.server && o.server->ensure_running()) return std::nullopt;
      zmq::message_t msg;
      while (dealer.recv(msg, zmq::recv_flags::dontwait)) {
        try {
          const auto f = bus::decode_frame(std::string_view(static_cast<const char*>(msg.data()), msg.size()), limits);
          auto rep = bus::unpack<EnvReply>(f, limits);
          if (rep.episode == req.episode && rep.turn == req.turn) return rep;  // else: a late answer to an old try
        } catch (const bus::FrameError& e) {
          log::warn("remote env: rejected a frame from {}: {}", o.address, e.what());
        }
      }
    }
  }

  EnvReply call(EnvRequest req) {
    req.episode = episode;
    req.env = o.env;
    for (uint32_t attempt = 0;; ++attempt) {
      if (auto rep = try_call(req)) {
        if (rep->error_kind == "data") throw Error(fmt::format("environment {} at {}: {}", o.env, o.address, rep->error));
        if (rep->error.empty()) return *rep;
        // An infra answer (the server does not have the episode: another client restarted
        // it since this episode's reset) is recovered like no answer, within the retries.
        if (attempt >= o.retries) throw InfraError(fmt::format("environment {} at {}: {}", o.env, o.address, rep->error));
        log::warn("remote env: {} at {}: {}; putting the episode back", o.env, o.address, rep->error);
      } else if (attempt >= o.retries) {
        throw InfraError(fmt::format("environment {} at {}: no answer to {} (turn {}) after {} tries of {} s", o.env,
                                     o.address, req.op, req.turn, attempt + 1, o.timeout_s));
      }
      // Recover: restart a dead server, reconnect, and put the episode back where the last
      // answer left it (a restarted server has lost it; a live one gets the same state).
      ++recoveries;
      if (o.server) (void)o.server->ensure_running();
      connect();
      if (started && req.op == "step") {
        EnvRequest load{.episode = episode, .turn = turn, .op = "load", .env = o.env, .payload = state};
        if (!try_call(load)) continue;  // counts as this attempt
      }
    }
  }
};

RemoteEnv::RemoteEnv(RemoteEnvOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

RemoteEnv::~RemoteEnv() {
  try {
    if (impl_->started) (void)impl_->try_call({.episode = impl_->episode, .turn = impl_->turn + 1, .op = "close"});
  } catch (...) {
  }
}

std::vector<TokenId> RemoteEnv::reset(const nlohmann::json& task) {
  auto& I = *impl_;
  I.turn = 0;
  auto rep = I.call({.turn = 0, .op = "reset", .payload = task.dump()});
  I.state = std::move(rep.state);
  I.started = true;
  return rep.observation;
}

StepResult RemoteEnv::step(std::span<const TokenId> action) {
  auto& I = *impl_;
  RLX_CHECK(I.started, "remote env: step() before reset()");
  auto rep = I.call({.turn = I.turn + 1, .op = "step", .action = std::vector<int32_t>(action.begin(), action.end())});
  ++I.turn;
  I.state = std::move(rep.state);
  StepResult r{.observation = std::move(rep.observation), .reward = rep.reward, .done = rep.done};
  if (!rep.info.empty()) r.info = nlohmann::json::parse(rep.info, nullptr, /*allow_exceptions=*/false);
  return r;
}

std::string RemoteEnv::save_state() const { return impl_->state; }

void RemoteEnv::load_state(std::string_view state) {
  auto& I = *impl_;
  auto rep = I.call({.turn = I.turn, .op = "load", .payload = std::string(state)});
  I.state = std::move(rep.state);
  I.started = true;
}

uint64_t RemoteEnv::recoveries() const { return impl_->recoveries; }

}  // namespace rlx::env
