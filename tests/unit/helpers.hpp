// Small helpers shared by the unit tests.
#pragma once

#include <unistd.h>

#include <cstdio>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"

namespace rlx::test {

// A fresh directory under the system temp dir, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rlx-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    rlx::remove_tree(path, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

inline void write_file(const std::filesystem::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary);
  out << content;
  REQUIRE(out.good());
}

// The file's bytes: "" when it cannot be opened, and what was read before an error. A /proc
// entry whose process exits mid-read fails with ESRCH, which an ifstream turns into an
// exception (basic_filebuf::underflow).
inline std::string read_file(const std::filesystem::path& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) return {};
  std::string out;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

// The message of the rlx::Error that f throws ("" if it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const rlx::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace rlx::test
