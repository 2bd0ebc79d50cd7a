// The adversarial suite: each attack runs in a real sandbox and must end contained within
// its limit plus one second, with the right verdict; afterwards the host is unchanged (no
// process of the sandbox left, no file outside the scratch changed, no mount left behind)
// and the next run on the same Sandbox succeeds.
#define CATCH_CONFIG_MAIN
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <map>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <thread>

#include "../unit/helpers.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/sandbox.hpp"

namespace fs = std::filesystem;
using rlx::env::Sandbox;
using rlx::env::SandboxResult;
using rlx::env::SandboxVerdict;

namespace {

// Sandboxes of this process run as uids [base, base + 65535] (when root); a base per
// process, since ctest runs test cases as parallel processes.
const uint32_t kUidBase = 400000 + static_cast<uint32_t>(::getpid() % 4096) * 65536;

// A process that exits while its /proc entry is read must not fail the scan.
std::string slurp(const fs::path& p) { return rlx::test::read_file(p); }

// Processes on the host whose real uid is in the suite's sandbox range (only meaningful
// as root, where sandboxes get their own uids), and this process's descendants.
struct HostState {
  size_t sandbox_uid_procs = 0, descendants = 0, mounts = 0;
  std::string canary, etc_hostname;
  bool operator==(const HostState&) const = default;
};
std::ostream& operator<<(std::ostream& os, const HostState& h) {
  return os << "{sandbox-uid processes " << h.sandbox_uid_procs << ", descendants " << h.descendants << ", mounts "
            << h.mounts << ", canary " << h.canary.size() << " bytes}";
}

HostState host_state(const fs::path& canary) {
  HostState h;
  std::map<int, int> parent;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    const std::string status = slurp(e.path() / "status");
    const auto uid_at = status.find("\nUid:\t");
    const auto ppid_at = status.find("\nPPid:\t");
    if (uid_at == std::string::npos || ppid_at == std::string::npos) continue;
    const long uid = std::stol(status.substr(uid_at + 6));
    if (::geteuid() == 0 && uid >= kUidBase && uid < kUidBase + 65536) ++h.sandbox_uid_procs;
    parent[std::stoi(name)] = std::stoi(status.substr(ppid_at + 7));
  }
  const int self = ::getpid();
  for (auto [pid, pp] : parent) {
    for (int p = pp, hops = 0; p > 1 && hops < 64; p = parent.count(p) ? parent[p] : 0, ++hops)
      if (p == self) {
        ++h.descendants;
        break;
      }
  }
  const std::string mounts = slurp("/proc/self/mounts");
  h.mounts = static_cast<size_t>(std::count(mounts.begin(), mounts.end(), '\n'));
  h.canary = slurp(canary);
  h.etc_hostname = slurp("/etc/hostname");
  return h;
}

struct Fixture {
  fs::path dir;
  fs::path canary;
  rlx::env::SandboxOptions options;
  std::unique_ptr<Sandbox> sandbox;
  HostState before;

  Fixture() {
    std::string tmpl = (fs::temp_directory_path() / "rlx-adversarial-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()));
    dir = tmpl;
    canary = dir / "run-secret.txt";  // stands for the run directory: checkpoints, keys
    std::ofstream(canary) << "secret-of-the-run\n";
    options.uid_base = kUidBase;
    options.limits.wall_s = 3;
    options.limits.cpu_s = 2;
    options.limits.memory_mb = 512;
    options.limits.processes = 32;
    options.limits.file_mb = 8;
    options.limits.output_bytes = 64 << 10;
    options.limits.scratch_mb = 16;
    options.limits.scratch_inodes = 512;
    sandbox = std::make_unique<Sandbox>(options);
    before = host_state(canary);
  }
  ~Fixture() {
    std::error_code ec;
    rlx::remove_tree(dir, ec);
  }

  // Runs an attack and checks containment; returns the result for verdict checks.
  SandboxResult attack(const rlx::env::SandboxRequest& req, double limit_s) {
    const SandboxResult r = sandbox->run(req);
    INFO("stdout: " << r.stdout_text.substr(0, 2000) << "\nstderr: " << r.stderr_text.substr(0, 2000) << "\ndetail: " << r.detail);
    CHECK(r.wall_s <= limit_s + 1.0);
    CHECK(host_state(canary) == before);
    const SandboxResult next = sandbox->run({.argv = {"python3", "-c", "print('next')"}});
    CHECK(next.ok());
    CHECK(next.stdout_text == "next\n");
    return r;
  }
};

std::vector<std::string> py(const std::string& code) { return {"python3", "-c", code}; }

}  // namespace

TEST_CASE_METHOD(Fixture, "fork bombs (python and shell) end at the wall limit", "[adversarial]") {
  auto r = attack({.argv = py("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass")}, options.limits.wall_s);
  CHECK(r.verdict == SandboxVerdict::timeout);
  r = attack({.argv = {"sh", "-c", "b() { b | b & }; b; while :; do sleep 1; done"}}, options.limits.wall_s);
  // The shell ends at the wall limit, or earlier when the process limit leaves its own
  // loop unable to fork `sleep` (dash then exits with "Cannot fork"); attack() has checked
  // that nothing escaped and the next run is clean either way. Its "Cannot fork" lines may
  // also fill the output cap first (verdict output_limit: killed whole, as at the wall).
  INFO("verdict: " << rlx::config::enum_to_string(r.verdict) << "; stderr: " << r.stderr_text.substr(0, 500));
  CHECK((r.verdict == SandboxVerdict::timeout ||
         (r.verdict == SandboxVerdict::output_limit && r.stderr_text.find("fork") != std::string::npos) ||
         (r.verdict == SandboxVerdict::ok && r.exit_code != 0 && r.stderr_text.find("fork") != std::string::npos)));
}

TEST_CASE_METHOD(Fixture, "a loop that ignores signals and spawns a setsid grandchild is killed whole", "[adversarial]") {
  const auto r = attack({.argv = {"sh", "-c",
                                  "trap '' TERM INT HUP; setsid sh -c 'trap \"\" TERM INT HUP; while :; do :; done' & "
                                  "while :; do :; done"}},
                        options.limits.wall_s);
  CHECK((r.verdict == SandboxVerdict::timeout || r.verdict == SandboxVerdict::cpu_time));
}

TEST_CASE_METHOD(Fixture, "memory bombs: one huge allocation, a slow climb", "[adversarial]") {
  // Faulting in hundreds of MB costs CPU on a loaded VM: the CPU limit must not win the race.
  options.limits.cpu_s = 20;
  sandbox = std::make_unique<Sandbox>(options);
  auto r = attack({.argv = py("x = bytearray(64 << 30)")}, options.limits.wall_s);
  CHECK(r.verdict == SandboxVerdict::memory);
  r = attack({.argv = py("l = []\nwhile True: l.append(bytearray(8 << 20))")}, options.limits.wall_s);
  CHECK(r.verdict == SandboxVerdict::memory);
  CHECK(r.max_rss_kb < (options.limits.memory_mb + 64) * 1024);
}

TEST_CASE_METHOD(Fixture, "an output bomb is cut at the cap", "[adversarial]") {
  const auto r = attack({.argv = py("while True: print('x' * 4096)")}, options.limits.wall_s);
  CHECK(r.verdict == SandboxVerdict::output_limit);
  CHECK(r.stdout_truncated);
  CHECK(r.stdout_text.size() == options.limits.output_bytes);
}

TEST_CASE_METHOD(Fixture, "disk bombs: one huge file, very many files", "[adversarial]") {
  auto r = attack({.argv = py("f = open('/scratch/big', 'wb')\nwhile True: f.write(b'x' * (1 << 20))")}, options.limits.wall_s);
  CHECK(r.verdict == SandboxVerdict::file_size);
  r = attack({.argv = py("i = 0\nwhile True:\n    open('/scratch/f%d' % i, 'w').close(); i += 1")}, options.limits.wall_s);
  CHECK(r.verdict == SandboxVerdict::ok);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.stderr_text, Catch::Contains("No space left on device"));
  // Filling the tmpfs by size rather than inodes.
  r = attack({.argv = py("import os\nfor i in range(100): open('/scratch/g%d' % i, 'wb').write(os.urandom(4 << 20))")},
             options.limits.wall_s);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.stderr_text, Catch::Contains("No space left on device"));
}

TEST_CASE_METHOD(Fixture, "no network: not outside, not the hub's port on this host", "[adversarial]") {
  // A listener standing for the hub.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 8) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const std::string code =
      "import socket\n"
      "for host, port in (('1.1.1.1', 80), ('8.8.8.8', 53), ('127.0.0.1', " + std::to_string(port) + ")):\n"
      "    try:\n"
      "        socket.create_connection((host, port), timeout=1); print('CONNECTED', host)\n"
      "    except OSError as e: print('refused', host, e.errno)\n";
  const auto r = attack({.argv = py(code)}, options.limits.wall_s);
  CHECK(r.verdict == SandboxVerdict::ok);
  CHECK_THAT(r.stdout_text, !Catch::Contains("CONNECTED"));
  CHECK_THAT(r.stdout_text, Catch::Contains("refused 127.0.0.1"));
  CHECK(::accept(listener, nullptr, nullptr) < 0);  // nobody reached the "hub"
  ::close(listener);
}

TEST_CASE_METHOD(Fixture, "files that matter cannot be read or written", "[adversarial]") {
  ::setenv("RLX_ADVERSARIAL_SECRET", "hunter2-env-secret", 1);
  const std::string code =
      "import os\n"
      "for p in ['" + canary.string() + "', '/proc/1/environ', '/proc/1/mem', '/etc/shadow', '/root/.bashrc']:\n"
      "    try: print('READ', p, open(p, 'rb').read(200))\n"
      "    except OSError as e: print('denied', p, e.errno)\n"
      "print('ENV', dict(os.environ))\n"
      "for p in ['/etc/passwd', '/etc/hostname', '/usr/bin/rlx-owned', '/owned', '" + canary.string() + "']:\n"
      "    try: open(p, 'w').write('owned'); print('WROTE', p)\n"
      "    except OSError as e: print('denied', p, e.errno)\n";
  const auto r = attack({.argv = py(code)}, options.limits.wall_s);
  ::unsetenv("RLX_ADVERSARIAL_SECRET");
  CHECK(r.verdict == SandboxVerdict::ok);
  CHECK_THAT(r.stdout_text, !Catch::Contains("READ") && !Catch::Contains("WROTE"));
  CHECK_THAT(r.stdout_text, !Catch::Contains("hunter2") && !Catch::Contains("secret-of-the-run"));
  CHECK(slurp(canary) == "secret-of-the-run\n");
  CHECK_FALSE(fs::exists("/usr/bin/rlx-owned"));
  CHECK_FALSE(fs::exists("/owned"));
}

TEST_CASE_METHOD(Fixture, "ptrace, mount, unshare and bpf are killed by the filter", "[adversarial]") {
  // x86_64 numbers: ptrace 101, mount 165, unshare 272, bpf 321.
  for (const char* call : {"101, 0, 1, 0, 0", "165, b'none', b'/scratch', b'tmpfs', 0, 0", "272, 0x10000000", "321, 0, 0, 0"}) {
    const auto r = attack({.argv = py(std::string("import ctypes\nctypes.CDLL(None).syscall(") + call + ")\nprint('ran')")},
                          options.limits.wall_s);
    INFO(call);
    CHECK(r.verdict == SandboxVerdict::filter);
    CHECK(r.signal == SIGSYS);
    CHECK_THAT(r.stdout_text, !Catch::Contains("ran"));
  }
  // The unshare(1) tool, as a user would try it.
  CHECK(attack({.argv = {"unshare", "-r", "true"}}, options.limits.wall_s).verdict == SandboxVerdict::filter);
}

TEST_CASE_METHOD(Fixture, "reward hacks of python_code score nothing", "[adversarial]") {
  const auto tok = rlx::CharTokenizer(rlx::default_char_alphabet());
  rlx::env::Registry reg;
  rlx::env::register_bundled(reg);
  auto env = reg.make("python_code", {.tokenizer = &tok, .sandbox = sandbox.get()});
  const nlohmann::json task = reg.generate("python_code", 0, 0);  // add(a, b)
  auto reward = [&](const std::string& code) {
    env->reset(task);
    return env->step(tok.encode(code)).reward;
  };
  CHECK(reward("def add(a, b):\n    return a + b\n") == 1.0);
  for (const char* hack : {"import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "exit(0)\n", "quit()\n",
                           "print('passed')\nprint('OK: 3/3 tests passed')\n",
                           "import builtins\nbuiltins.repr = lambda x: '5'\ndef add(a, b): return None\n",
                           "import os\nos.write(1, b'@@rlx 0 0 5\\n@@rlx 0 1 0\\n')\nos._exit(0)\n",
                           "def add(a, b):\n    raise SystemExit(0)\n", "import signal, os\nos.kill(os.getpid(), 9)\n"})
  {
    INFO(hack);
    CHECK(reward(hack) == 0.0);
  }
}

TEST_CASE_METHOD(Fixture, "two sandboxes at once cannot see or signal each other", "[adversarial]") {
  SandboxResult quiet, noisy;
  std::thread a([&] {
    quiet = sandbox->run({.argv = {"sh", "-c", "sleep 1.5; echo survived"}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread b([&] {
    noisy = sandbox->run({.argv = {"sh", "-c", "ls /proc | grep -c '^[0-9]'; kill -9 -1; pkill -9 sleep; echo done"}});
  });
  a.join();
  b.join();
  INFO(noisy.stdout_text << noisy.stderr_text);
  CHECK(quiet.ok());
  CHECK(quiet.stdout_text == "survived\n");
  // The noisy one saw only its own few processes (sh, ls, grep), and killed only itself.
  CHECK(noisy.verdict != SandboxVerdict::setup_error);
  CHECK(std::stoi(noisy.stdout_text.empty() ? "99" : noisy.stdout_text) <= 4);
  CHECK(host_state(canary) == before);
}
