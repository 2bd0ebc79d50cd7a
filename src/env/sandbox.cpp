// The sandbox (see include/rlx/env/sandbox.hpp for the layers).
//
// Processes of one run:
//   caller (rlx, any thread)
//    └─ monitor   fork()ed; unshare()s the namespaces; the caller writes its uid/gid maps;
//        │        waits for init and reports how it ended (wait4: CPU of the whole tree)
//        └─ init  pid 1 of the new pid namespace: builds the new root, then forks the
//            │    command and reaps every orphan until the command ends; its exit makes
//            │    the kernel kill whatever is left in the namespace
//            └─ command  rlimits, no_new_privs, capabilities dropped, seccomp, execve
// Everything the children need (paths, argv, environment, the seccomp program) is built
// before fork(): after it they only make system calls. Records on one status pipe tell
// the caller what happened; a pipe with O_CLOEXEC tells whether execve succeeded.
#include "rlx/core/clock.hpp"
#include "rlx/env/sandbox.hpp"

#include <fcntl.h>
#include <grp.h>
#include <fmt/format.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/filter.h>
#include <linux/securebits.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/build_paths.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "sandbox_child.hpp"

#include <cereal/archives/binary.hpp>
#include <spawn.h>
#include <sstream>

namespace rlx::env {

using namespace sandbox_detail;

namespace {


// --- seccomp -------------------------------------------------------------------------
// The filter, exported as a BPF program before fork (libseccomp allocates).
std::vector<sock_filter> build_filter() {
  scmp_filter_ctx ctx = ::seccomp_init(SCMP_ACT_ALLOW);
  RLX_CHECK(ctx, "sandbox: seccomp_init failed");
  struct Guard {
    scmp_filter_ctx c;
    ~Guard() { ::seccomp_release(c); }
  } guard{ctx};
  const char* denied[] = {"ptrace", "mount", "umount", "umount2", "unshare", "setns", "bpf", "keyctl", "add_key",
                          "request_key", "kexec_load", "kexec_file_load", "reboot", "io_uring_setup",
                          "io_uring_enter", "io_uring_register", "init_module", "finit_module", "delete_module",
                          "pivot_root", "chroot", "swapon", "swapoff", "acct", "perf_event_open", "userfaultfd",
                          "process_vm_readv", "process_vm_writev", "open_by_handle_at", "name_to_handle_at",
                          "fsopen", "fsmount", "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr",
                          "quotactl", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "lookup_dcookie",
                          "vhangup", "nfsservctl", "uselib", "sethostname", "setdomainname", "iopl", "ioperm"};
  for (const char* name : denied) {
    const int nr = ::seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    RLX_CHECK(::seccomp_rule_add(ctx, SCMP_ACT_KILL_PROCESS, nr, 0) == 0, "sandbox: seccomp rule for {} failed", name);
  }
  // clone() that creates namespaces; clone3's flags are in memory (not filterable): ENOSYS
  // makes libc fall back to clone().
  for (uint64_t flag : {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS,
                        CLONE_NEWCGROUP})
    RLX_CHECK(::seccomp_rule_add(ctx, SCMP_ACT_KILL_PROCESS, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag)) == 0,
              "sandbox: seccomp clone rule failed");
  RLX_CHECK(::seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) == 0, "sandbox: seccomp clone3 rule failed");
  // Export through a pipe (the program is a few KB).
  int fds[2];
  RLX_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "sandbox: pipe: {}", std::strerror(errno));
  const int rc = ::seccomp_export_bpf(ctx, fds[1]);
  ::close(fds[1]);
  std::string bytes;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) bytes.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  RLX_CHECK(rc == 0 && !bytes.empty() && bytes.size() % sizeof(sock_filter) == 0, "sandbox: exporting the seccomp filter failed");
  std::vector<sock_filter> prog(bytes.size() / sizeof(sock_filter));
  std::memcpy(prog.data(), bytes.data(), bytes.size());
  return prog;
}

// --- the layers this machine grants ----------------------------------------------------
constexpr int kNamespaceFlags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS;

std::vector<std::string> namespace_names(int flags) {
  std::vector<std::string> out;
  const std::pair<int, const char*> names[] = {{CLONE_NEWUSER, "user_ns"}, {CLONE_NEWPID, "pid_ns"},
                                               {CLONE_NEWNET, "net_ns"},   {CLONE_NEWNS, "mount_ns"},
                                               {CLONE_NEWIPC, "ipc_ns"},   {CLONE_NEWUTS, "uts_ns"}};
  for (auto [f, n] : names)
    if (flags & f) out.emplace_back(n);
  return out;
}

// Which namespaces a child may create here: tries all, then each alone.
int probe_namespaces() {
  auto try_flags = [](int flags) {
    const pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) ::_exit(::unshare(flags) == 0 ? 0 : 1);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  if (try_flags(kNamespaceFlags)) return kNamespaceFlags;
  // Without a user namespace the others need privileges; the sandbox needs the user namespace.
  return try_flags(CLONE_NEWUSER) ? CLONE_NEWUSER : 0;
}

// The helper executable: $RLX_SANDBOX_HELPER (empty: none), else the build tree's, else
// the installed one.
std::string find_helper() {
  if (const char* env = std::getenv("RLX_SANDBOX_HELPER")) return env;
  for (const char* path : {build_paths::kSandboxHelperBuild, build_paths::kSandboxHelperInstall})
    if (::access(path, X_OK) == 0) return path;
  return "";
}

bool write_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// write() that turns a closed reader into EPIPE without a SIGPIPE reaching the process.
ssize_t write_no_sigpipe(int fd, const char* data, size_t n) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  const ssize_t w = ::write(fd, data, n);
  const int saved = errno;
  if (w < 0 && errno == EPIPE) {
    const timespec zero{0, 0};
    (void)::sigtimedwait(&pipe_set, nullptr, &zero);
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return w;
}

// Starts the helper with the plan on its fd 3 and the run's pipes on fds 4-8; its pid, or
// -1 with `error` set.
pid_t spawn_helper(const std::string& helper, const Plan& plan, Fds fds, std::string& error) {
  std::ostringstream os;
  {
    cereal::BinaryOutputArchive ar(os);
    ar(kPlanVersion, const_cast<Plan&>(plan));
  }
  const std::string bytes = os.str();
  int plan_p[2];
  if (::pipe2(plan_p, O_CLOEXEC) != 0) {
    error = fmt::format("sandbox: pipe: {}", std::strerror(errno));
    return -1;
  }
  // Copies above 3..8 first, so that no dup2 below overwrites a source still to be copied.
  const int sources[6] = {plan_p[0], fds.status, fds.sync, fds.in, fds.out, fds.err};
  int high[6];
  for (int i = 0; i < 6; ++i) high[i] = ::fcntl(sources[i], F_DUPFD_CLOEXEC, 64);
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  for (int i = 0; i < 6; ++i) ::posix_spawn_file_actions_adddup2(&fa, high[i], 3 + i);
  char* argv[] = {const_cast<char*>(helper.c_str()), nullptr};
  char* envp[] = {nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, helper.c_str(), &fa, nullptr, argv, envp);
  ::posix_spawn_file_actions_destroy(&fa);
  for (int h : high) ::close(h);
  ::close(plan_p[0]);
  if (rc != 0) {
    ::close(plan_p[1]);
    error = fmt::format("sandbox: cannot start the helper {}: {}", helper, std::strerror(rc));
    return -1;
  }
  for (size_t off = 0; off < bytes.size();) {  // the helper reads while we write (plans may be large)
    const ssize_t w = write_no_sigpipe(plan_p[1], bytes.data() + off, bytes.size() - off);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      break;  // the helper died; the status pipe will say so
    }
    off += static_cast<size_t>(w);
  }
  ::close(plan_p[1]);
  return pid;
}

}  // namespace

// --- Sandbox ---------------------------------------------------------------------------

struct Sandbox::Impl {
  SandboxOptions o;
  std::vector<sock_filter> filter;
  int namespaces = 0;  // flags a run gets
  std::vector<std::string> layers;
  // Host paths to expose: (path, symlink target or empty, is_dir).
  struct Exposed {
    std::string path, link;
    bool dir = true, writable = false;
  };
  std::vector<Exposed> exposed;
  mutable std::atomic<uint32_t> runs{0};
  std::string helper;  // rlx-sandbox-helper, if found (else the children are forked from this process)

  explicit Impl(SandboxOptions options) : o(std::move(options)) {
    config::check_bounds(o, "sandbox");
    filter = build_filter();
    static const int granted = probe_namespaces();
    namespaces = granted;
    const bool full = namespaces == kNamespaceFlags;
    if (!full) {
      const std::string msg =
          "sandbox: this kernel refuses unprivileged namespaces (user, pid, net, mount, ipc, uts): no filesystem, "
          "network or process isolation; only rlimits, no_new_privs and seccomp apply";
      RLX_CHECK(o.missing_layer == MissingLayer::warn, "{} (set sandbox.missing_layer: warn to run anyway)", msg);
      static std::once_flag once;
      std::call_once(once, [&] { log::warn("{} -- RUNNING UNTRUSTED CODE WITHOUT ISOLATION", msg); });
      namespaces = 0;
    }
    layers = namespace_names(namespaces);
    if (full) {
      layers.insert(layers.end(), {"readonly_root", "private_proc", "scratch_tmpfs", "no_network"});
      auto expose = [&](const std::string& p, bool writable) {
        RLX_CHECK(!p.empty() && p[0] == '/' && p.find("..") == std::string::npos && p != "/",
                  "sandbox.{}: '{}' must be an absolute path other than /", writable ? "writable_paths" : "readonly_paths", p);
        std::error_code ec;
        const auto st = std::filesystem::symlink_status(p, ec);
        if (ec || !std::filesystem::exists(st)) {
          RLX_CHECK(!writable, "sandbox.writable_paths: '{}' does not exist", p);
          return;
        }
        if (std::filesystem::is_symlink(st)) exposed.push_back({p, std::filesystem::read_symlink(p).string(), false, false});
        else exposed.push_back({p, "", std::filesystem::is_directory(st), writable});
      };
      for (const auto& p : o.readonly_paths) expose(p, false);
      for (const auto& p : o.writable_paths) expose(p, true);
    }
    layers.insert(layers.end(), {"no_new_privs", "no_capabilities", "seccomp", "rlimits"});
    helper = find_helper();
  }

  uint32_t outside_uid() const {
    if (::geteuid() != 0) return ::geteuid();
    // A uid per run (modulo the range): the kernel counts processes per uid, so a fork bomb
    // in one sandbox does not use up another's limit.
    return o.uid_base + ((static_cast<uint32_t>(::getpid()) * 2654435761u + runs.fetch_add(1)) & 0xffff);
  }

  SandboxResult run(const SandboxRequest& req) const;
  // The plan of one run (before prepare()): the command, its environment and rlimits, and
  // (isolated) the new root's mounts, devices and files.
  Plan plan_run(const SandboxRequest& req, const SandboxLimits& limits) const;
  // Hands the writable paths to a run's uid (as root); the last failure, or empty.
  std::string hand_writable_paths(uint32_t uid, uint32_t gid) const;
  // Starts the monitor with `fds` (through the helper, else forked); its pid, or -1 with
  // `error` set.
  pid_t start_monitor(Plan& plan, Fds fds, std::string& error) const;
};

namespace {

// argv[0] as the sandbox will find it: absolute, or the first match in the sandbox's PATH
// (the same path outside and in, since read-only paths are mounted at their own place).
std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  for (const char* dir : {"/usr/local/bin", "/usr/bin", "/bin"}) {
    const std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "/usr/bin/" + name;
}

// Each limit of `a` and `b`, the tighter one.
SandboxLimits tighter(const SandboxLimits& a, const SandboxLimits& b) {
  return {.wall_s = std::min(a.wall_s, b.wall_s),
          .cpu_s = std::min(a.cpu_s, b.cpu_s),
          .memory_mb = std::min(a.memory_mb, b.memory_mb),
          .processes = std::min(a.processes, b.processes),
          .file_mb = std::min(a.file_mb, b.file_mb),
          .open_files = std::min(a.open_files, b.open_files),
          .output_bytes = std::min(a.output_bytes, b.output_bytes),
          .scratch_mb = std::min(a.scratch_mb, b.scratch_mb),
          .scratch_inodes = std::min(a.scratch_inodes, b.scratch_inodes)};
}

}  // namespace

Plan Sandbox::Impl::plan_run(const SandboxRequest& req, const SandboxLimits& L) const {
  const bool isolate = namespaces != 0;
  Plan plan;
  plan.exe = find_executable(req.argv[0]);
  plan.strings.reserve(req.argv.size() + req.env.size() + 8);
  for (const auto& a : req.argv) plan.strings.push_back(a);
  const size_t nargs = plan.strings.size();
  const std::string home = isolate ? "/scratch" : "/tmp";
  for (const auto& e : {std::string("PATH=/usr/local/bin:/usr/bin:/bin"), "HOME=" + home, "TMPDIR=" + home,
                        std::string("LANG=C.UTF-8"), std::string("PYTHONDONTWRITEBYTECODE=1")})
    plan.strings.push_back(e);
  for (const auto& e : req.env) {
    RLX_CHECK(e.find('=') != std::string::npos && e.find('\0') == std::string::npos, "sandbox: environment entry '{}' is not NAME=VALUE", e);
    plan.strings.push_back(e);
  }
  plan.nargs = nargs;
  const uint64_t cpu = static_cast<uint64_t>(std::ceil(L.cpu_s));
  // SIGXCPU at the soft CPU limit, SIGKILL a second later.
  plan.limits = {cpu, cpu + 1, L.memory_mb << 20, L.processes, L.file_mb << 20, L.open_files, 0};
  plan.hostname = o.hostname;
  plan.filter = filter;
  plan.namespaces = namespaces;
  plan.isolate = isolate;
  if (isolate) {
    plan.root_opts = "size=1m,nr_inodes=1024,mode=755";
    plan.scratch_opts = fmt::format("size={}m,nr_inodes={},mode=1777", L.scratch_mb, L.scratch_inodes);
    RLX_CHECK(exposed.size() <= kMaxBinds, "sandbox: at most {} readonly and writable paths", kMaxBinds);
    for (const auto& e : exposed) plan.binds.push_back({e.path, plan.root + e.path, e.link, e.dir, e.writable});
    plan.proc = plan.root + "/proc", plan.dev = plan.root + "/dev", plan.scratch = plan.root + "/scratch";
    plan.tmp = plan.root + "/tmp", plan.old = plan.root + "/.old";
    for (const char* d : {"null", "zero", "random", "urandom"})
      plan.devices.emplace_back(std::string("/dev/") + d, plan.dev + "/" + d);
    for (const auto& [name, content] : req.files) {
      RLX_CHECK(!name.empty() && name[0] != '/' && name.find("..") == std::string::npos && name.find('\0') == std::string::npos,
                "sandbox: file name '{}' must be relative, without '..'", name);
      plan.files.push_back({plan.root + "/scratch/" + name, content});
    }
  } else {
    RLX_CHECK(req.files.empty(), "sandbox: files need the mount namespace, which this machine refuses");
  }
  return plan;
}

std::string Sandbox::Impl::hand_writable_paths(uint32_t uid, uint32_t gid) const {
  std::string error;
  for (const auto& e : exposed)
    if (e.writable && ::chown(e.path.c_str(), uid, gid) != 0)
      error = fmt::format("sandbox: cannot hand {} to uid {}: {}", e.path, uid, std::strerror(errno));
  return error;
}

pid_t Sandbox::Impl::start_monitor(Plan& plan, Fds fds, std::string& error) const {
  // The helper, started with posix_spawn (vfork + exec): its children copy a tiny process.
  if (!helper.empty()) return spawn_helper(helper, plan, fds, error);
  // No atfork handlers (LibTorch's and OpenMP's are slow); the child only makes system calls.
  const pid_t monitor = ::_Fork();
  if (monitor == 0) sandbox_detail::run_monitor(plan, fds);
  if (monitor < 0) error = fmt::format("fork: {}", std::strerror(errno));
  return monitor;
}

namespace {

// How a run's processes ended, as the caller saw them.
struct Ending {
  bool have_command = false;  // init reported the command's wait status
  bool done = false;          // the monitor reported init's end
  int cmd_status = 0;         // the command's wait status
  bool timed_out = false, cancelled = false;
};

// A set-up failure's detail: the step, the path it failed on (a bind's source, or the
// command), and the error.
std::string setup_failure(const Record& r, const Plan& plan) {
  const auto bind = static_cast<int64_t>(r.c);
  const auto path = bind >= 0 && bind < static_cast<int64_t>(plan.binds.size()) ? " " + plan.binds[bind].src
                    : r.b == kStepExec                                          ? " " + plan.exe
                                                                                : std::string();
  return fmt::format("sandbox set-up failed at '{}'{}: {}", kSteps[std::clamp<int64_t>(r.b, 0, kStepHelper)], path,
                     std::strerror(r.a));
}

// The caller's side of a run, from the monitor's start to its reaping: the records on the
// status pipe (the uid/gid maps written once the monitor has unshared), the command's stdin
// written and its stdout and stderr read until the pipes close, and every process killed at
// the wall-clock or output limit or on cancellation. Fills `res`'s output, detail and usage.
class RunWatch {
 public:
  // `ends`: the caller's ends of the pipes (status, out and err read; sync and in written).
  RunWatch(const SandboxRequest& req, const SandboxLimits& limits, const Plan& plan, pid_t monitor, uint32_t uid,
           uint32_t gid, Fds ends, double deadline, SandboxResult& res)
      : req_(req),
        L_(limits),
        plan_(plan),
        monitor_(monitor),
        uid_(uid),
        gid_(gid),
        deadline_(deadline),
        res_(res),
        fds_{ends.status, ends.out, ends.err},
        sync_fd_(ends.sync),
        in_fd_(ends.in) {}

  // Watches until the pipes close (or, once killed, 5 s past the deadline); then closes
  // them and reaps the monitor.
  Ending run() {
    if (req_.stdin_data.empty())
      ::close(in_fd_), in_fd_ = -1;
    else
      ::fcntl(in_fd_, F_SETFL, O_NONBLOCK);
    while (fds_[0] >= 0 || fds_[1] >= 0 || fds_[2] >= 0) {
      read_records();
      if (!poll_once()) break;
      if (killed_ && now_s() > deadline_ + 5) break;  // bounded even if something holds a pipe open
    }
    for (int fd : {fds_[0], fds_[1], fds_[2], in_fd_, sync_fd_})
      if (fd >= 0) ::close(fd);
    int mst = 0;
    while (::waitpid(monitor_, &mst, 0) < 0 && errno == EINTR) {
    }
    return end_;
  }

 private:
  void kill_all() {
    if (killed_) return;
    killed_ = true;
    // init's death empties the pid namespace, and the monitor reaps init only once it is
    // empty: so run() returns after the last process is gone. Before init exists, the
    // monitor (init would follow it through PR_SET_PDEATHSIG).
    if (init_ > 0)
      ::kill(init_, SIGKILL);
    else
      ::kill(monitor_, SIGKILL);
  }

  // Records as they arrive.
  void read_records() {
    while (status_buf_.size() >= sizeof(Record)) {
      Record r;
      std::memcpy(&r, status_buf_.data(), sizeof r);
      status_buf_.erase(0, sizeof r);
      if (r.kind == kUnshared) {
        write_maps();
      } else if (r.kind == kInitPid) {
        init_ = r.a;
        if (killed_) ::kill(init_, SIGKILL);
      } else if (r.kind == kSetupFail) {
        res_.detail = setup_failure(r, plan_);
      } else if (r.kind == kCommand) {
        end_.have_command = true;
        end_.cmd_status = r.a;
      } else if (r.kind == kDone) {
        end_.done = true;
        res_.max_rss_kb = static_cast<uint64_t>(r.b);
        res_.cpu_s = r.c;
      }
    }
  }

  // The monitor has unshared: its uid/gid maps (isolated), then the word to go on or not.
  void write_maps() {
    bool mapped = true;
    if (plan_.isolate) {
      const std::string proc = fmt::format("/proc/{}/", monitor_);
      if (::geteuid() != 0) mapped = write_file(proc + "setgroups", "deny");
      mapped = mapped && write_file(proc + "uid_map", fmt::format("0 {} 1\n", uid_)) &&
               write_file(proc + "gid_map", fmt::format("0 {} 1\n", gid_));
    }
    const char go = mapped ? 1 : 0;
    if (!mapped) res_.detail = fmt::format("sandbox: writing the uid/gid map failed: {}", std::strerror(errno));
    (void)!::write(sync_fd_, &go, 1);
    ::close(sync_fd_);
    sync_fd_ = -1;
  }

  // The limits and cancellation checked, one poll of the open pipes, and what it found
  // handled. False: poll failed.
  bool poll_once() {
    pollfd pfd[4];
    int n = 0;
    int which[4];
    for (int i = 0; i < 3; ++i)
      if (fds_[i] >= 0) pfd[n] = {fds_[i], POLLIN, 0}, which[n++] = i;
    if (in_fd_ >= 0) pfd[n] = {in_fd_, POLLOUT, 0}, which[n++] = 3;
    const double left = deadline_ - now_s();
    if (left <= 0 && !killed_) {
      end_.timed_out = true;
      kill_all();
    }
    if (req_.cancel && *req_.cancel && !killed_) {
      end_.cancelled = true;
      kill_all();
    }
    const int wait_ms = killed_ ? 1000 : static_cast<int>(std::ceil(std::min(left, req_.cancel ? 0.1 : left) * 1000));
    const int rc = ::poll(pfd, static_cast<nfds_t>(n), wait_ms);
    if (rc < 0 && errno != EINTR) return false;
    for (int k = 0; k < n; ++k) {
      if (!pfd[k].revents) continue;
      if (which[k] == 3)
        write_stdin();
      else
        read_pipe(which[k]);
    }
    return true;
  }

  void write_stdin() {
    const ssize_t w = write_no_sigpipe(in_fd_, req_.stdin_data.data() + in_off_, req_.stdin_data.size() - in_off_);
    if (w > 0) in_off_ += static_cast<size_t>(w);
    if (w < 0 && errno != EAGAIN && errno != EINTR) in_off_ = req_.stdin_data.size();  // reader gone
    if (in_off_ >= req_.stdin_data.size()) ::close(in_fd_), in_fd_ = -1;
  }

  // Pipe i (0: status, 1: stdout, 2: stderr) into its sink (req.on_output streams the
  // command's); output past the limit is discarded and kills the run.
  void read_pipe(int i) {
    char buf[65536];
    const ssize_t r = ::read(fds_[i], buf, sizeof buf);
    if (r <= 0) {
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
      ::close(fds_[i]);
      fds_[i] = -1;
      return;
    }
    std::string& sink = i == 0 ? status_buf_ : i == 1 ? res_.stdout_text : res_.stderr_text;
    const bool streamed = i > 0 && req_.on_output;
    const size_t had = streamed ? streamed_bytes_[i] : sink.size();
    size_t take = static_cast<size_t>(r);
    if (i > 0 && had + take > L_.output_bytes) {
      take = L_.output_bytes - had;
      (i == 1 ? res_.stdout_truncated : res_.stderr_truncated) = true;
      kill_all();
      // keep draining (discarding) so nothing blocks; the pipes close when the namespace dies
    }
    if (take == 0) return;
    if (streamed) {
      streamed_bytes_[i] += take;
      req_.on_output(i, std::string_view(buf, take));
    } else {
      sink.append(buf, take);
    }
  }

  const SandboxRequest& req_;
  const SandboxLimits& L_;
  const Plan& plan_;
  const pid_t monitor_;
  const uint32_t uid_, gid_;
  const double deadline_;
  SandboxResult& res_;
  int fds_[3];  // status, stdout, stderr (-1: closed)
  int sync_fd_, in_fd_;
  size_t in_off_ = 0;                     // stdin written so far
  size_t streamed_bytes_[3] = {0, 0, 0};  // what went to req.on_output
  std::string status_buf_;                // records not yet read
  pid_t init_ = -1;
  bool killed_ = false;
  Ending end_;
};

// The verdict of a command that exited: ok, unless its stderr says a limit failed it. The
// address-space and file-size limits show as failed calls (interpreters ignore SIGXFSZ),
// reported by the program itself.
void exit_verdict(SandboxResult& res, const SandboxLimits& L, int exit_code) {
  res.exit_code = exit_code;
  res.verdict = SandboxVerdict::ok;
  if (res.exit_code != 0 && res.stderr_text.find("File too large") != std::string::npos) {
    res.verdict = SandboxVerdict::file_size;
    res.detail = fmt::format("file size limit of {} MiB", L.file_mb);
  } else if (res.exit_code != 0 && (res.stderr_text.find("MemoryError") != std::string::npos ||
                                    res.stderr_text.find("std::bad_alloc") != std::string::npos ||
                                    res.stderr_text.find("Cannot allocate memory") != std::string::npos)) {
    res.verdict = SandboxVerdict::memory;
    res.detail = fmt::format("address-space limit of {} MiB", L.memory_mb);
  }
}

// The verdict of a command killed by a signal: the limit or filter that sent it, if any.
void signal_verdict(SandboxResult& res, const SandboxLimits& L, int signal) {
  res.signal = signal;
  switch (res.signal) {
    case SIGSYS:
      res.verdict = SandboxVerdict::filter, res.detail = "a forbidden system call";
      break;
    case SIGXCPU:
      res.verdict = SandboxVerdict::cpu_time, res.detail = fmt::format("CPU limit of {} s", L.cpu_s);
      break;
    case SIGXFSZ:
      res.verdict = SandboxVerdict::file_size, res.detail = fmt::format("file size limit of {} MiB", L.file_mb);
      break;
    case SIGKILL:
      if (res.cpu_s >= std::ceil(L.cpu_s)) {
        res.verdict = SandboxVerdict::cpu_time;
        res.detail = fmt::format("CPU limit of {} s", L.cpu_s);
        break;
      }
      [[fallthrough]];
    default:
      res.verdict = SandboxVerdict::signal,
      res.detail = fmt::format("killed by signal {} ({})", res.signal, ::strsignal(res.signal));
  }
}

// The run's verdict and its detail, from how it ended and what it wrote.
void set_verdict(SandboxResult& res, const SandboxLimits& L, const Ending& end) {
  if (!res.detail.empty() && !end.have_command) {
    res.verdict = SandboxVerdict::setup_error;
  } else if (end.cancelled) {
    res.verdict = SandboxVerdict::cancelled;
    res.detail = "cancelled by the caller";
  } else if (end.timed_out) {
    res.verdict = SandboxVerdict::timeout;
    res.detail = fmt::format("wall-clock limit of {} s", L.wall_s);
  } else if (res.stdout_truncated || res.stderr_truncated) {
    res.verdict = SandboxVerdict::output_limit;
    res.detail = fmt::format("more than {} bytes of output", L.output_bytes);
  } else if (!end.have_command || !end.done) {
    res.verdict = SandboxVerdict::setup_error;
    if (res.detail.empty()) res.detail = "the sandbox ended without reporting the command's status";
  } else if (!res.detail.empty()) {
    res.verdict = SandboxVerdict::setup_error;  // e.g. execve failed
  } else if (WIFEXITED(end.cmd_status)) {
    exit_verdict(res, L, WEXITSTATUS(end.cmd_status));
  } else if (WIFSIGNALED(end.cmd_status)) {
    signal_verdict(res, L, WTERMSIG(end.cmd_status));
  }
}

}  // namespace

SandboxResult Sandbox::Impl::run(const SandboxRequest& req) const {
  SandboxResult res;
  res.isolation = layers;
  RLX_CHECK(!req.argv.empty(), "sandbox: an empty command");
  const SandboxLimits L = req.limits ? tighter(o.limits, *req.limits) : o.limits;
  const bool isolate = namespaces != 0;
  Plan plan = plan_run(req, L);
  plan.prepare();  // argv and envp point into the plan's strings, where they stay
  const uint32_t uid = isolate ? outside_uid() : ::geteuid();
  const uint32_t gid = isolate ? (::geteuid() == 0 ? uid : ::getegid()) : ::getegid();
  // A writable path is handed to this run's uid (as root, runs get uids of their own).
  if (isolate && ::geteuid() == 0) res.detail = hand_writable_paths(uid, gid);
  if (!res.detail.empty()) return res;
  // Pipes: status (children -> caller), exec (command -> init, O_CLOEXEC), sync (caller
  // -> monitor), stdin, stdout, stderr.
  int status_p[2], sync_p[2], in_p[2], out_p[2], err_p[2];
  RLX_CHECK(::pipe2(status_p, O_CLOEXEC) == 0 && ::pipe2(sync_p, O_CLOEXEC) == 0 && ::pipe2(in_p, O_CLOEXEC) == 0 &&
                ::pipe2(out_p, O_CLOEXEC) == 0 && ::pipe2(err_p, O_CLOEXEC) == 0,
            "sandbox: pipe: {}", std::strerror(errno));
  plan.caller = ::getpid();
  plan.caller_root = ::geteuid() == 0;
  const double t0 = now_s();

  std::string spawn_error;
  const pid_t monitor = start_monitor(plan, {status_p[1], sync_p[0], in_p[0], out_p[1], err_p[1]}, spawn_error);
  if (monitor < 0) {
    for (int fd :
         {status_p[0], status_p[1], sync_p[0], sync_p[1], in_p[0], in_p[1], out_p[0], out_p[1], err_p[0], err_p[1]})
      ::close(fd);
    res.detail = spawn_error;
    return res;
  }

  // ---- caller ----
  for (int fd : {status_p[1], sync_p[0], in_p[0], out_p[1], err_p[1]}) ::close(fd);
  RunWatch watch(req, L, plan, monitor, uid, gid, {status_p[0], sync_p[1], in_p[1], out_p[0], err_p[0]}, t0 + L.wall_s,
                 res);
  const Ending end = watch.run();
  res.wall_s = now_s() - t0;
  set_verdict(res, L, end);
  return res;
}

Sandbox::Sandbox(SandboxOptions options) : impl_(new Impl(std::move(options))) {}
Sandbox::~Sandbox() { delete impl_; }
SandboxResult Sandbox::run(const SandboxRequest& request) const { return impl_->run(request); }
const std::vector<std::string>& Sandbox::layers() const { return impl_->layers; }
const SandboxOptions& Sandbox::options() const { return impl_->o; }

}  // namespace rlx::env
