// Who maps a CUDA IPC publisher's device buffers right now (private to src/dist): a table of
// process ids in the shared segment. CUDA leaves it undefined what an importer reads once
// the exporter frees a buffer it still has open (cudaIpcOpenMemHandle), so a subscriber
// holds an entry only while it copies a version (open, copy, close), and a publisher that
// shuts down waits, bounded, until no live process holds one before it frees the buffers.
// Plain atomics and kill(pid, 0): testable on any machine.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace rlx::dist::detail {

inline constexpr int kMaxImporters = 64;

struct ImporterTable {
  std::atomic<int32_t> pid[kMaxImporters];  // 0: free
};

inline bool process_alive(int32_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// Takes a free entry, or one left by a process that is gone, for `pid`; -1 when every entry
// is held by a live process.
inline int claim_importer(ImporterTable& t, int32_t pid) {
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < kMaxImporters; ++i) {
      int32_t seen = t.pid[i].load(std::memory_order_acquire);
      if (seen != 0 && (pass == 0 || process_alive(seen))) continue;  // first pass: free ones only
      if (t.pid[i].compare_exchange_strong(seen, pid, std::memory_order_acq_rel)) return i;
    }
  return -1;
}

inline void release_importer(ImporterTable& t, int index, int32_t pid) {
  if (index < 0 || index >= kMaxImporters) return;
  int32_t expected = pid;
  t.pid[index].compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
}

// The live processes holding an entry.
inline std::vector<int32_t> importer_holders(const ImporterTable& t) {
  std::vector<int32_t> out;
  for (int i = 0; i < kMaxImporters; ++i)
    if (const int32_t p = t.pid[i].load(std::memory_order_acquire); p != 0 && process_alive(p)) out.push_back(p);
  return out;
}

// Waits until no live process holds an entry, at most `timeout_s`; returns those still holding one.
inline std::vector<int32_t> wait_importers_released(const ImporterTable& t, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    auto left = importer_holders(t);
    if (left.empty() || std::chrono::steady_clock::now() >= deadline) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace rlx::dist::detail
