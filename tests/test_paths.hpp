#pragma once
// Paths of this build that the tests use. Defined in a source CMake generates
// (tests/test_paths.cpp in the build tree) rather than as compile definitions, so that a
// checkout at another path (CI's fresh clone) takes every test object from ccache.

namespace rlx::test_paths {

extern const char* const kCli;         // the rlx executable
extern const char* const kFixtureDir;  // tokenizer fixtures (scripts/make_tokenizer_fixtures.sh)
extern const char* const kSourceDir;   // the source tree (tests/data)
extern const char* const kDistWorker;  // tests/integration/dist_worker.cpp's executable

}  // namespace rlx::test_paths
