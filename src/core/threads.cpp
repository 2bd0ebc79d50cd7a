#include "rlx/core/threads.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
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

std::string blas_core_name() {
  using CoreName = char* (*)();
  auto name = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return name ? std::string(name()) : std::string();
}

namespace {
void use_blas_kernels_for_this_cpu(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || blas_core_name() != "Prescott") return;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    core = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    core = "Haswell";
  if (core == nullptr) return;
  ::setenv("OPENBLAS_CORETYPE", core, 1);
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): go on with the generic kernels, as before.
  ::unsetenv("OPENBLAS_CORETYPE");
#else
  (void)argv;
#endif
}
}  // namespace

void prepare_blas(char** argv) {
  use_blas_kernels_for_this_cpu(argv);
  // After the re-execution above, so this process keeps OpenBLAS's own thread count.
  ::setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
}

}  // namespace rlx
