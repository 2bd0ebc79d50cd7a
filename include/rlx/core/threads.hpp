// One threading layer per process. Debian's LibTorch runs its GEMMs in OpenBLAS,
// which has its own thread pool; giving both OpenBLAS and LibTorch's OpenMP pool
// N threads oversubscribes the cores (measured on 2 cores: the `small` preset's
// forward 3.4x slower, see docs/PERF.md). With OpenBLAS present, the GEMMs get the
// threads and LibTorch's intra-op pool one; otherwise LibTorch gets them.
//
//   rlx::set_compute_threads(0);   // 0: every core (or a process's share of them)
#pragma once

#include <string>

namespace rlx {

struct ThreadPlan {
  int blas_threads = 0;      // 0: BLAS is not separately threaded
  int intra_op_threads = 1;  // at::set_num_threads
  // Threads doing the work: the larger of the two.
  int threads() const { return blas_threads > intra_op_threads ? blas_threads : intra_op_threads; }
  std::string describe() const;
};

// Applies the plan for `threads` (0: all cores) and returns it.
ThreadPlan set_compute_threads(int threads);

}  // namespace rlx
