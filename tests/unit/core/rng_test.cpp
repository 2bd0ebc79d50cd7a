#include "rlx/core/rng.hpp"

#include <cmath>
#include <numbers>
#include <vector>

#include "../helpers.hpp"

using rlx::RngStream;

TEST_CASE("rng: Philox4x32-10 matches the Random123 known-answer vectors", "[rng]") {
  // kat_vectors from Random123 (Salmon et al.): philox4x32 with 10 rounds.
  CHECK(rlx::philox4x32({0, 0, 0, 0}, {0, 0}) == rlx::PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(rlx::philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        rlx::PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(rlx::philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        rlx::PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("rng: same seed and stream give the same numbers, others differ", "[rng]") {
  RngStream a(42, 1), b(42, 1), c(42, 2), d(43, 1);
  std::vector<uint64_t> va, vb, vc, vd;
  for (int i = 0; i < 100; ++i) va.push_back(a.next_u64()), vb.push_back(b.next_u64()), vc.push_back(c.next_u64()),
                                 vd.push_back(d.next_u64());
  CHECK(va == vb);
  CHECK(va != vc);
  CHECK(va != vd);
}

TEST_CASE("rng: a saved state resumes the stream exactly", "[rng]") {
  RngStream a(7);
  for (int i = 0; i < 13; ++i) a.uniform();  // an odd number of words: mid-block
  auto saved = a.state();
  std::vector<double> expected;
  for (int i = 0; i < 50; ++i) expected.push_back(a.normal());
  RngStream b(999);
  b.restore(saved);
  for (int i = 0; i < 50; ++i) CHECK(b.normal() == expected[static_cast<size_t>(i)]);

  a.restore(saved);
  auto text = a.serialize();
  auto c = RngStream::deserialize(text);
  CHECK(c.state() == saved);
  CHECK_THROWS_AS(RngStream::deserialize("1 2"), rlx::Error);
  CHECK_THROWS_AS(RngStream::deserialize("1 2 3 junk"), rlx::Error);
}

TEST_CASE("rng: fork derives independent, reproducible streams without consuming", "[rng]") {
  RngStream root(5);
  auto before = root.state();
  auto x1 = root.fork("shuffle"), x2 = root.fork("shuffle"), y = root.fork("dropout");
  CHECK(root.state() == before);
  CHECK(x1.next_u64() == x2.next_u64());
  CHECK(RngStream(root.fork("shuffle")).next_u64() != y.next_u64());
}

TEST_CASE("rng: distributions have the right moments (fixed seed, wide bounds)", "[rng]") {
  RngStream r(123);
  const int n = 200000;
  double sum = 0, sum_sq = 0, nsum = 0, nsum_sq = 0;
  int64_t lo = 0, hi = 0;
  std::vector<int> counts(6, 0);
  for (int i = 0; i < n; ++i) {
    double u = r.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u, sum_sq += u * u;
    double z = r.normal();
    nsum += z, nsum_sq += z * z;
    int64_t k = r.uniform_int(-2, 3);
    lo = std::min(lo, k), hi = std::max(hi, k);
    counts[static_cast<size_t>(k + 2)]++;
  }
  // Standard errors are ~0.0006 (uniform mean) and ~0.002 (normal mean): 10x margins.
  CHECK(std::abs(sum / n - 0.5) < 0.01);
  CHECK(std::abs(sum_sq / n - 1.0 / 3) < 0.01);
  CHECK(std::abs(nsum / n) < 0.02);
  CHECK(std::abs(nsum_sq / n - 1.0) < 0.03);
  CHECK(lo == -2);
  CHECK(hi == 3);
  for (int c : counts) CHECK(std::abs(c - n / 6.0) < 0.05 * n / 6.0);
}

TEST_CASE("rng: philox_uniform is addressed, not sequential", "[rng]") {
  double a = rlx::philox_uniform(1, 2, 3, 4);
  CHECK(a == rlx::philox_uniform(1, 2, 3, 4));
  CHECK(a != rlx::philox_uniform(1, 2, 3, 5));
  CHECK(a != rlx::philox_uniform(1, 2, 4, 4));
  CHECK(a != rlx::philox_uniform(2, 2, 3, 4));
  CHECK(a >= 0.0);
  CHECK(a < 1.0);
}

TEST_CASE("rng: fill_normal draws the stream's words in order, from any position, and leaves it after them", "[rng]") {
  for (int skip : {0, 1, 3, 6}) {  // starts inside a Philox block of four words, or at one
    INFO("skip " << skip);
    RngStream a(11, 5), b(11, 5);
    for (int i = 0; i < skip; ++i) a.next_u32(), b.next_u32();
    std::vector<float> fast(9);
    a.fill_normal(fast.data(), fast.size(), 0.5f, 2.0f);
    for (float got : fast) {  // the rule word by word: Box-Muller on two 32-bit uniforms
      const double u1 = (static_cast<double>(b.next_u32()) + 0.5) * 0x1.0p-32;
      const double u2 = static_cast<double>(b.next_u32()) * 0x1.0p-32;
      const float want =
          0.5f + 2.0f * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
      CHECK(got == want);
    }
    CHECK(a.next_u32() == b.next_u32());
  }
}
