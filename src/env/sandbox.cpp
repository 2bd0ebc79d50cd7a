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

#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"

namespace rlx {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// --- records on the status pipe ------------------------------------------------------
enum RecordKind : int32_t {
  kUnshared = 1,   // monitor: namespaces created (a = flags granted)
  kInitPid = 2,    // monitor: init's pid in the caller's namespace (a)
  kSetupFail = 3,  // any: a set-up step failed (a = errno, b = step)
  kCommand = 4,    // init: the command ended (a = wait status)
  kDone = 5,       // monitor: init ended (a = wait status, b = maxrss kB, c = cpu s)
};
struct Record {
  int32_t kind = 0;
  int32_t a = 0;
  int64_t b = 0;
  double c = 0;
};
static_assert(sizeof(Record) <= PIPE_BUF);

void put(int fd, Record r) {
  while (::write(fd, &r, sizeof r) < 0 && errno == EINTR) {
  }
}

// Set-up steps, named in errors.
constexpr const char* kSteps[] = {"",  // 0
                                  "unshare namespaces", "uid/gid map", "setresgid/setresuid", "fork init",
                                  "make / private", "mount the new root (tmpfs)", "bind a read-only path",
                                  "remount read-only", "mount /proc", "mount /dev", "mount /scratch",
                                  "write a scratch file", "sethostname", "pivot_root", "detach the old root",
                                  "fork the command", "set a rlimit", "no_new_privs", "drop capabilities",
                                  "load the seccomp filter", "execute the command", "open stdio"};
enum Step : int32_t {
  kStepUnshare = 1, kStepMaps, kStepIds, kStepForkInit, kStepPrivate, kStepRoot, kStepBind, kStepRemount, kStepProc,
  kStepDev, kStepScratch, kStepFile, kStepHostname, kStepPivot, kStepDetach, kStepForkCmd, kStepRlimit, kStepNnp,
  kStepCaps, kStepSeccomp, kStepExec, kStepStdio,
};

[[noreturn]] void fail(int status_fd, Step step) {
  put(status_fd, {.kind = kSetupFail, .a = errno, .b = step});
  ::_exit(125);
}

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

// --- capabilities --------------------------------------------------------------------
void drop_capabilities(int status_fd) {
  if (::prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                                     SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED) != 0)
    fail(status_fd, kStepCaps);
  for (int cap = 0; cap <= 63; ++cap)
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) fail(status_fd, kStepCaps);
  (void)::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capset, &header, data) != 0) fail(status_fd, kStepCaps);
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

// mkdir of every parent of `path` below its first `from` characters (no allocation: used
// after fork).
void mkdir_parents(const std::string& path, size_t from) {
  char buf[4096];
  if (path.size() >= sizeof buf) return;
  std::memcpy(buf, path.c_str(), path.size() + 1);
  for (size_t i = from + 1; i < path.size(); ++i)
    if (buf[i] == '/') {
      buf[i] = '\0';
      ::mkdir(buf, 0755);
      buf[i] = '/';
    }
}

// Closes every descriptor but 0-2 and `keep` (after fork: the caller's other sockets and
// pipes, other sandboxes' included, must not leak into this one).
void close_others(std::initializer_list<int> keep) {
  int k[16];
  size_t n = 0;
  for (int fd : keep)
    if (fd > 2 && n < 16) k[n++] = fd;
  std::sort(k, k + n);
  unsigned lo = 3;
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<unsigned>(k[i]) > lo) ::syscall(SYS_close_range, lo, static_cast<unsigned>(k[i]) - 1, 0);
    lo = static_cast<unsigned>(k[i]) + 1;
  }
  ::syscall(SYS_close_range, lo, ~0u, 0);
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
  }

  uint32_t outside_uid() const {
    if (::geteuid() != 0) return ::geteuid();
    // A uid per run (modulo the range): the kernel counts processes per uid, so a fork bomb
    // in one sandbox does not use up another's limit.
    return o.uid_base + ((static_cast<uint32_t>(::getpid()) * 2654435761u + runs.fetch_add(1)) & 0xffff);
  }

  SandboxResult run(const SandboxRequest& req) const;
};

namespace {

// Everything the children need, built before fork().
struct Plan {
  std::vector<std::string> strings;  // storage
  std::vector<char*> argv, envp;
  std::string exe;
  struct Mount {
    std::string src, dst, link;
    bool dir, writable;
  };
  std::vector<Mount> binds;
  std::string root = "/tmp";  // where the new root is built (a tmpfs over it, in the private mount ns)
  std::string scratch_opts, root_opts;
  std::vector<std::pair<std::string, std::string>> files;  // full path in the new root, content
  std::vector<std::string> dirs;                           // to create in the new root, in order
  rlimit cpu, as, nproc, fsize, nofile, core;
  std::string hostname;
  std::string proc, dev, scratch, tmp, old;
  std::vector<std::pair<std::string, std::string>> devices;  // /dev/x, new-root/dev/x
};

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

}  // namespace

SandboxResult Sandbox::Impl::run(const SandboxRequest& req) const {
  SandboxResult res;
  res.isolation = layers;
  RLX_CHECK(!req.argv.empty(), "sandbox: an empty command");
  const auto& L = o.limits;
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
  for (size_t i = 0; i < plan.strings.size(); ++i) (i < nargs ? plan.argv : plan.envp).push_back(plan.strings[i].data());
  plan.argv.push_back(nullptr);
  plan.envp.push_back(nullptr);
  const auto limit = [](double v) { return rlimit{static_cast<rlim_t>(v), static_cast<rlim_t>(v)}; };
  const rlim_t cpu = static_cast<rlim_t>(std::ceil(L.cpu_s));
  plan.cpu = {cpu, cpu + 1};  // SIGXCPU at the soft limit, SIGKILL a second later
  plan.as = limit(static_cast<double>(L.memory_mb << 20));
  plan.nproc = limit(L.processes);
  plan.fsize = limit(static_cast<double>(L.file_mb << 20));
  plan.nofile = limit(L.open_files);
  plan.core = {0, 0};
  plan.hostname = o.hostname;
  if (isolate) {
    plan.root_opts = "size=1m,nr_inodes=1024,mode=755";
    plan.scratch_opts = fmt::format("size={}m,nr_inodes={},mode=1777", L.scratch_mb, L.scratch_inodes);
    RLX_CHECK(exposed.size() <= 64, "sandbox: at most 64 readonly and writable paths");
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

  const uint32_t uid = isolate ? outside_uid() : ::geteuid();
  const uint32_t gid = isolate ? (::geteuid() == 0 ? uid : ::getegid()) : ::getegid();
  // A writable path is handed to this run's uid (as root, runs get uids of their own).
  if (isolate && ::geteuid() == 0)
    for (const auto& e : exposed)
      if (e.writable && ::chown(e.path.c_str(), uid, gid) != 0)
        res.detail = fmt::format("sandbox: cannot hand {} to uid {}: {}", e.path, uid, std::strerror(errno));
  if (!res.detail.empty()) return res;
  // Pipes: status (children -> caller), exec (command -> init, O_CLOEXEC), sync (caller
  // -> monitor), stdin, stdout, stderr.
  int status_p[2], sync_p[2], in_p[2], out_p[2], err_p[2];
  RLX_CHECK(::pipe2(status_p, O_CLOEXEC) == 0 && ::pipe2(sync_p, O_CLOEXEC) == 0 && ::pipe2(in_p, O_CLOEXEC) == 0 &&
                ::pipe2(out_p, O_CLOEXEC) == 0 && ::pipe2(err_p, O_CLOEXEC) == 0,
            "sandbox: pipe: {}", std::strerror(errno));
  const pid_t caller = ::getpid();
  const bool caller_root = ::geteuid() == 0;
  const double t0 = now_s();

  const pid_t monitor = ::_Fork();  // no atfork handlers (LibTorch's and OpenMP's are slow); the children only make system calls
  if (monitor < 0) {
    for (int fd : {status_p[0], status_p[1], sync_p[0], sync_p[1], in_p[0], in_p[1], out_p[0], out_p[1], err_p[0], err_p[1]})
      ::close(fd);
    res.detail = fmt::format("fork: {}", std::strerror(errno));
    return res;
  }
  if (monitor == 0) {
    // ---- monitor ----
    const int sfd = status_p[1];
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != caller) ::_exit(125);
    close_others({sfd, sync_p[0], in_p[0], out_p[1], err_p[1]});
    if (isolate && ::unshare(namespaces) != 0) fail(sfd, kStepUnshare);
    put(sfd, {.kind = kUnshared, .a = namespaces});
    char go = 0;
    if (::read(sync_p[0], &go, 1) != 1 || go != 1) ::_exit(125);  // the caller could not map our ids
    if (isolate) {
      if (::setresgid(0, 0, 0) != 0 || (caller_root && ::setgroups(0, nullptr) != 0) || ::setresuid(0, 0, 0) != 0)
        fail(sfd, kStepIds);
      // A change of credentials clears the parent-death signal: set it again (and check
      // that the caller did not die in between).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != caller) ::_exit(125);
    }
    int exec_p[2];
    if (::pipe2(exec_p, O_CLOEXEC) != 0) fail(sfd, kStepForkInit);
    const pid_t init = ::_Fork();
    if (init < 0) fail(sfd, kStepForkInit);
    if (init == 0) {
      // ---- init (pid 1 of the new pid namespace) ----
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      // Init is a copy of the caller (its memory, its environment): not dumpable, so the
      // command cannot read /proc/1/environ or /proc/1/mem.
      ::prctl(PR_SET_DUMPABLE, 0);
      if (isolate) {
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail(sfd, kStepPrivate);
        const char* root = plan.root.c_str();
        // The sources, opened before the new root's tmpfs covers plan.root (a source may lie
        // below it): binds then come from /proc/self/fd/N.
        int source_fd[64];
        const size_t nbinds = std::min<size_t>(plan.binds.size(), 64);
        for (size_t i = 0; i < nbinds; ++i) {
          source_fd[i] = plan.binds[i].link.empty() ? ::open(plan.binds[i].src.c_str(), O_PATH | O_CLOEXEC) : -1;
          if (plan.binds[i].link.empty() && source_fd[i] < 0) fail(sfd, kStepBind);
        }
        if (::mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, plan.root_opts.c_str()) != 0) fail(sfd, kStepRoot);
        for (size_t bi = 0; bi < nbinds; ++bi) {
          const auto& b = plan.binds[bi];
          if (!b.link.empty()) {
            // mkdir -p of the parent is not needed: exposed paths are top-level or below one
            if (::symlink(b.link.c_str(), b.dst.c_str()) != 0) fail(sfd, kStepBind);
            continue;
          }
          mkdir_parents(b.dst, plan.root.size());  // nested paths
          if (b.dir ? (::mkdir(b.dst.c_str(), 0755) != 0 && errno != EEXIST)
                    : ::close(::open(b.dst.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) != 0)
            fail(sfd, kStepBind);
          char src[64];
          std::snprintf(src, sizeof src, "/proc/self/fd/%d", source_fd[bi]);
          if (::mount(src, b.dst.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) fail(sfd, kStepBind);
          ::close(source_fd[bi]);
          struct mount_attr attr {};
          attr.attr_set = (b.writable ? 0 : MOUNT_ATTR_RDONLY) | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
          if (::syscall(SYS_mount_setattr, -1, b.dst.c_str(), AT_RECURSIVE, &attr, sizeof attr) != 0)
            fail(sfd, kStepRemount);
        }
        const std::string &proc = plan.proc, &dev = plan.dev, &scratch = plan.scratch, &tmp = plan.tmp, &old = plan.old;
        ::mkdir(proc.c_str(), 0555);
        if (::mount("proc", proc.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) fail(sfd, kStepProc);
        ::mkdir(dev.c_str(), 0755);
        if (::mount("tmpfs", dev.c_str(), "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755") != 0)
          fail(sfd, kStepDev);
        for (const auto& [src, dst] : plan.devices) {
          const int fd = ::open(dst.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
          if (fd < 0) fail(sfd, kStepDev);
          ::close(fd);
          if (::mount(src.c_str(), dst.c_str(), nullptr, MS_BIND, nullptr) != 0) fail(sfd, kStepDev);
        }
        ::mkdir(scratch.c_str(), 0755);
        if (::mount("tmpfs", scratch.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, plan.scratch_opts.c_str()) != 0)
          fail(sfd, kStepScratch);
        // /tmp is the scratch, unless an exposed path lives below /tmp (then /tmp holds it).
        if (::symlink("/scratch", tmp.c_str()) != 0 && errno != EEXIST) fail(sfd, kStepScratch);
        for (const auto& [path, content] : plan.files) {
          mkdir_parents(path, scratch.size());
          const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
          if (fd < 0) fail(sfd, kStepFile);
          for (size_t off = 0; off < content.size();) {
            const ssize_t n = ::write(fd, content.data() + off, content.size() - off);
            if (n <= 0) fail(sfd, kStepFile);
            off += static_cast<size_t>(n);
          }
          ::close(fd);
        }
        if (::sethostname(plan.hostname.data(), plan.hostname.size()) != 0) fail(sfd, kStepHostname);
        ::mkdir(old.c_str(), 0700);
        if (::syscall(SYS_pivot_root, root, old.c_str()) != 0) fail(sfd, kStepPivot);
        if (::chdir("/") != 0 || ::umount2("/.old", MNT_DETACH) != 0 || ::rmdir("/.old") != 0) fail(sfd, kStepDetach);
        struct mount_attr attr {};
        attr.attr_set = MOUNT_ATTR_RDONLY;
        if (::syscall(SYS_mount_setattr, -1, "/", 0, &attr, sizeof attr) != 0) fail(sfd, kStepRemount);
        if (::chdir("/scratch") != 0) fail(sfd, kStepScratch);
      }
      const pid_t cmd = ::_Fork();
      if (cmd < 0) fail(sfd, kStepForkCmd);
      if (cmd == 0) {
        // ---- the command ----
        const int efd = exec_p[1];  // O_CLOEXEC: closes on a successful execve
        if (::dup2(in_p[0], 0) < 0 || ::dup2(out_p[1], 1) < 0 || ::dup2(err_p[1], 2) < 0) fail(efd, kStepStdio);
        ::setsid();
        ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);  // nothing else reaches the command
        const std::pair<int, const rlimit*> limits[] = {{RLIMIT_CPU, &plan.cpu},       {RLIMIT_AS, &plan.as},
                                                        {RLIMIT_NPROC, &plan.nproc},   {RLIMIT_FSIZE, &plan.fsize},
                                                        {RLIMIT_NOFILE, &plan.nofile}, {RLIMIT_CORE, &plan.core}};
        for (auto [r, v] : limits)
          if (::setrlimit(r, v) != 0) fail(efd, kStepRlimit);
        if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(efd, kStepNnp);
        drop_capabilities(efd);
        sock_fprog prog{static_cast<unsigned short>(filter.size()), const_cast<sock_filter*>(filter.data())};
        if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) fail(efd, kStepSeccomp);
        ::execve(plan.exe.c_str(), plan.argv.data(), plan.envp.data());
        fail(efd, kStepExec);
      }
      ::close(exec_p[1]);
      for (int fd : {in_p[0], out_p[1], err_p[1]}) ::close(fd);
      // Reap everything until the command ends; orphans are re-parented to us.
      int cmd_status = 0;
      for (;;) {
        int st = 0;
        const pid_t p = ::waitpid(-1, &st, 0);
        if (p == cmd) {
          cmd_status = st;
          break;
        }
        if (p < 0 && errno != EINTR) break;
      }
      Record exec_fail;
      if (::read(exec_p[0], &exec_fail, sizeof exec_fail) == sizeof exec_fail) put(sfd, exec_fail);
      put(sfd, {.kind = kCommand, .a = cmd_status});
      ::_exit(0);  // the kernel now kills what is left in the namespace
    }
    // Monitor: report init's pid, wait for it (after the namespace is empty), report usage.
    ::close(exec_p[0]);
    ::close(exec_p[1]);
    for (int fd : {in_p[0], out_p[1], err_p[1]}) ::close(fd);
    put(sfd, {.kind = kInitPid, .a = init});
    int st = 0;
    rusage ru{};
    while (::wait4(init, &st, 0, &ru) < 0 && errno == EINTR) {
    }
    const double cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
    put(sfd, {.kind = kDone, .a = st, .b = ru.ru_maxrss, .c = cpu_s});
    ::_exit(0);
  }

  // ---- caller ----
  for (int fd : {status_p[1], sync_p[0], in_p[0], out_p[1], err_p[1]}) ::close(fd);
  pid_t init = -1;
  bool have_command = false, done = false, killed = false;
  int cmd_status = 0;
  auto kill_all = [&] {
    if (killed) return;
    killed = true;
    // init's death empties the pid namespace, and the monitor reaps init only once it is
    // empty: so run() returns after the last process is gone. Before init exists, the
    // monitor (init would follow it through PR_SET_PDEATHSIG).
    if (init > 0) ::kill(init, SIGKILL);
    else ::kill(monitor, SIGKILL);
  };
  std::string status_buf;
  int sync_fd = sync_p[1], in_fd = in_p[1];
  size_t in_off = 0;
  if (req.stdin_data.empty()) ::close(in_fd), in_fd = -1;
  else ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
  int fds[3] = {status_p[0], out_p[0], err_p[0]};
  std::string* sinks[3] = {&status_buf, &res.stdout_text, &res.stderr_text};
  bool* truncated[3] = {nullptr, &res.stdout_truncated, &res.stderr_truncated};
  const double deadline = t0 + L.wall_s;
  bool timed_out = false, cancelled = false;
  while (fds[0] >= 0 || fds[1] >= 0 || fds[2] >= 0) {
    // Records as they arrive.
    while (status_buf.size() >= sizeof(Record)) {
      Record r;
      std::memcpy(&r, status_buf.data(), sizeof r);
      status_buf.erase(0, sizeof r);
      if (r.kind == kUnshared) {
        bool mapped = true;
        if (isolate) {
          const std::string proc = fmt::format("/proc/{}/", monitor);
          if (::geteuid() != 0) mapped = write_file(proc + "setgroups", "deny");
          mapped = mapped && write_file(proc + "uid_map", fmt::format("0 {} 1\n", uid)) &&
                   write_file(proc + "gid_map", fmt::format("0 {} 1\n", gid));
        }
        const char go = mapped ? 1 : 0;
        if (!mapped) res.detail = fmt::format("sandbox: writing the uid/gid map failed: {}", std::strerror(errno));
        (void)!::write(sync_fd, &go, 1);
        ::close(sync_fd);
        sync_fd = -1;
      } else if (r.kind == kInitPid) {
        init = r.a;
        if (killed) ::kill(init, SIGKILL);
      } else if (r.kind == kSetupFail) {
        res.detail = fmt::format("sandbox set-up failed at '{}': {}", kSteps[std::clamp<int64_t>(r.b, 0, kStepStdio)],
                                 std::strerror(r.a));
      } else if (r.kind == kCommand) {
        have_command = true;
        cmd_status = r.a;
      } else if (r.kind == kDone) {
        done = true;
        res.max_rss_kb = static_cast<uint64_t>(r.b);
        res.cpu_s = r.c;
      }
    }
    pollfd pfd[4];
    int n = 0;
    int which[4];
    for (int i = 0; i < 3; ++i)
      if (fds[i] >= 0) pfd[n] = {fds[i], POLLIN, 0}, which[n++] = i;
    if (in_fd >= 0) pfd[n] = {in_fd, POLLOUT, 0}, which[n++] = 3;
    const double left = deadline - now_s();
    if (left <= 0 && !killed) {
      timed_out = true;
      kill_all();
    }
    if (req.cancel && *req.cancel && !killed) {
      cancelled = true;
      kill_all();
    }
    const int wait_ms = killed ? 1000 : static_cast<int>(std::ceil(std::min(left, req.cancel ? 0.1 : left) * 1000));
    const int rc = ::poll(pfd, static_cast<nfds_t>(n), wait_ms);
    if (rc < 0 && errno != EINTR) break;
    for (int k = 0; k < n; ++k) {
      if (!pfd[k].revents) continue;
      const int i = which[k];
      if (i == 3) {
        const ssize_t w = write_no_sigpipe(in_fd, req.stdin_data.data() + in_off, req.stdin_data.size() - in_off);
        if (w > 0) in_off += static_cast<size_t>(w);
        if (w < 0 && errno != EAGAIN && errno != EINTR) in_off = req.stdin_data.size();  // reader gone
        if (in_off >= req.stdin_data.size()) ::close(in_fd), in_fd = -1;
        continue;
      }
      char buf[65536];
      const ssize_t r = ::read(fds[i], buf, sizeof buf);
      if (r <= 0) {
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        ::close(fds[i]);
        fds[i] = -1;
        continue;
      }
      std::string& sink = *sinks[i];
      if (i > 0 && sink.size() + static_cast<size_t>(r) > L.output_bytes) {
        sink.append(buf, L.output_bytes - sink.size());
        *truncated[i] = true;
        kill_all();
        // keep draining (discarding) so nothing blocks; the pipes close when the namespace dies
        continue;
      }
      sink.append(buf, static_cast<size_t>(r));
    }
    if (killed && now_s() > deadline + 5) break;  // bounded even if something holds a pipe open
  }
  for (int fd : {fds[0], fds[1], fds[2], in_fd, sync_fd})
    if (fd >= 0) ::close(fd);
  int mst = 0;
  while (::waitpid(monitor, &mst, 0) < 0 && errno == EINTR) {
  }
  res.wall_s = now_s() - t0;

  // The verdict.
  if (!res.detail.empty() && !have_command) {
    res.verdict = SandboxVerdict::setup_error;
  } else if (cancelled) {
    res.verdict = SandboxVerdict::cancelled;
    res.detail = "cancelled by the caller";
  } else if (timed_out) {
    res.verdict = SandboxVerdict::timeout;
    res.detail = fmt::format("wall-clock limit of {} s", L.wall_s);
  } else if (res.stdout_truncated || res.stderr_truncated) {
    res.verdict = SandboxVerdict::output_limit;
    res.detail = fmt::format("more than {} bytes of output", L.output_bytes);
  } else if (!have_command || !done) {
    res.verdict = SandboxVerdict::setup_error;
    if (res.detail.empty()) res.detail = "the sandbox ended without reporting the command's status";
  } else if (!res.detail.empty()) {
    res.verdict = SandboxVerdict::setup_error;  // e.g. execve failed
  } else if (WIFEXITED(cmd_status)) {
    res.exit_code = WEXITSTATUS(cmd_status);
    res.verdict = SandboxVerdict::ok;
    // The address-space and file-size limits show as failed calls (interpreters ignore
    // SIGXFSZ), reported by the program itself.
    if (res.exit_code != 0 && res.stderr_text.find("File too large") != std::string::npos) {
      res.verdict = SandboxVerdict::file_size;
      res.detail = fmt::format("file size limit of {} MiB", L.file_mb);
    }
    else if (res.exit_code != 0 && (res.stderr_text.find("MemoryError") != std::string::npos ||
                               res.stderr_text.find("std::bad_alloc") != std::string::npos ||
                               res.stderr_text.find("Cannot allocate memory") != std::string::npos)) {
      res.verdict = SandboxVerdict::memory;
      res.detail = fmt::format("address-space limit of {} MiB", L.memory_mb);
    }
  } else if (WIFSIGNALED(cmd_status)) {
    res.signal = WTERMSIG(cmd_status);
    switch (res.signal) {
      case SIGSYS: res.verdict = SandboxVerdict::filter, res.detail = "a forbidden system call"; break;
      case SIGXCPU: res.verdict = SandboxVerdict::cpu_time, res.detail = fmt::format("CPU limit of {} s", L.cpu_s); break;
      case SIGXFSZ: res.verdict = SandboxVerdict::file_size, res.detail = fmt::format("file size limit of {} MiB", L.file_mb); break;
      case SIGKILL:
        if (res.cpu_s >= std::ceil(L.cpu_s)) {
          res.verdict = SandboxVerdict::cpu_time;
          res.detail = fmt::format("CPU limit of {} s", L.cpu_s);
          break;
        }
        [[fallthrough]];
      default: res.verdict = SandboxVerdict::signal, res.detail = fmt::format("killed by signal {} ({})", res.signal, ::strsignal(res.signal));
    }
  }
  return res;
}

Sandbox::Sandbox(SandboxOptions options) : impl_(new Impl(std::move(options))) {}
Sandbox::~Sandbox() { delete impl_; }
SandboxResult Sandbox::run(const SandboxRequest& request) const { return impl_->run(request); }
const std::vector<std::string>& Sandbox::layers() const { return impl_->layers; }
const SandboxOptions& Sandbox::options() const { return impl_->o; }

}  // namespace rlx
