#include "sandbox_child.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/securebits.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace rlx::env::sandbox_detail {

void put(int fd, Record r) {
  while (::write(fd, &r, sizeof r) < 0 && errno == EINTR) {
  }
}

[[noreturn]] void fail(int status_fd, Step step, size_t bind) {
  put(status_fd, {.kind = kSetupFail, .a = errno, .b = step, .c = bind == kNoBind ? -1.0 : static_cast<double>(bind)});
  ::_exit(125);
}

void Plan::prepare() {
  argv.clear();
  envp.clear();
  for (size_t i = 0; i < strings.size(); ++i) (i < nargs ? argv : envp).push_back(strings[i].data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  auto lim = [&](size_t i) { return rlimit{static_cast<rlim_t>(limits.at(i)), static_cast<rlim_t>(limits.at(i))}; };
  cpu = {static_cast<rlim_t>(limits.at(0)), static_cast<rlim_t>(limits.at(1))};
  as = lim(2), nproc = lim(3), fsize = lim(4), nofile = lim(5), core = lim(6);
}

namespace {

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

// The sources of the binds, taken now, with the caller's credentials, as detached copies
// of their mounts (open_tree): the sandbox's own user may not traverse their parents (a
// run directory under a 0700 home). Where the kernel refuses (not root: EPERM; a kernel
// before 5.2: ENOSYS), init opens the source itself, as the sandbox's user (open_sources).
void open_trees(const Plan& plan, size_t nbinds, int* tree_fd) {
  for (size_t i = 0; i < nbinds; ++i)
    tree_fd[i] = plan.isolate && plan.binds[i].link.empty()
                     ? static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, plan.binds[i].src.c_str(),
                                                  OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE))
                     : -1;
}

// The monitor's namespaces: unshared, the caller told (it writes the uid/gid maps) and its
// word awaited; then the monitor is root inside them.
void enter_namespaces(const Plan& plan, Fds fds) {
  const int sfd = fds.status;
  if (plan.isolate && ::unshare(plan.namespaces) != 0) fail(sfd, kStepUnshare);
  put(sfd, {.kind = kUnshared, .a = plan.namespaces});
  char go = 0;
  if (::read(fds.sync, &go, 1) != 1 || go != 1) ::_exit(125);  // the caller could not map our ids
  if (plan.isolate) {
    if (::setresgid(0, 0, 0) != 0 || (plan.caller_root && ::setgroups(0, nullptr) != 0) || ::setresuid(0, 0, 0) != 0)
      fail(sfd, kStepIds);
    // A change of credentials clears the parent-death signal: set it again (and check
    // that the caller did not die in between).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != plan.caller) ::_exit(125);
  }
}

// Sources init must open itself (no detached copy): before the new root's tmpfs covers
// plan.root (a source may lie below it); binds then come from /proc/self/fd/N.
void open_sources(const Plan& plan, size_t nbinds, const int* tree_fd, int* source_fd, int sfd) {
  for (size_t i = 0; i < nbinds; ++i) {
    source_fd[i] =
        plan.binds[i].link.empty() && tree_fd[i] < 0 ? ::open(plan.binds[i].src.c_str(), O_PATH | O_CLOEXEC) : -1;
    if (plan.binds[i].link.empty() && tree_fd[i] < 0 && source_fd[i] < 0) fail(sfd, kStepBind, i);
  }
}

// Bind `bi` into the new root: a symlink, or its source's mount (the detached copy, else
// the source opened by init), private, read-only unless writable.
void mount_bind(const Plan& plan, size_t bi, int tree_fd, int source_fd, int sfd) {
  const auto& b = plan.binds[bi];
  if (!b.link.empty()) {
    // mkdir -p of the parent is not needed: exposed paths are top-level or below one
    if (::symlink(b.link.c_str(), b.dst.c_str()) != 0) fail(sfd, kStepBind, bi);
    return;
  }
  mkdir_parents(b.dst, plan.root.size());  // nested paths
  if (b.dir ? (::mkdir(b.dst.c_str(), 0755) != 0 && errno != EEXIST)
            : ::close(::open(b.dst.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) != 0)
    fail(sfd, kStepBind, bi);
  if (tree_fd >= 0) {
    if (::syscall(SYS_move_mount, tree_fd, "", AT_FDCWD, b.dst.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
      fail(sfd, kStepBind, bi);
    ::close(tree_fd);
  } else {
    char src[64];
    std::snprintf(src, sizeof src, "/proc/self/fd/%d", source_fd);
    if (::mount(src, b.dst.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) fail(sfd, kStepBind, bi);
    ::close(source_fd);
  }
  // Private: a copy of a shared host mount would otherwise still receive (and send)
  // mount events.
  struct mount_attr attr {};
  attr.attr_set = (b.writable ? 0 : MOUNT_ATTR_RDONLY) | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  attr.propagation = MS_PRIVATE;
  if (::syscall(SYS_mount_setattr, -1, b.dst.c_str(), AT_RECURSIVE, &attr, sizeof attr) != 0)
    fail(sfd, kStepRemount, bi);
}

// /proc, /dev with its few devices, and the scratch tmpfs (/tmp a link to it) in the new root.
void mount_system_dirs(const Plan& plan, int sfd) {
  const std::string &proc = plan.proc, &dev = plan.dev, &scratch = plan.scratch, &tmp = plan.tmp;
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
}

// The request's files, in the scratch.
void write_scratch_files(const Plan& plan, int sfd) {
  for (const auto& [path, content] : plan.files) {
    mkdir_parents(path, plan.scratch.size());
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(sfd, kStepFile);
    for (size_t off = 0; off < content.size();) {
      const ssize_t n = ::write(fd, content.data() + off, content.size() - off);
      if (n <= 0) fail(sfd, kStepFile);
      off += static_cast<size_t>(n);
    }
    ::close(fd);
  }
}

// The hostname set, then the new root as / (read-only; the old one detached) with /scratch
// the working directory.
void enter_new_root(const Plan& plan, int sfd) {
  const std::string& old = plan.old;
  if (::sethostname(plan.hostname.data(), plan.hostname.size()) != 0) fail(sfd, kStepHostname);
  ::mkdir(old.c_str(), 0700);
  if (::syscall(SYS_pivot_root, plan.root.c_str(), old.c_str()) != 0) fail(sfd, kStepPivot);
  if (::chdir("/") != 0 || ::umount2("/.old", MNT_DETACH) != 0 || ::rmdir("/.old") != 0) fail(sfd, kStepDetach);
  struct mount_attr attr {};
  attr.attr_set = MOUNT_ATTR_RDONLY;
  if (::syscall(SYS_mount_setattr, -1, "/", 0, &attr, sizeof attr) != 0) fail(sfd, kStepRemount);
  if (::chdir("/scratch") != 0) fail(sfd, kStepScratch);
}

// Init's new root, in its private mount namespace: a tmpfs with the binds, /proc, /dev,
// the scratch and its files, pivoted into.
void build_root(const Plan& plan, size_t nbinds, const int* tree_fd, int sfd) {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail(sfd, kStepPrivate);
  int source_fd[kMaxBinds];
  open_sources(plan, nbinds, tree_fd, source_fd, sfd);
  if (::mount("tmpfs", plan.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, plan.root_opts.c_str()) != 0)
    fail(sfd, kStepRoot);
  for (size_t bi = 0; bi < nbinds; ++bi) mount_bind(plan, bi, tree_fd[bi], source_fd[bi], sfd);
  mount_system_dirs(plan, sfd);
  write_scratch_files(plan, sfd);
  enter_new_root(plan, sfd);
}

// ---- the command ----: stdio, rlimits, no_new_privs, no capabilities, seccomp, execve.
// A failure goes to `efd` (O_CLOEXEC: it closes on a successful execve).
[[noreturn]] void exec_command(Plan& plan, Fds fds, int efd) {
  if (::dup2(fds.in, 0) < 0 || ::dup2(fds.out, 1) < 0 || ::dup2(fds.err, 2) < 0) fail(efd, kStepStdio);
  ::setsid();
  // Default dispositions and no blocked signals, whatever the caller had (a role ignores
  // SIGPIPE and SIGINT, and an ignored signal stays ignored across execve): `yes | head` in a
  // sandbox ends as in a shell. Here, with or without the helper, the one reset either needs.
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);  // nothing else reaches the command
  const std::pair<int, const rlimit*> limits[] = {{RLIMIT_CPU, &plan.cpu},       {RLIMIT_AS, &plan.as},
                                                  {RLIMIT_NPROC, &plan.nproc},   {RLIMIT_FSIZE, &plan.fsize},
                                                  {RLIMIT_NOFILE, &plan.nofile}, {RLIMIT_CORE, &plan.core}};
  for (auto [r, v] : limits)
    if (::setrlimit(r, v) != 0) fail(efd, kStepRlimit);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(efd, kStepNnp);
  drop_capabilities(efd);
  sock_fprog prog{static_cast<unsigned short>(plan.filter.size()), plan.filter.data()};
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) fail(efd, kStepSeccomp);
  ::execve(plan.exe.c_str(), plan.argv.data(), plan.envp.data());
  fail(efd, kStepExec);
}

// Reaps everything until the command ends (orphans are re-parented to init); its wait
// status (0 if waiting failed).
int reap_until(pid_t cmd) {
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
  return cmd_status;
}

// ---- init (pid 1 of the new pid namespace) ----: builds the new root, runs the command,
// reaps until it ends and reports how (an execve failure first, from `exec_p`).
[[noreturn]] void run_init(Plan& plan, Fds fds, size_t nbinds, const int* tree_fd, const int* exec_p) {
  const int sfd = fds.status;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Init is a copy of the caller (its memory, its environment): not dumpable, so the
  // command cannot read /proc/1/environ or /proc/1/mem.
  ::prctl(PR_SET_DUMPABLE, 0);
  if (plan.isolate) build_root(plan, nbinds, tree_fd, sfd);
  const pid_t cmd = ::_Fork();
  if (cmd < 0) fail(sfd, kStepForkCmd);
  if (cmd == 0) exec_command(plan, fds, exec_p[1]);
  ::close(exec_p[1]);
  for (int fd : {fds.in, fds.out, fds.err}) ::close(fd);
  const int cmd_status = reap_until(cmd);
  Record exec_fail;
  if (::read(exec_p[0], &exec_fail, sizeof exec_fail) == sizeof exec_fail) put(sfd, exec_fail);
  put(sfd, {.kind = kCommand, .a = cmd_status});
  ::_exit(0);  // the kernel now kills what is left in the namespace
}

// Monitor: reports init's pid, waits for it (after the namespace is empty), reports usage.
[[noreturn]] void watch_init(pid_t init, Fds fds, const int* exec_p) {
  const int sfd = fds.status;
  ::close(exec_p[0]);
  ::close(exec_p[1]);
  for (int fd : {fds.in, fds.out, fds.err}) ::close(fd);
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

}  // namespace

[[noreturn]] void run_monitor(Plan& plan, Fds fds) {
  const int sfd = fds.status;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != plan.caller) ::_exit(125);
  close_others({sfd, fds.sync, fds.in, fds.out, fds.err});
  int tree_fd[kMaxBinds];
  const size_t nbinds = std::min<size_t>(plan.binds.size(), kMaxBinds);
  open_trees(plan, nbinds, tree_fd);
  enter_namespaces(plan, fds);
  int exec_p[2];
  if (::pipe2(exec_p, O_CLOEXEC) != 0) fail(sfd, kStepForkInit);
  const pid_t init = ::_Fork();
  if (init < 0) fail(sfd, kStepForkInit);
  if (init == 0) run_init(plan, fds, nbinds, tree_fd, exec_p);
  watch_init(init, fds, exec_p);
}

}  // namespace rlx::env::sandbox_detail
