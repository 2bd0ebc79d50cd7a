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
