// The sandbox's child side (private to src/env): the monitor, init and command of one run,
// and the plan they follow. Used after _Fork in the calling process, or by the small
// rlx-sandbox-helper executable (started with posix_spawn: the children then copy a tiny
// process instead of the caller's address space).
#pragma once

#include <linux/filter.h>
#include <sys/resource.h>

#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace rlx::env::sandbox_detail {

inline constexpr uint32_t kPlanVersion = 1;  // the helper refuses a plan of another version

// --- records on the status pipe ------------------------------------------------------
enum RecordKind : int32_t {
  kUnshared = 1,   // monitor: namespaces created (a = flags granted)
  kInitPid = 2,    // monitor: init's pid in the caller's namespace (a)
  kSetupFail = 3,  // any: a set-up step failed (a = errno, b = step, c = index of the bind, or -1)
  kCommand = 4,    // init: the command ended (a = wait status)
  kDone = 5,       // monitor: init ended (a = wait status, b = maxrss kB, c = cpu s)
};
struct Record {
  int32_t kind = 0;
  int32_t a = 0;
  int64_t b = 0;
  double c = 0;
};
static_assert(sizeof(Record) <= 512);

void put(int fd, Record r);

// Set-up steps, named in errors.
inline constexpr const char* kSteps[] = {"",  // 0
                                  "unshare namespaces", "uid/gid map", "setresgid/setresuid", "fork init",
                                  "make / private", "mount the new root (tmpfs)", "bind a read-only path",
                                  "remount read-only", "mount /proc", "mount /dev", "mount /scratch",
                                  "write a scratch file", "sethostname", "pivot_root", "detach the old root",
                                  "fork the command", "set a rlimit", "no_new_privs", "drop capabilities",
                                  "load the seccomp filter", "execute the command", "open stdio", "read the plan (helper)"};
enum Step : int32_t {
  kStepUnshare = 1, kStepMaps, kStepIds, kStepForkInit, kStepPrivate, kStepRoot, kStepBind, kStepRemount, kStepProc,
  kStepDev, kStepScratch, kStepFile, kStepHostname, kStepPivot, kStepDetach, kStepForkCmd, kStepRlimit, kStepNnp,
  kStepCaps, kStepSeccomp, kStepExec, kStepStdio, kStepHelper,
};

// `bind`: the index in Plan::binds of the path a bind step failed on (kNoBind: none).
inline constexpr size_t kNoBind = ~size_t{0};
[[noreturn]] void fail(int status_fd, Step step, size_t bind = kNoBind);
inline constexpr size_t kMaxBinds = 64;  // readonly and writable paths of one sandbox


// Everything the children need, built before fork (after it, they only make system calls).
struct Plan {
  std::vector<std::string> strings;  // storage
  std::vector<char*> argv, envp;
  std::string exe;
  struct Mount {
    std::string src, dst, link;
    bool dir = true, writable = false;
    template <class Ar>
    void serialize(Ar& ar) {
      ar(src, dst, link, dir, writable);
    }
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
  std::vector<sock_filter> filter;  // the seccomp program
  int namespaces = 0;
  bool isolate = false, caller_root = false;
  int caller = 0;  // the process the monitor must die with

  // Sent to the helper with cereal; prepare() then rebuilds argv/envp pointers.
  template <class Ar>
  void serialize(Ar& ar) {
    std::string filter_bytes(reinterpret_cast<const char*>(filter.data()), filter.size() * sizeof(sock_filter));
    ar(strings, nargs, exe, binds, root, scratch_opts, root_opts, files, hostname, proc, dev, scratch, tmp, old, devices,
       filter_bytes, namespaces, isolate, caller_root, caller, limits);
    filter.resize(filter_bytes.size() / sizeof(sock_filter));
    std::memcpy(filter.data(), filter_bytes.data(), filter.size() * sizeof(sock_filter));
  }
  std::vector<uint64_t> limits;  // cpu soft, cpu hard, as, nproc, fsize, nofile, core (soft = hard)
  size_t nargs = 0;              // strings[0, nargs) are argv, the rest envp
  void prepare();
};


struct Fds {
  int status, sync, in, out, err;  // status and out/err: written; sync and in: read
};

// The monitor: unshares, waits for the caller's uid map, runs init (which runs the command)
// and reports how it ended on fds.status. Never returns.
[[noreturn]] void run_monitor(Plan& plan, Fds fds);

}  // namespace rlx::env::sandbox_detail
