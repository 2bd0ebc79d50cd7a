#include "rlx/core/threads.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace rlx {

std::string ThreadPlan::describe() const {
  return blas_threads > 0 ? fmt::format("{} OpenBLAS threads, {} intra-op", blas_threads, intra_op_threads)
                          : fmt::format("{} intra-op threads", intra_op_threads);
}

ThreadPlan set_compute_threads(int threads) {
  const int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPlan plan;
  // Looked up at run time: LibTorch builds without OpenBLAS (MKL, CUDA wheels) do not have it.
  using SetThreads = void (*)(int);
  if (auto set_blas = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_blas(n);
    plan.blas_threads = n;
    plan.intra_op_threads = 1;
  } else {
    plan.intra_op_threads = n;
  }
  at::set_num_threads(plan.intra_op_threads);
  return plan;
}

}  // namespace rlx
