#include "rlx/core/hash.hpp"

#include <numeric>
#include <vector>

#include "../helpers.hpp"

// The reference: xxhash's own XXH3, compiled here for baseline x86-64 (or whatever this
// file's flags are), whichever implementation rlx::hash64 picked at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

TEST_CASE("hash64: XXH3-64 on every length, alignment and seed, whichever implementation runs", "[hash]") {
  INFO("implementation: " << rlx::hash64_impl());
  CHECK((rlx::hash64_impl() == "avx512" || rlx::hash64_impl() == "avx2" || rlx::hash64_impl() == "portable"));
  // XXH3's published value for no input and seed 0.
  CHECK(rlx::hash64(nullptr, 0) == 0x2D06800538D394C2ULL);
  std::vector<unsigned char> bytes(300000 + 64);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  // Every length through 1 KiB covers XXH3's short, medium and long paths and each tail;
  // then lengths around its stripe and block sizes, and a 280 KB bus frame.
  std::vector<size_t> lengths(1025);
  std::iota(lengths.begin(), lengths.end(), size_t{0});
  for (size_t n : {1023u, 1024u, 1025u, 4095u, 4096u, 65536u + 17, 279240u, 300000u}) lengths.push_back(n);
  for (size_t n : lengths)
    for (size_t offset : {size_t{0}, size_t{1}, size_t{7}, size_t{63}})
      for (uint64_t seed : {uint64_t{0}, uint64_t{5}, ~uint64_t{0}}) {
        const auto* p = bytes.data() + offset;
        REQUIRE(rlx::hash64(p, n, seed) == XXH3_64bits_withSeed(p, n, seed));
      }
  // A changed byte changes the value.
  const uint64_t before = rlx::hash64(bytes.data(), 279240);
  bytes[140000] ^= 1;
  CHECK(rlx::hash64(bytes.data(), 279240) != before);
}
