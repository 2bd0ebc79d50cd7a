#include "rlx/model/safetensors.hpp"

#include <nlohmann/json.hpp>

#include "../helpers.hpp"
#include "rlx/core/rng.hpp"

using Catch::Matchers::Contains;
using rlx::test::TempDir;

namespace {
// A safetensors image from a header string and raw data.
std::string image(const std::string& header, const std::string& data, std::optional<uint64_t> claimed = {}) {
  uint64_t n = claimed.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}
std::string parse_error(const std::string& file) {
  return rlx::test::error_of([&] {
    rlx::parse_safetensors({reinterpret_cast<const std::byte*>(file.data()), file.size()}, "t.safetensors");
  });
}
}  // namespace

TEST_CASE("safetensors: save then load is bit-exact for every dtype and shape", "[safetensors]") {
  TempDir dir;
  at::manual_seed(0);
  std::vector<std::pair<std::string, at::Tensor>> ts = {
      {"f32", at::randn({3, 5})},
      {"bf16", at::randn({7}).to(at::kBFloat16)},
      {"f16", at::randn({2, 2, 2}).to(at::kHalf)},
      {"f64", at::randn({4}, at::kDouble)},
      {"i64", at::randint(-1000, 1000, {6}, at::kLong)},
      {"i32", at::randint(-1000, 1000, {6}, at::kInt)},
      {"i8", at::randint(-100, 100, {3}, at::kChar)},
      {"u8", at::randint(0, 255, {9}, at::kByte)},
      {"bool", at::randint(0, 2, {5}, at::kLong).to(at::kBool)},
      {"scalar", at::tensor(3.5f)},
      {"empty", at::zeros({0, 4})},
      {"non_contiguous", at::randn({4, 3}).t()},
  };
  rlx::save_safetensors(dir / "a.safetensors", ts, {{"format", "pt"}, {"note", "x"}});
  auto f = rlx::SafetensorsFile::open(dir / "a.safetensors");
  CHECK(f.header().metadata.at("format") == "pt");
  CHECK(f.header().data_offset % 8 == 0);
  for (auto& [name, t] : ts) {
    INFO(name);
    auto back = f.tensor(name);
    CHECK(back.scalar_type() == t.scalar_type());
    CHECK(back.sizes() == t.sizes());
    CHECK(at::equal(back, t.contiguous()));
  }
  CHECK_THROWS_WITH(f.tensor("nope"), Contains("no tensor named 'nope'"));
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("safetensors: a tensor outlives its file object (mapping kept alive)", "[safetensors]") {
  TempDir dir;
  auto t = at::arange(16, at::kFloat);
  rlx::save_safetensors(dir / "b.safetensors", {{"x", t}});
  at::Tensor view;
  { view = rlx::SafetensorsFile::open(dir / "b.safetensors").tensor("x"); }
  CHECK(at::equal(view, t));
  view.add_(1);  // private mapping: writable, and the file is untouched
  CHECK(at::equal(rlx::SafetensorsFile::open(dir / "b.safetensors").tensor("x"), t));
}

TEST_CASE("safetensors: unaligned data is copied, not misread", "[safetensors]") {
  // Header of odd length so the F32 data starts at an address that is not 4-aligned.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  if (header.size() % 4 == 0) header += " ";
  float vals[2] = {1.5f, -2.25f};
  std::string data(reinterpret_cast<const char*>(vals), 8);
  TempDir dir;
  rlx::test::write_file(dir / "u.safetensors", image(header, data));
  auto t = rlx::SafetensorsFile::open(dir / "u.safetensors").tensor("x");
  CHECK(t[0].item<float>() == 1.5f);
  CHECK(t[1].item<float>() == -2.25f);
}

TEST_CASE("safetensors: malformed files are rejected with an error naming the problem", "[safetensors]") {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string d8(8, '\0');
  struct Case {
    std::string name, file, expect;
  };
  std::vector<Case> cases = {
      {"shorter than 8 bytes", std::string(5, '\0'), "shorter than the 8-byte header length"},
      {"header over 100 MB", image("{}", "", 200'000'000), "exceeds the 100000000 byte limit"},
      {"header longer than file", image("{}", "", 1000), "exceeds the 2 bytes after it"},
      {"header not JSON", image("{not json", ""), "not valid JSON"},
      {"header not an object", image("[1,2]   ", ""), "does not start with '{'"},
      {"entry not an object", image(R"({"a":3})", ""), "tensor 'a': entry is not an object"},
      {"unknown dtype", image(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", d8), "unknown dtype 'F31'"},
      {"missing dtype", image(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8), "missing or non-string 'dtype'"},
      {"negative dim", image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8), "not a non-negative integer"},
      {"fractional dim", image(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", d8), "not a non-negative integer"},
      {"size mismatch", image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8), "needs 12 bytes but data_offsets span 8"},
      {"2^62 elements", image(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", d8), "overflows"},
      {"offsets backwards", image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8), "run backwards"},
      {"offsets past the file", image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"), "past the 4 data bytes"},
      {"hole", image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8), "hole of 4 bytes before tensor 'a'"},
      {"overlap", image("{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8), "tensor 'b' overlaps"},
      {"trailing bytes", image("{" + ok_entry + "}", d8 + "xx"), "cover 8 data bytes but the file has 10"},
      {"duplicate name", image("{" + ok_entry + "," + ok_entry + "}", d8), "tensor 'a' appears twice"},
      {"metadata not strings", image(R"({"__metadata__":{"k":1}})", ""), "__metadata__ value of 'k' is not a string"},
      {"unknown field", image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", d8), "unknown field 'x'"},
      {"three offsets", image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", d8), "array of two integers"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    auto msg = parse_error(c.file);
    CHECK_THAT(msg, Contains("t.safetensors: invalid safetensors"));
    CHECK_THAT(msg, Contains(c.expect));
  }
  // And a well-formed one passes.
  CHECK(parse_error(image("{" + ok_entry + "}", d8)).empty());
}

TEST_CASE("safetensors: random corruption never crashes (fixed-seed mutation fuzz)", "[safetensors]") {
  TempDir dir;
  rlx::save_safetensors(dir / "v.safetensors", {{"a", at::randn({3, 4})}, {"b", at::arange(5)}}, {{"format", "pt"}});
  const std::string valid = rlx::test::read_file(dir / "v.safetensors");
  rlx::RngStream rng(2026);
  int rejected = 0, accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string f = valid;
    const int edits = 1 + static_cast<int>(rng.uniform_int(0, 3));
    for (int e = 0; e < edits && !f.empty(); ++e) {
      switch (rng.uniform_int(0, 2)) {
        case 0:  // flip a byte (biased toward the header, where the structure is)
          f[static_cast<size_t>(rng.uniform_int(0, std::min<int64_t>(static_cast<int64_t>(f.size()) - 1, 200)))] ^=
              static_cast<char>(rng.uniform_int(1, 255));
          break;
        case 1: f.resize(static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(f.size())))); break;
        default: f.insert(static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(f.size()))), "9"); break;
      }
    }
    try {
      auto h = rlx::parse_safetensors({reinterpret_cast<const std::byte*>(f.data()), f.size()}, "fuzz");
      // Whatever parses must satisfy the invariants.
      uint64_t end = 0;
      for (auto& e : h.entries) {
        REQUIRE(e.begin == end);
        end = e.end;
      }
      REQUIRE(end == f.size() - h.data_offset);
      ++accepted;
    } catch (const rlx::Error&) {
      ++rejected;
    }
  }
  CHECK(rejected > 2000);
  CHECK(accepted + rejected == 3000);
}
