// rlx-sandbox-helper: the sandbox's monitor as a small executable. Sandbox::run starts it
// with posix_spawn (vfork + exec), the plan on fd 3 and the run's pipes on fds 4-8, so the
// monitor, init and the command are copies of this tiny process rather than of the caller
// (a trainer with LibTorch has ~1,600 memory mappings; copying them three times per run
// was most of the sandbox's overhead). Not meant to be run by hand.
#include <sys/prctl.h>
#include <unistd.h>

#include <cereal/archives/binary.hpp>
#include <csignal>
#include <sstream>
#include <string>

#include "sandbox_child.hpp"

using namespace rlx::env::sandbox_detail;

int main() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const Fds fds{4, 5, 6, 7, 8};
  std::string bytes;
  char buf[65536];
  for (ssize_t n; (n = ::read(3, buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(fds.status, kStepHelper);
    }
    bytes.append(buf, static_cast<size_t>(n));
  }
  ::close(3);
  Plan plan;
  try {
    std::istringstream is(bytes);
    cereal::BinaryInputArchive ar(is);
    uint32_t version = 0;
    ar(version);
    if (version != kPlanVersion) {
      errno = EPROTO;
      fail(fds.status, kStepHelper);
    }
    ar(plan);
  } catch (...) {
    errno = EPROTO;
    fail(fds.status, kStepHelper);
  }
  if (::getppid() != plan.caller) return 125;  // the caller is already gone
  plan.prepare();
  run_monitor(plan, fds);
}
