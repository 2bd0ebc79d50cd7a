// What the environment tests share: the GPT-2 tokenizer fixture (byte-level: any text
// round-trips) and a registry holding the bundled environments.
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>
#include <mutex>

#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/model/tokenizer.hpp"
#include "test_paths.hpp"

namespace rlx::test {

inline const rlx::Tokenizer& gpt2() {
  static const auto tok = [] {
    const auto path = std::filesystem::path(rlx::test_paths::kFixtureDir) / "gpt2" / "tokenizer.json";
    if (!std::filesystem::exists(path)) FAIL("missing " << path << " (scripts/test.sh makes the tokenizer fixtures)");
    return rlx::load_tokenizer(path);
  }();
  return *tok;
}

inline rlx::env::Registry& bundled_registry() {
  static rlx::env::Registry r;
  static std::once_flag once;
  std::call_once(once, [] { rlx::env::register_bundled(r); });
  return r;
}

}  // namespace rlx::test
