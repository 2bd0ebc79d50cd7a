#include "rlx/dist/local_group.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"

extern char** environ;

namespace rlx::dist {

std::string RankExit::describe() const {
  if (exited) return fmt::format("exit {}", code);
  if (signal) return fmt::format("killed by signal {} ({})", signal, ::strsignal(signal));
  return "still running";
}

LocalGroup::LocalGroup(LocalGroupOptions options) : opt_(std::move(options)) {
  RLX_CHECK(opt_.world_size >= 1 && opt_.world_size <= 1024, "local group: world size {} is not in [1, 1024]",
            opt_.world_size);
  RLX_CHECK(!opt_.argv.empty(), "local group: no command");
  RLX_CHECK(opt_.store.empty() || (opt_.first_rank >= 0 && opt_.first_rank + opt_.world_size <= opt_.group_size),
            "local group: ranks {}..{} are not in a group of {}", opt_.first_rank, opt_.first_rank + opt_.world_size - 1,
            opt_.group_size);
  if (!opt_.log_dir.empty()) std::filesystem::create_directories(opt_.log_dir);
  for (char** e = environ; *e; ++e) {
    std::string s(*e);
    if (s.rfind("RLX_RANK=", 0) == 0 || s.rfind("RLX_WORLD_SIZE=", 0) == 0 || s.rfind("RLX_STORE", 0) == 0) continue;
    base_env_.push_back(std::move(s));
  }
  base_env_.insert(base_env_.end(), opt_.env.begin(), opt_.env.end());
  done_.assign(static_cast<size_t>(opt_.world_size), false);
  ranks_.resize(static_cast<size_t>(opt_.world_size));
  starts_.assign(static_cast<size_t>(opt_.world_size), 0);
  for (int r = 0; r < opt_.world_size; ++r) {
    try {
      spawn(r);
    } catch (...) {
      for (int s = 0; s < r; ++s) {
        const pid_t pid = ranks_[static_cast<size_t>(s)].pid;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
      throw;
    }
  }
}

void LocalGroup::spawn(int r) {
  auto env = base_env_;
  env.push_back(fmt::format("RLX_RANK={}", opt_.first_rank + r));
  env.push_back(fmt::format("RLX_WORLD_SIZE={}", opt_.store.empty() ? opt_.world_size : opt_.group_size));
  env.push_back(opt_.store.empty() ? fmt::format("RLX_STORE={}:{}", store_.host(), store_.port())
                                   : fmt::format("RLX_STORE={}", opt_.store));
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  auto args = opt_.argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  RankExit re;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const auto n = starts_[static_cast<size_t>(r)]++;
  if (!opt_.log_dir.empty()) {
    const auto stem = n == 0 ? fmt::format("rank-{}", r) : fmt::format("rank-{}.{}", r, n);
    re.out = opt_.log_dir / (stem + ".out");
    re.err = opt_.log_dir / (stem + ".err");
    posix_spawn_file_actions_addopen(&fa, 1, re.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, re.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (opt_.block_sigterm) {
    sigset_t mask;
    ::pthread_sigmask(SIG_BLOCK, nullptr, &mask);  // the caller's, inherited as without the attribute
    sigaddset(&mask, SIGTERM);
    posix_spawnattr_setsigmask(&attr, &mask);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  }
  const int rc = ::posix_spawnp(&re.pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw Error(fmt::format("local group: cannot start {}: {}", opt_.argv[0], std::strerror(rc)));
  ranks_[static_cast<size_t>(r)] = re;
  done_[static_cast<size_t>(r)] = false;
}

void LocalGroup::restart(int rank) {
  RLX_CHECK(rank >= 0 && rank < opt_.world_size, "local group: no rank {}", rank);
  RLX_CHECK(done_[static_cast<size_t>(rank)], "local group: rank {} is still running", rank);
  spawn(rank);
}

LocalGroup::~LocalGroup() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (done_[r]) continue;
    ::kill(ranks_[r].pid, SIGKILL);
    int status = 0;
    ::waitpid(ranks_[r].pid, &status, 0);
  }
}

void LocalGroup::signal(int rank, int sig) {
  RLX_CHECK(rank >= 0 && rank < opt_.world_size, "local group: no rank {}", rank);
  if (!done_[static_cast<size_t>(rank)]) ::kill(ranks_[static_cast<size_t>(rank)].pid, sig);
}

bool LocalGroup::poll() {
  bool all = true;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (done_[r]) continue;
    int status = 0;
    const pid_t p = ::waitpid(ranks_[r].pid, &status, WNOHANG);
    if (p != ranks_[r].pid) {
      all = false;
      continue;
    }
    done_[r] = true;
    auto& re = ranks_[r];
    re.exited = WIFEXITED(status);
    re.code = re.exited ? WEXITSTATUS(status) : -1;
    re.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    // For the peers' diagnosis of the collective this breaks (comm.hpp): who ended, and how.
    if (!re.ok()) {
      const int rank = opt_.first_rank + static_cast<int>(r);
      if (opt_.store.empty()) store_.set(exit_key(rank), re.describe());
      else record_exit(opt_.store, rank, re.describe());  // another task's store (Slurm, k8s)
    }
    if (!re.ok() && fail_time_ < 0 && opt_.replace && opt_.replace(static_cast<int>(r), re)) {
      spawn(static_cast<int>(r));
      all = false;
      continue;
    }
    if (!re.ok() && opt_.fail_fast && fail_time_ < 0) {
      // One rank failed: the others cannot finish; stop them rather than let them time out.
      fail_time_ = now_s();
      first_failed_ = static_cast<int>(r);
      for (size_t o = 0; o < ranks_.size(); ++o)
        if (!done_[o]) ::kill(ranks_[o].pid, SIGTERM);
    }
  }
  if (fail_time_ >= 0 && now_s() - fail_time_ > opt_.grace_s)
    for (size_t o = 0; o < ranks_.size(); ++o)
      if (!done_[o]) ::kill(ranks_[o].pid, SIGKILL);
  return all;
}

const std::vector<RankExit>& LocalGroup::wait(double timeout_s) {
  const double end = now_s() + timeout_s;
  while (!poll()) {
    if (now_s() > end) {
      for (size_t r = 0; r < ranks_.size(); ++r)
        if (!done_[r]) ::kill(ranks_[r].pid, SIGKILL);
      while (!poll()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ranks_;
}

}  // namespace rlx::dist
