// The sandbox's ordinary behaviour: exit codes, stdin, files, environment, output
// capture, the isolation it reports, and clear errors. The attacks are in
// tests/adversarial/.
#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include <catch2/catch.hpp>

#include "../helpers.hpp"
#include "rlx/core/files.hpp"
#include "rlx/env/sandbox.hpp"

using rlx::env::Sandbox;
using rlx::env::SandboxVerdict;

TEST_CASE("sandbox: exit codes, stdin, files, environment", "[sandbox]") {
  Sandbox sb({.limits = {.wall_s = 10}});
  auto r = sb.run({.argv = {"sh", "-c", "echo out; echo err >&2; exit 3"}});
  CHECK(r.verdict == SandboxVerdict::ok);
  CHECK(r.exit_code == 3);
  CHECK_FALSE(r.ok());
  CHECK(r.stdout_text == "out\n");
  CHECK(r.stderr_text == "err\n");
  CHECK(r.wall_s > 0);

  r = sb.run({.argv = {"python3", "-c", "import sys; print(sys.stdin.read().upper())"}, .stdin_data = "hello"});
  CHECK(r.ok());
  CHECK(r.stdout_text == "HELLO\n");

  r = sb.run({.argv = {"sh", "-c", "cat dir/a.txt; pwd; echo $FOO; ls /scratch | wc -l"},
              .files = {{"dir/a.txt", "content\n"}},
              .env = {"FOO=bar"}});
  CHECK(r.ok());
  CHECK(r.stdout_text == "content\n/scratch\nbar\n1\n");

  // Large stdin is fed without deadlock while the command writes.
  const std::string big(1 << 20, 'x');
  r = sb.run({.argv = {"sh", "-c", "wc -c"}, .stdin_data = big});
  CHECK(r.ok());
  CHECK(r.stdout_text == std::to_string(big.size()) + "\n");
}

TEST_CASE("sandbox: reports its isolation, inside it is alone", "[sandbox]") {
  Sandbox sb;
  for (const char* layer : {"user_ns", "pid_ns", "net_ns", "mount_ns", "ipc_ns", "uts_ns", "readonly_root", "seccomp",
                            "no_new_privs", "no_capabilities", "rlimits"})
    CHECK(std::find(sb.layers().begin(), sb.layers().end(), layer) != sb.layers().end());
  auto r = sb.run({.argv = {"sh", "-c", "hostname; ls /proc | grep -c '^[0-9]'; grep CapEff /proc/self/status; "
                                        "grep NoNewPrivs /proc/self/status; grep Seccomp: /proc/self/status; id -u"}});
  REQUIRE(r.ok());
  // hostname; processes: sh, ls and grep (3 at most); no capabilities; no_new_privs; filter mode 2.
  CHECK_THAT(r.stdout_text, Catch::StartsWith("sandbox\n"));
  CHECK_THAT(r.stdout_text, Catch::Contains("CapEff:\t0000000000000000"));
  CHECK_THAT(r.stdout_text, Catch::Contains("NoNewPrivs:\t1"));
  CHECK_THAT(r.stdout_text, Catch::Contains("Seccomp:\t2"));
  CHECK(r.isolation == sb.layers());
}

TEST_CASE("sandbox: the command starts with default signal dispositions, nothing blocked", "[sandbox]") {
  // As in a role: SIGPIPE and SIGINT ignored, SIGUSR1 blocked. None of it may reach the command.
  struct sigaction ign{}, old_pipe{}, old_int{};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ign, &old_pipe);
  ::sigaction(SIGINT, &ign, &old_int);
  sigset_t usr1, old_mask;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &usr1, &old_mask);
  Sandbox sb({.limits = {.wall_s = 10}});
  auto r = sb.run({.argv = {"sh", "-c", "grep -E '^Sig(Ign|Blk):' /proc/self/status"}});
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  ::sigaction(SIGINT, &old_int, nullptr);
  REQUIRE(r.ok());
  // The masks of signals 1-31 (bit n-1 for signal n); glibc's own real-time signals (32, 33)
  // are its business.
  unsigned long long blocked = 0, ignored = 0;
  REQUIRE(std::sscanf(r.stdout_text.c_str(), "SigBlk:\t%llx\nSigIgn:\t%llx", &blocked, &ignored) == 2);
  CHECK((blocked & 0x7fffffffULL) == 0);
  CHECK((ignored & 0x7fffffffULL) == 0);
}

TEST_CASE("sandbox: bad requests and missing commands are clear errors", "[sandbox]") {
  Sandbox sb;
  CHECK_THROWS_WITH(sb.run({}), Catch::Contains("empty command"));
  CHECK_THROWS_WITH(sb.run({.argv = {"true"}, .files = {{"../x", ""}}}), Catch::Contains("'../x' must be relative"));
  CHECK_THROWS_WITH(sb.run({.argv = {"true"}, .env = {"NOEQUALS"}}), Catch::Contains("NAME=VALUE"));
  auto r = sb.run({.argv = {"/no/such/program"}});
  CHECK(r.verdict == SandboxVerdict::setup_error);
  CHECK_THAT(r.detail, Catch::Contains("execute the command") && Catch::Contains("No such file"));
  rlx::env::SandboxOptions bad;
  bad.limits.wall_s = 0;
  CHECK_THROWS_WITH(Sandbox(bad), Catch::Contains("wall_s"));
  bad = {};
  bad.readonly_paths = {"relative/path"};
  CHECK_THROWS_WITH(Sandbox(bad), Catch::Contains("must be an absolute path"));
}

TEST_CASE("sandbox: streamed output arrives while the command runs, and still counts against the limit", "[sandbox]") {
  rlx::test::TempDir dir;
  const std::string go = (dir / "go").string();
  Sandbox sb({.limits = {.wall_s = 10}, .writable_paths = {dir.path.string()}});
  // The command waits for a file that the host makes only once "ready" has reached it: were
  // the output held until the end, the run would end at its wall-clock limit instead.
  std::string out, err;
  auto r = sb.run({.argv = {"sh", "-c", "echo ready; while [ ! -e " + go + " ]; do sleep 0.02; done; echo done >&2"},
                   .on_output = [&](int stream, std::string_view chunk) {
                     (stream == 1 ? out : err).append(chunk);
                     if (out == "ready\n" && stream == 1) rlx::test::write_file(go, "");
                   }});
  CHECK(r.verdict == SandboxVerdict::ok);
  CHECK(r.ok());
  CHECK(out == "ready\n");
  CHECK(err == "done\n");
  CHECK(r.stdout_text.empty());  // streamed, not kept

  Sandbox small({.limits = {.wall_s = 10, .output_bytes = 1000}});
  size_t got = 0;
  r = small.run({.argv = {"sh", "-c", "head -c 5000 /dev/zero"}, .on_output = [&](int, std::string_view c) { got += c.size(); }});
  CHECK(r.verdict == SandboxVerdict::output_limit);
  CHECK(got == 1000);
}

TEST_CASE("sandbox: paths under a directory only its owner may enter are reachable, and stay read-only", "[sandbox]") {
  // As root the sandbox runs as a uid of its own, which may not traverse a 0700 parent (a
  // home directory, `mktemp -d`): the binds are taken before the switch of user.
  rlx::test::TempDir dir;
  const auto parent = dir / "private";
  std::filesystem::create_directories(parent / "ro");
  std::filesystem::create_directories(parent / "rw");
  std::filesystem::permissions(parent, std::filesystem::perms::owner_all);
  rlx::test::write_file((parent / "ro" / "data.txt").string(), "inside\n");
  auto options = rlx::env::SandboxOptions{.limits = {.wall_s = 10}};
  options.readonly_paths.push_back((parent / "ro").string());
  options.writable_paths = {(parent / "rw").string()};
  Sandbox sb(options);
  const auto ro = (parent / "ro").string(), rw = (parent / "rw").string();
  auto r = sb.run({.argv = {"sh", "-c", "cat " + ro + "/data.txt; echo x > " + rw + "/out.txt && echo wrote; "
                                        "echo y > " + ro + "/new.txt || echo refused"}});
  CHECK(r.ok());
  CHECK(r.stdout_text == "inside\nwrote\nrefused\n");
  CHECK(rlx::test::read_file((parent / "rw" / "out.txt").string()) == "x\n");
  CHECK_FALSE(std::filesystem::exists(parent / "ro" / "new.txt"));

  // A path gone by the time of the run: the set-up error names it (the reason is the
  // kernel's: no such file, or, as root, that the sandbox's user may not look for it).
  rlx::remove_tree(parent / "ro");
  r = sb.run({.argv = {"true"}});
  CHECK(r.verdict == SandboxVerdict::setup_error);
  CHECK_THAT(r.detail, Catch::Contains("bind a read-only path' " + ro + ": "));
}
