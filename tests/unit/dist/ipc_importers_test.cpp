#include "dist/ipc_importers.hpp"

#include <sys/mman.h>
#include <sys/wait.h>

#include "../helpers.hpp"

using namespace rlx::dist::detail;

namespace {
// The table in memory shared with child processes, as in a weight-sync segment.
ImporterTable* shared_table() {
  void* p = ::mmap(nullptr, sizeof(ImporterTable), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) ImporterTable{};
}
}  // namespace

TEST_CASE("CUDA IPC importer table: a closing publisher waits for live copiers, not for dead ones", "[dist]") {
  auto* t = shared_table();
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  // A subscriber process in the middle of a copy: it holds an entry and stays.
  const pid_t copier = ::fork();
  if (copier == 0) {
    const int e = claim_importer(*t, ::getpid());
    char c = e >= 0 ? 'y' : 'n';
    (void)::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  REQUIRE(c == 'y');
  REQUIRE(importer_holders(*t) == std::vector<int32_t>{copier});
  // The publisher's bounded wait: still held after it.
  REQUIRE(wait_importers_released(*t, 0.05) == std::vector<int32_t>{copier});
  // The copier killed mid-copy (its entry never released): nobody to wait for.
  ::kill(copier, SIGKILL);
  ::waitpid(copier, nullptr, 0);
  REQUIRE(wait_importers_released(*t, 5).empty());
  // Its stale entry is taken over once the free ones are gone; an ordinary copy releases its own.
  const int32_t me = ::getpid();
  std::vector<int> mine;
  for (int i = 0; i < kMaxImporters; ++i) {
    const int e = claim_importer(*t, me);
    REQUIRE(e >= 0);
    mine.push_back(e);
  }
  REQUIRE(claim_importer(*t, me) == -1);  // bounded: 64 live holders
  for (int e : mine) release_importer(*t, e, me);
  REQUIRE(importer_holders(*t).empty());
  // Releasing an entry someone else holds changes nothing.
  const int e = claim_importer(*t, me);
  release_importer(*t, e, me + 1);
  REQUIRE(importer_holders(*t) == std::vector<int32_t>{me});
  release_importer(*t, e, me);
  ::close(ready[0]);
  ::close(ready[1]);
}
