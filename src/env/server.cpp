#include "rlx/env/server.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "../bus/transport.hpp"
#include "rlx/bus/message.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/status.hpp"

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
  const bus::detail::IpcFile ipc_file(router.get(zmq::sockopt::last_endpoint));  // removed at the end
  struct Open {
    std::unique_ptr<Env> env;
    uint64_t turn = 0;
    bus::EnvOp op = bus::EnvOp::reset;  // the last answered call, for repeats
    std::string reply;
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
        // A peer of another protocol version is told so (in this version: it logs the
        // refusal, naming both), rather than left to time out.
        if (e.reason() == bus::Reject::bad_version)
          bus::detail::try_send_to(
              router, route.to_string(),
              bus::pack(EnvReply{.error = fmt::format("env server: refused: {}", e.what()), .error_kind = "data"}));
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
        if (req.op == bus::EnvOp::reset || req.op == bus::EnvOp::load) {
          if (it == episodes.end()) {
            RLX_CHECK(episodes.size() < o.max_episodes, "env server: {} episodes are open (max_episodes)", episodes.size());
            it = episodes.emplace(req.episode, Open{}).first;
          }
          it->second.env = registry.make(req.env, context);
          if (req.op == bus::EnvOp::reset) {
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
        } else if (req.op == bus::EnvOp::step) {
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
        } else {  // close
          if (it != episodes.end()) episodes.erase(it);
          answer(bus::pack(rep, frame.seq));
          continue;
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

// The server's output: passed through to this process's stderr by a reader thread, the
// last bytes kept (one per start: a restarted server's output is its own).
struct EnvServerProcess::Output {
  static constexpr size_t kKeep = 4096;
  std::mutex m;
  std::condition_variable cv;
  std::string tail;
  bool closed = false;  // every writer is gone (the server and what it started)

  // Reads `fd` to its end on a thread of its own.
  static std::shared_ptr<Output> follow(int fd, bool pass) {
    auto out = std::make_shared<Output>();
    std::thread([out, fd, pass] {
      char buf[4096];
      for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (pass) (void)!::write(2, buf, static_cast<size_t>(n));
        std::lock_guard lock(out->m);
        out->tail.append(buf, static_cast<size_t>(n));
        if (out->tail.size() > 2 * kKeep) out->tail.erase(0, out->tail.size() - kKeep);
      }
      ::close(fd);
      std::lock_guard lock(out->m);
      out->closed = true;
      out->cv.notify_all();
    }).detach();
    return out;
  }

  // The last few non-empty lines, after waiting (bounded) for the output to end.
  std::string last_lines(double wait_s) {
    std::unique_lock lock(m);
    cv.wait_for(lock, std::chrono::duration<double>(wait_s), [&] { return closed; });
    std::vector<std::string> lines;
    std::string line;
    for (char c : tail + "\n") {
      if (c != '\n') {
        line += c;
        continue;
      }
      if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
      line.clear();
    }
    std::string text;
    for (size_t i = lines.size() > 3 ? lines.size() - 3 : 0; i < lines.size(); ++i) text += (text.empty() ? "" : " | ") + lines[i];
    if (text.size() > 1024) text = "..." + text.substr(text.size() - 1024);
    return text;
  }
};

EnvServerProcess::EnvServerProcess(Options options) : o_(std::move(options)) {
  RLX_CHECK(!o_.argv.empty(), "env server process: a command is required");
  RLX_CHECK(o_.max_failed_starts >= 1, "env server process: max_failed_starts must be at least 1");
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
    argv = {o_.rlx,         "sandbox",
            "run",          "--stream",
            "--wall-s",     fmt::format("{}", L.wall_s),
            "--cpu-s",      fmt::format("{}", L.cpu_s),
            "--memory-mb",  std::to_string(L.memory_mb + o_.library_mb),
            "--processes",  std::to_string(L.processes),
            "--open-files", std::to_string(L.open_files),
            "--scratch-mb", std::to_string(L.scratch_mb)};
    for (const auto& p : o_.sandbox.readonly_paths) argv.insert(argv.end(), {"--ro", p});
    for (const auto& p : o_.writable) argv.insert(argv.end(), {"--rw", p});
    for (const auto& e : o_.env) argv.insert(argv.end(), {"--env", e});
    argv.push_back("--");
  }
  argv.insert(argv.end(), o_.argv.begin(), o_.argv.end());
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  int out[2];
  RLX_CHECK(::pipe2(out, O_CLOEXEC) == 0, "env server: pipe: {}", std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(out[0]), ::close(out[1]);
    throw Error(fmt::format("env server: fork: {}", std::strerror(e)));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the server dies with its supervisor
    if (::getppid() != parent) ::_exit(127);
    if (::dup2(out[1], 1) < 0 || ::dup2(out[1], 2) < 0) ::_exit(127);
    ::signal(SIGPIPE, SIG_DFL);  // the worker ignores it; the server's program should not inherit that
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  pid_ = pid;
  answered_ = false;
  output_ = Output::follow(out[0], o_.pass_output);
}

std::string EnvServerProcess::describe_end(int status) const {
  const auto how = WIFSIGNALED(status) ? fmt::format("signal {}", WTERMSIG(status)) : fmt::format("exit {}", WEXITSTATUS(status));
  const auto said = output_ ? output_->last_lines(1.0) : std::string();
  const auto& L = o_.sandbox.limits;
  const auto libraries = o_.library_mb ? fmt::format(" (+ {} MiB its libraries map)", o_.library_mb) : std::string();
  const auto limits = o_.sandboxed
                          ? fmt::format(" [its sandbox: memory_mb {}{}, processes {}, open_files {}, scratch_mb {}]",
                                        L.memory_mb, libraries, L.processes, L.open_files, L.scratch_mb)
                          : "";
  return said.empty() ? how + limits : fmt::format("{}; its last output: {}{}", how, said, limits);
}

bool EnvServerProcess::ensure_running() {
  int status = 0;
  if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  const pid_t ended = pid_;
  pid_ = -1;
  failed_starts_ = answered_ ? 0 : failed_starts_ + 1;
  if (failed_starts_ >= o_.max_failed_starts)
    throw FatalError(fmt::format("env server `{}` cannot start: it ended {} time{} in a row before answering a call ({})",
                                 o_.argv.front(), failed_starts_, failed_starts_ > 1 ? "s" : "", describe_end(status)));
  const auto how = WIFSIGNALED(status) ? fmt::format("signal {}", WTERMSIG(status)) : fmt::format("exit {}", WEXITSTATUS(status));
  RLX_CHECK(restarts_ < o_.max_restarts, "env server `{}` died {} times (last: {}); giving up", o_.argv.front(),
            restarts_ + 1, describe_end(status));
  ++restarts_;
  log::warn("env server `{}` (pid {}) ended ({}); restart {} of {}", o_.argv.front(), ended, how, restarts_, o_.max_restarts);
  start();
  return true;
}

std::string EnvServerProcess::trial(Options options, double timeout_s) {
  options.pass_output = false;
  EnvServerProcess p(std::move(options));
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (::waitpid(p.pid_, &status, WNOHANG) != p.pid_) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(p.pid_, SIGKILL);
      ::waitpid(p.pid_, nullptr, 0);
      p.pid_ = -1;
      const auto said = p.output_->last_lines(1.0);
      return fmt::format("it did not finish within {} s{}", timeout_s, said.empty() ? "" : "; its last output: " + said);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  p.pid_ = -1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : p.describe_end(status);
}

// --- the client ----------------------------------------------------------------------------

namespace {
// Connected DEALER sockets to env servers, kept when an episode ends and handed to the next
// episode (a connection costs a handshake, and a grant starts many episodes at once). A
// late answer meant for an earlier episode is dropped by the (episode, turn) match.
class SocketPool {
 public:
  static SocketPool& get() {
    (void)bus::detail::shared_context();  // constructed first: the context outlives the sockets
    static SocketPool pool;
    return pool;
  }
  std::optional<zmq::socket_t> take(const std::string& address) {
    std::lock_guard lock(mu_);
    auto it = kept_.find(address);
    if (it == kept_.end() || it->second.empty()) return std::nullopt;
    auto s = std::move(it->second.back());
    it->second.pop_back();
    return s;
  }
  void give(const std::string& address, zmq::socket_t socket) {
    std::lock_guard lock(mu_);
    auto& kept = kept_[address];
    if (kept.size() < kMaxPerAddress) kept.push_back(std::move(socket));
  }

 private:
  static constexpr size_t kMaxPerAddress = 4096;
  std::mutex mu_;
  std::map<std::string, std::vector<zmq::socket_t>> kept_;
};
}  // namespace

struct RemoteEnv::Impl {
  RemoteEnvOptions o;
  bus::Limits limits;
  zmq::socket_t dealer;
  uint64_t episode, turn = 0;
  bool started = false, closed = false;
  bool reusable = true;  // every call so far was answered: the socket may serve another episode
  std::string state;
  uint64_t recoveries = 0;

  explicit Impl(RemoteEnvOptions options) : o(std::move(options)) {
    RLX_CHECK(!o.address.empty() && !o.env.empty(), "remote env: an address and an environment name are required");
    std::random_device rd;
    episode = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (auto kept = SocketPool::get().take(o.address)) {
      dealer = std::move(*kept);
      return;
    }
    connect();
  }

  // A fresh connection (a new episode, or after a call went unanswered).
  void connect() {
    reusable = true;
    dealer = zmq::socket_t(bus::detail::shared_context(), zmq::socket_type::dealer);
    bus::detail::configure_socket(dealer, limits, 100);
    dealer.connect(o.address);
  }

  // One try: the reply to `req`, or nothing within the timeout (env.timeout_s, or `timeout_s`).
  std::optional<EnvReply> try_call(const EnvRequest& req, bool retrying, double timeout_s = -1) {
    const auto started = std::chrono::steady_clock::now();
    check_cancel();
    if (!send(req)) return std::nullopt;
    return await(req, retrying, started, started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(timeout_s >= 0 ? timeout_s : o.timeout_s)));
  }

  // The request's frame, without waiting for the answer; false if the socket would not take it.
  bool send(const EnvRequest& req) { return bus::detail::try_send(dealer, bus::pack(req, req.turn)); }

  // The answer to `req` if it comes before `deadline`. Cancelling, leaving and a server that
  // died end the wait as they end a call.
  std::optional<EnvReply> await(const EnvRequest& req, bool retrying, std::chrono::steady_clock::time_point started,
                                std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        reusable = false;
        return std::nullopt;
      }
      zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
      bus::detail::poll(&item, 1, std::min(left, std::chrono::milliseconds(200)));
      check_cancel();
      if (o.leave && (retrying || std::chrono::steady_clock::now() - started > std::chrono::duration<double>(o.leave_after_s)) &&
          o.leave())
        throw InfraError(fmt::format("environment {} at {}: the call was given up (the worker is leaving)", o.env, o.address));
      // A supervised server that died is restarted now rather than at the end of the timeout.
      if (o.server && o.server->ensure_running()) return std::nullopt;
      zmq::message_t msg;
      while (dealer.recv(msg, zmq::recv_flags::dontwait)) {
        try {
          const auto f = bus::decode_frame(std::string_view(static_cast<const char*>(msg.data()), msg.size()), limits);
          auto rep = bus::unpack<EnvReply>(f, limits);
          if (o.server) o.server->answered();
          if (rep.episode == req.episode && rep.turn == req.turn) return rep;  // else: a late answer to an old try
        } catch (const bus::FrameError& e) {
          // Another protocol version never answers this one: refused now, not after the retries.
          if (e.reason() == bus::Reject::bad_version)
            throw Error(
                fmt::format("environment {} at {}: refused, the server's answer has {}", o.env, o.address, e.what()));
          log::warn("remote env: rejected a frame from {}: {}", o.address, e.what());
        }
      }
    }
  }

  EnvRequest reset_request(std::string payload) {
    turn = 0;
    return {.episode = episode, .turn = 0, .op = bus::EnvOp::reset, .env = o.env, .payload = std::move(payload)};
  }
  EnvRequest step_request(std::span<const TokenId> action) const {
    RLX_CHECK(started, "remote env: step() before reset()");
    return {.episode = episode,
            .turn = turn + 1,
            .op = bus::EnvOp::step,
            .env = o.env,
            .action = std::vector<int32_t>(action.begin(), action.end())};
  }
  EnvRequest close_request() const { return {.episode = episode, .turn = turn + 1, .op = bus::EnvOp::close}; }
  std::vector<TokenId> apply_reset(EnvReply rep) {
    state = std::move(rep.state);
    started = true;
    closed = false;
    return std::move(rep.observation);
  }
  StepResult apply_step(EnvReply rep) {
    ++turn;
    state = std::move(rep.state);
    StepResult r{.observation = std::move(rep.observation), .reward = rep.reward, .done = rep.done};
    if (!rep.info.empty()) r.info = nlohmann::json::parse(rep.info, nullptr, /*allow_exceptions=*/false);
    return r;
  }

  void check_cancel() const {
    if (o.cancel && o.cancel()) throw InfraError(fmt::format("environment {} at {}: the call was cancelled (stopping)", o.env, o.address));
  }

  EnvReply call(EnvRequest req) {
    req.episode = episode;
    req.env = o.env;
    status::Scope doing(fmt::format("env call '{}' (turn {}) to {}", bus::to_string(req.op), req.turn, o.address));
    for (uint32_t attempt = 0;; ++attempt) {
      if (attempt > 0)
        status::set(fmt::format("env call '{}' (turn {}) to {}: try {} of {} (env.timeout_s {} each)",
                                bus::to_string(req.op), req.turn, o.address, attempt + 1, o.retries + 1, o.timeout_s));
      if (auto rep = try_call(req, attempt > 0)) {
        if (rep->error_kind == "data") throw Error(fmt::format("environment {} at {}: {}", o.env, o.address, rep->error));
        if (rep->error.empty()) return *rep;
        // An infra answer (the server does not have the episode: another client restarted
        // it since this episode's reset) is recovered like no answer, within the retries.
        if (attempt >= o.retries) throw InfraError(fmt::format("environment {} at {}: {}", o.env, o.address, rep->error));
        log::warn("remote env: {} at {}: {}; putting the episode back", o.env, o.address, rep->error);
      } else if (attempt >= o.retries) {
        throw InfraError(fmt::format("environment {} at {}: no answer to {} (turn {}) after {} tries of {} s", o.env,
                                     o.address, bus::to_string(req.op), req.turn, attempt + 1, o.timeout_s));
      }
      // Recover: restart a dead server, reconnect, and put the episode back where the last
      // answer left it (a restarted server has lost it; a live one gets the same state).
      ++recoveries;
      if (o.server) (void)o.server->ensure_running();
      connect();
      if (started && req.op == bus::EnvOp::step) {
        EnvRequest load{.episode = episode, .turn = turn, .op = bus::EnvOp::load, .env = o.env, .payload = state};
        if (!try_call(load, true)) continue;  // counts as this attempt
      }
    }
  }
};

RemoteEnv::RemoteEnv(RemoteEnvOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

// Closing is a courtesy (the server frees the episode's state): it waits briefly, so that a
// worker unwinding a grant of many episodes from a dead server ends in seconds, not env.timeout_s each.
static constexpr double kCloseWaitS = 0.5;

RemoteEnv::~RemoteEnv() {
  try {
    if (impl_->started && !impl_->closed) impl_->closed = impl_->try_call(impl_->close_request(), false, kCloseWaitS).has_value();
    if (impl_->closed && impl_->reusable) SocketPool::get().give(impl_->o.address, std::move(impl_->dealer));
  } catch (...) {
  }
}

std::vector<TokenId> RemoteEnv::reset(const nlohmann::json& task) {
  auto& I = *impl_;
  return I.apply_reset(I.call(I.reset_request(task.dump())));
}

StepResult RemoteEnv::step(std::span<const TokenId> action) {
  auto& I = *impl_;
  return I.apply_step(I.call(I.step_request(action)));
}

// The pipelined calls of reset_all, step_all and close_all.
struct Pipeline {
  using Clock = std::chrono::steady_clock;

  // request(i, impl) builds envs[i]'s request (a RemoteEnv), apply(impl, reply) takes its
  // answer in, plain(i) calls any other Env.
  template <class T, class Request, class Apply, class Plain>
  static std::vector<Outcome<T>> run(std::span<Env* const> envs, const char* op, Request request, Apply apply, Plain plain) {
    std::vector<Outcome<T>> out(envs.size());
    std::vector<EnvRequest> reqs(envs.size());
    std::vector<char> sent(envs.size(), 0);
    // A server whose call failed for want of answers (retries spent, cancelled, leaving): its
    // other episodes in this batch fail with it at once rather than each waiting its timeouts.
    // A FatalError (a server that cannot start) ends the batch: the run cannot go on.
    std::map<std::string, std::exception_ptr> given_up;
    std::set<std::string> troubled;
    auto fail = [&](size_t i, const std::string& address) {
      out[i].error = std::current_exception();
      try {
        throw;
      } catch (const FatalError&) {
        throw;
      } catch (const InfraError&) {
        given_up.try_emplace(address, out[i].error);
      } catch (...) {
      }
    };
    status::Scope doing(fmt::format("env calls '{}' of {} episodes at once", op, envs.size()));
    for (size_t i = 0; i < envs.size(); ++i) {
      auto* remote = dynamic_cast<RemoteEnv*>(envs[i]);
      if (!remote) continue;
      auto& I = *remote->impl_;
      try {
        I.check_cancel();
        reqs[i] = request(i, I);
        reqs[i].episode = I.episode;
        reqs[i].env = I.o.env;
        sent[i] = I.send(reqs[i]);
      } catch (...) {
        fail(i, I.o.address);
      }
    }
    auto since = Clock::now();  // each wait counts from the answer before it
    for (size_t i = 0; i < envs.size(); ++i) {
      if (out[i].error) continue;
      auto* remote = dynamic_cast<RemoteEnv*>(envs[i]);
      if (!remote) {
        try {
          out[i].value = plain(i);
        } catch (...) {
          out[i].error = std::current_exception();
        }
        continue;
      }
      auto& I = *remote->impl_;
      if (auto g = given_up.find(I.o.address); g != given_up.end()) {
        out[i].error = g->second;
        continue;
      }
      try {
        std::optional<EnvReply> rep;
        // After a server went unanswered or answered infra (it died, restarted, lost episodes),
        // requests sent to it before may be lost with it: its other episodes call at once
        // rather than wait out a timeout each (a request that did arrive is answered again
        // from the server's cache, applied once).
        if (sent[i] && !troubled.contains(I.o.address))
          rep = I.await(reqs[i], false, since,
                        since + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(I.o.timeout_s)));
        if (rep && rep->error_kind == "data")
          throw Error(fmt::format("environment {} at {}: {}", I.o.env, I.o.address, rep->error));
        if (!rep || !rep->error.empty()) troubled.insert(I.o.address);
        // No answer, or an infra one: the episode's own call, with its retries and recovery.
        out[i].value = apply(I, rep && rep->error.empty() ? std::move(*rep) : I.call(reqs[i]));
      } catch (...) {
        fail(i, I.o.address);
      }
      since = Clock::now();
    }
    return out;
  }

  static std::vector<Outcome<std::vector<TokenId>>> reset(std::span<Env* const> envs,
                                                          std::span<const nlohmann::json* const> tasks) {
    RLX_ASSERT(tasks.size() == envs.size(), "reset_all: {} tasks for {} environments", tasks.size(), envs.size());
    std::map<const nlohmann::json*, std::string> payloads;  // each task written once
    return run<std::vector<TokenId>>(
        envs, "reset",
        [&](size_t i, RemoteEnv::Impl& I) {
          auto [it, fresh] = payloads.try_emplace(tasks[i]);
          if (fresh) it->second = tasks[i]->dump();
          return I.reset_request(it->second);
        },
        [](RemoteEnv::Impl& I, EnvReply rep) { return I.apply_reset(std::move(rep)); },
        [&](size_t i) { return envs[i]->reset(*tasks[i]); });
  }

  static std::vector<Outcome<StepResult>> step(std::span<Env* const> envs, std::span<const std::vector<TokenId>> actions) {
    RLX_ASSERT(actions.size() == envs.size(), "step_all: {} actions for {} environments", actions.size(), envs.size());
    return run<StepResult>(
        envs, "step", [&](size_t i, RemoteEnv::Impl& I) { return I.step_request(actions[i]); },
        [](RemoteEnv::Impl& I, EnvReply rep) { return I.apply_step(std::move(rep)); },
        [&](size_t i) { return envs[i]->step(actions[i]); });
  }

  static void close(std::span<Env* const> envs) {
    std::vector<std::pair<RemoteEnv::Impl*, EnvRequest>> open;
    for (auto* e : envs)
      if (auto* remote = dynamic_cast<RemoteEnv*>(e); remote && remote->impl_->started && !remote->impl_->closed) {
        auto& I = *remote->impl_;
        I.closed = true;
        if (I.send(I.close_request())) open.emplace_back(&I, I.close_request());
      }
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kCloseWaitS));
    for (auto& [I, req] : open) {
      try {
        if (!I->await(req, false, start, deadline)) break;  // a server that does not answer: the rest go unanswered
      } catch (...) {
        break;
      }
    }
  }
};

std::vector<Outcome<std::vector<TokenId>>> reset_all(std::span<Env* const> envs,
                                                     std::span<const nlohmann::json* const> tasks) {
  return Pipeline::reset(envs, tasks);
}

std::vector<Outcome<StepResult>> step_all(std::span<Env* const> envs, std::span<const std::vector<TokenId>> actions) {
  return Pipeline::step(envs, actions);
}

void close_all(std::span<Env* const> envs) { Pipeline::close(envs); }

std::string RemoteEnv::save_state() const { return impl_->state; }

void RemoteEnv::load_state(std::string_view state) {
  auto& I = *impl_;
  auto rep = I.call({.turn = I.turn, .op = bus::EnvOp::load, .payload = std::string(state)});
  I.state = std::move(rep.state);
  I.started = true;
}

uint64_t RemoteEnv::recoveries() const { return impl_->recoveries; }

}  // namespace rlx::env
