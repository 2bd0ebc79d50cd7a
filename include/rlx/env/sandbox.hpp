// The sandbox: runs one command (untrusted, model-written code included) in an isolated,
// bounded child and reports what happened.
//
// Layers, each reported in Result::isolation and by Sandbox::layers():
//  - namespaces: a new user namespace (the child is "root" only inside it: outside it is
//    an unprivileged uid — when rlx runs as root, a fresh uid from `uid_base` per run),
//    and new pid, network (no interfaces up: no network at all), mount, ipc and uts
//    namespaces. The sandbox's own init is pid 1; when it ends, the kernel kills every
//    process left in the namespace (setsid grandchildren included).
//  - filesystem: a new root holding read-only binds of `readonly_paths`, a private /proc,
//    a minimal /dev (null, zero, random, urandom) and a size- and inode-bounded tmpfs at
//    /scratch (also /tmp), the working directory. Nothing else of the host is visible;
//    the scratch disappears with the mount namespace.
//  - no_new_privs, every capability dropped, and a seccomp filter (libseccomp) that kills
//    the process on ptrace, mount, umount, unshare, setns, namespace-creating clone flags,
//    bpf, keyctl, kexec, reboot, io_uring, module loading, perf_event_open, ... (verdict
//    `filter`).
//  - rlimits: CPU seconds, address space, processes, file size, open files, no core dumps.
//  - a wall-clock limit that kills the whole pid namespace; stdout and stderr captured up
//    to `output_bytes` each (more: verdict `output_limit`, killed); the child dies with
//    the thread that started it (PR_SET_PDEATHSIG, chained down to the sandbox's init).
//
// Where the kernel refuses a layer (no user namespaces, say), `missing_layer: refuse`
// (the default) makes the constructor throw naming the layer; `warn` logs it loudly once
// and runs with what is left (rlimits, no_new_privs and seccomp always apply).
//
//   rlx::env::Sandbox sb({.limits = {.wall_s = 5}});
//   auto r = sb.run({.argv = {"python3", "-c", "print(6*7)"}});
//   // r.verdict == rlx::env::SandboxVerdict::ok, r.exit_code == 0, r.stdout_text == "42\n"
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rlx/core/config.hpp"

namespace rlx::env {

struct SandboxLimits {
  double wall_s = 10;             // whole run; kills every process of the sandbox
  double cpu_s = 10;              // CPU seconds per process (RLIMIT_CPU, rounded up)
  uint64_t memory_mb = 1024;      // address space per process (RLIMIT_AS)
  uint32_t processes = 64;        // processes of the sandbox's uid (RLIMIT_NPROC)
  uint64_t file_mb = 16;          // largest file written (RLIMIT_FSIZE)
  uint32_t open_files = 64;       // RLIMIT_NOFILE
  uint64_t output_bytes = 1 << 20;  // captured stdout, and stderr, each
  uint64_t scratch_mb = 64;       // tmpfs at /scratch
  uint64_t scratch_inodes = 4096;  // files and directories in /scratch

  template <class V>
  void visit(V& v) {
    v("wall_s", wall_s, "wall-clock limit of one run; every process of the sandbox is killed", config::in_range(0.01, 86400));
    v("cpu_s", cpu_s, "CPU seconds per process", config::in_range(0.01, 86400));
    v("memory_mb", memory_mb, "address space per process, MiB (an env server's: beyond what its libraries map)",
      config::in_range(16, 1 << 20));
    v("processes", processes, "processes (and threads) the sandbox may have at once", config::in_range(1, 100000));
    v("file_mb", file_mb, "largest file the sandbox may write, MiB", config::in_range(0, 1 << 20));
    v("open_files", open_files, "open file descriptors per process", config::in_range(8, 1 << 20));
    v("output_bytes", output_bytes, "captured stdout, and stderr, each; more kills the run", config::in_range(0, 1ull << 32));
    v("scratch_mb", scratch_mb, "size of the private writable /scratch (tmpfs), MiB", config::in_range(1, 1 << 20));
    v("scratch_inodes", scratch_inodes, "files and directories /scratch may hold", config::in_range(16, 1 << 24));
  }
};

enum class MissingLayer { refuse, warn };
constexpr std::array<std::pair<MissingLayer, std::string_view>, 2> enum_names(MissingLayer) {
  return {{{MissingLayer::refuse, "refuse"}, {MissingLayer::warn, "warn"}}};
}

struct SandboxOptions {
  SandboxLimits limits;
  // Host paths visible (read-only) inside; missing ones are skipped, symlinks kept as links.
  std::vector<std::string> readonly_paths = {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"};
  // Host paths visible and writable inside (an env server's socket directory); keep few.
  std::vector<std::string> writable_paths;
  MissingLayer missing_layer = MissingLayer::refuse;
  uint32_t uid_base = 200000;            // when run as root: outside uids base .. base+65535
  std::string hostname = "sandbox";

  template <class V>
  void visit(V& v) {
    v("limits", limits, "per-run limits");
    v("readonly_paths", readonly_paths, "host paths visible read-only inside the sandbox");
    v("writable_paths", writable_paths, "host paths visible and writable inside (e.g. a socket directory)");
    v("missing_layer", missing_layer, "when the kernel refuses an isolation layer: refuse (error) or warn (run without it)");
    v("uid_base", uid_base, "first outside uid of sandboxes when rlx runs as root", config::at_least(1000));
    v("hostname", hostname, "host name inside the sandbox");
  }
};

enum class SandboxVerdict {
  ok,            // exited on its own (any exit code)
  timeout,       // wall-clock limit
  cpu_time,      // CPU limit (SIGXCPU / SIGKILL at the hard limit)
  memory,        // allocation refused by the address-space limit
  output_limit,  // stdout or stderr over output_bytes
  file_size,     // a file over file_mb (SIGXFSZ)
  filter,        // a forbidden system call (SIGSYS from the seccomp filter)
  signal,        // killed by another signal (segfault, abort, ...)
  setup_error,   // the sandbox could not be built or the command not executed (infra, not the code's fault)
  cancelled,     // the caller asked it to stop (SandboxRequest::cancel)
};
constexpr std::array<std::pair<SandboxVerdict, std::string_view>, 10> enum_names(SandboxVerdict) {
  return {{{SandboxVerdict::ok, "ok"},
           {SandboxVerdict::timeout, "timeout"},
           {SandboxVerdict::cpu_time, "cpu_time"},
           {SandboxVerdict::memory, "memory"},
           {SandboxVerdict::output_limit, "output_limit"},
           {SandboxVerdict::file_size, "file_size"},
           {SandboxVerdict::filter, "filter"},
           {SandboxVerdict::signal, "signal"},
           {SandboxVerdict::setup_error, "setup_error"},
           {SandboxVerdict::cancelled, "cancelled"}}};
}

struct SandboxRequest {
  std::vector<std::string> argv;                    // argv[0] is looked up in PATH inside (/usr/local/bin:/usr/bin:/bin)
  std::string stdin_data;                           // fed to stdin, then closed
  std::vector<std::pair<std::string, std::string>> files;  // written into /scratch first: relative name, content
  std::vector<std::string> env;                     // extra NAME=VALUE entries
  // Limits of this run alone (a judge's per-test time limit): each one applies where it is
  // tighter than the sandbox's own, so a request can narrow the operator's limits, never widen them.
  std::optional<SandboxLimits> limits;
  const std::atomic<bool>* cancel = nullptr;        // set: the run is killed (checked every 100 ms)
  // Set: output goes here as it arrives (stream 1: stdout, 2: stderr) instead of into the
  // result, for long-lived commands such as an env server. It still counts against
  // limits.output_bytes.
  std::function<void(int stream, std::string_view chunk)> on_output;
};

struct SandboxResult {
  SandboxVerdict verdict = SandboxVerdict::setup_error;
  int exit_code = -1;   // when it exited
  int signal = 0;       // when a signal ended it
  std::string stdout_text, stderr_text;
  bool stdout_truncated = false, stderr_truncated = false;
  double wall_s = 0, cpu_s = 0;
  uint64_t max_rss_kb = 0;
  std::string detail;   // why, for setup_error and the limits
  std::vector<std::string> isolation;  // layers active in this run
  bool ok() const { return verdict == SandboxVerdict::ok && exit_code == 0; }
};

class Sandbox {
 public:
  explicit Sandbox(SandboxOptions options = {});
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Runs one command to the end (blocking). Safe to call from several threads at once.
  SandboxResult run(const SandboxRequest& request) const;
  // The isolation layers this machine grants (probed once per process).
  const std::vector<std::string>& layers() const;
  const SandboxOptions& options() const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace rlx::env
