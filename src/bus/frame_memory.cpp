// keep_frame_memory (hub.hpp): how malloc serves the bus's frames in every role's process.
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "rlx/bus/hub.hpp"
#include "rlx/core/log.hpp"

namespace rlx::bus {

void keep_frame_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::mallopt(M_MMAP_THRESHOLD, 64 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
    ::mallopt(M_ARENA_MAX, 1);
    if (std::getenv("RLX_NO_HUGE_HEAP")) return;
    constexpr size_t kPad = size_t{512} << 20, kHuge = size_t{2} << 20;
    // More than all the free memory the heap holds, so no free chunk can serve it and the
    // heap must grow, by it and the pad. The mmap threshold is raised meanwhile, so that
    // the request is not served by an mmap instead (a process that freed much before).
    const size_t request = ::mallinfo2().fordblks + 4096;
    if (request >= (size_t{1} << 30)) return;  // a heap with a GiB free: leave it as it is
    ::mallopt(M_MMAP_THRESHOLD, 1 << 30);
    ::mallopt(M_TOP_PAD, static_cast<int>(kPad));
    auto* before = static_cast<char*>(::sbrk(0));
    void* volatile grow = ::malloc(request);
    ::free(grow);  // volatile: the pair is kept by the optimizer
    auto* after = static_cast<char*>(::sbrk(0));
    ::mallopt(M_TOP_PAD, 128 << 10);  // glibc's default again
    ::mallopt(M_MMAP_THRESHOLD, 64 << 20);
    auto* from = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(before) + kHuge - 1) & ~(kHuge - 1));
    if (after > from) ::madvise(from, static_cast<size_t>(after - from), MADV_HUGEPAGE);
  });
}

}  // namespace rlx::bus
