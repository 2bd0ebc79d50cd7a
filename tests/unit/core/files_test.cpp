#include "rlx/core/files.hpp"

#include <unistd.h>

#include "../helpers.hpp"

namespace fs = std::filesystem;

TEST_CASE("remove_tree removes a tree, not what its symbolic links point to", "[core][files]") {
  rlx::test::TempDir dir;
  const auto outside = dir / "outside.txt";
  rlx::test::write_file(outside, "keep me");
  const auto root = dir / "tree";
  fs::create_directories(root / "a" / "b" / "c");
  rlx::test::write_file(root / "top.txt", "1");
  rlx::test::write_file(root / "a" / "b" / "c" / "deep.txt", "2");
  fs::create_directory_symlink(dir.path, root / "a" / "link-to-dir");
  fs::create_symlink(outside, root / "link-to-file");
  std::error_code ec;
  // tree, a, b, c, top.txt, deep.txt, two links
  CHECK(rlx::remove_tree(root, ec) == 8);
  CHECK_FALSE(ec);
  CHECK_FALSE(fs::exists(root));
  CHECK(rlx::test::read_file(outside) == "keep me");
  // A missing path removes nothing and is no error; a plain file is removed.
  CHECK(rlx::remove_tree(root, ec) == 0);
  CHECK_FALSE(ec);
  CHECK(rlx::remove_tree(outside) == 1);
  CHECK_FALSE(fs::exists(outside));
}

TEST_CASE("remove_tree reports what it cannot remove, naming the path", "[core][files]") {
  rlx::test::TempDir dir;
  const auto root = dir / "tree";
  fs::create_directories(root / "sub");
  rlx::test::write_file(root / "sub" / "f", "x");
  // A path through a regular file cannot be walked.
  std::error_code ec;
  CHECK(rlx::remove_tree(root / "sub" / "f" / "below", ec) == 0);
  CHECK(ec);
  CHECK_THAT(rlx::test::error_of([&] { rlx::remove_tree(root / "sub" / "f" / "below"); }),
             Catch::Matchers::Contains("cannot remove") && Catch::Matchers::Contains("below"));
  CHECK(fs::exists(root / "sub" / "f"));
}

TEST_CASE("AtomicFile: the old file or the whole new one, never a part, and no temporary file left", "[core][files]") {
  rlx::test::TempDir dir;
  const auto path = dir.path / "state.bin";
  rlx::write_file_atomic(path, "old");
  auto entries = [&] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path)) ++n;
    return n;
  };
  {
    rlx::AtomicFile f(path);
    f.write("new, in ");
    CHECK(rlx::read_file(path, 100) == "old");  // a reader mid-write sees the old file
    f.write("two parts");
  }  // never committed (an exception): the old file stays, the temporary goes
  CHECK(rlx::read_file(path, 100) == "old");
  CHECK(entries() == 1);
  {
    rlx::AtomicFile f(path, /*durable=*/false);
    f.write("new");
    f.write(std::string(3, '!'));
    f.commit();
    CHECK_THROWS_WITH(f.write("more"), Catch::Contains("after commit"));
  }
  CHECK(rlx::read_file(path, 100) == "new!!!");
  CHECK(entries() == 1);
  CHECK_THROWS_WITH(rlx::AtomicFile(dir.path / "missing" / "x"), Catch::Contains("open failed"));
}
