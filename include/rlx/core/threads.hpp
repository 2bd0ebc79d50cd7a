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

// OpenBLAS sets itself up when it loads, before main; this sets up what a process starts
// with. Call it first thing in main, with main's argv.
// - Its kernels: picked by CPU model. A CPU newer than OpenBLAS's table (Debian 12's 0.3.21
//   does not know Intel's family 6 model 207) gets the generic Prescott kernels, SSE3 only.
//   Then this re-executes the process once, with OPENBLAS_CORETYPE naming the kernels the
//   CPU's features run (SkylakeX with AVX-512, Haswell with AVX2 and FMA). Nothing happens
//   when OpenBLAS is not loaded, knew the CPU, or OPENBLAS_CORETYPE is set (so children
//   inherit the choice).
// - Its threads in the processes this one starts: OPENBLAS_NUM_THREADS=1 unless set. At load
//   OpenBLAS starts a thread a core, which spin before they sleep (0.1-0.2 s of CPU a
//   process start, measured); a process that computes asks for its threads
//   (set_compute_threads), which OpenBLAS then starts. This process keeps its own.
void prepare_blas(char** argv);
// OpenBLAS's kernel family ("SkylakeX", "Haswell", "Prescott"), or "" without OpenBLAS.
std::string blas_core_name();

}  // namespace rlx
