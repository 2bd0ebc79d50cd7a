// Catch2 runner: one compute thread, so tests are deterministic and share 2 cores well.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "rlx/core/threads.hpp"

int main(int argc, char** argv) {
  rlx::prepare_blas(argv);  // the kernels `rlx` itself uses on this CPU
  rlx::set_compute_threads(1);
  return Catch::Session().run(argc, argv);
}
