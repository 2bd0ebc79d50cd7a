// XXH3-64 compiled for avx512 (this file alone is built with that instruction set; see
// hash.cpp, which calls it only on CPUs that have it). It includes nothing but xxhash, whose
// functions are all static here, so no code built for avx512 can be shared with other files.
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace rlx::detail {
uint64_t hash64_avx512(const void* data, size_t bytes, uint64_t seed) { return XXH3_64bits_withSeed(data, bytes, seed); }
}  // namespace rlx::detail
