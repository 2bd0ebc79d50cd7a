// Catch2 runner: one intra-op thread, so tests are deterministic and share 2 cores well.
#define CATCH_CONFIG_RUNNER
#include <ATen/Parallel.h>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  at::set_num_threads(1);
  return Catch::Session().run(argc, argv);
}
