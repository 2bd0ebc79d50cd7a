#include "rlx/core/hash.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

// RLX_HASH_X86: hash_avx2.cpp and hash_avx512.cpp are built (x86-64, by CMake) with their
// instruction sets enabled; they are called only where the CPU and the OS support them.
#ifdef RLX_HASH_X86
namespace rlx::detail {
uint64_t hash64_avx2(const void* data, size_t bytes, uint64_t seed);
uint64_t hash64_avx512(const void* data, size_t bytes, uint64_t seed);
}  // namespace rlx::detail
#endif

namespace rlx {
namespace {
using Fn = uint64_t (*)(const void*, size_t, uint64_t);

uint64_t hash64_portable(const void* data, size_t bytes, uint64_t seed) { return XXH3_64bits_withSeed(data, bytes, seed); }

struct Choice {
  Fn fn;
  std::string_view name;
};

Choice choose() {
#ifdef RLX_HASH_X86
  __builtin_cpu_init();
  // libgcc's feature test also checks that the OS saves the vector registers (XCR0).
  if (__builtin_cpu_supports("avx512f")) return {detail::hash64_avx512, "avx512"};
  if (__builtin_cpu_supports("avx2")) return {detail::hash64_avx2, "avx2"};
#endif
  return {hash64_portable, "portable"};
}

const Choice& chosen() {
  static const Choice c = choose();
  return c;
}
}  // namespace

uint64_t hash64(const void* data, size_t bytes, uint64_t seed) { return chosen().fn(data, bytes, seed); }
std::string_view hash64_impl() { return chosen().name; }

}  // namespace rlx
