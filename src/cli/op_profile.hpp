// Where a step's time goes, by operator: LibTorch's legacy profiler around a region, its
// events folded into self and total time per operator name. On a GPU (start(true)) each
// operator's device time too, from the CUDA events the profiler records at its start and
// end (the kernels it queued, as the stream ran them). The benches use it (`rlx bench
// learner --profile N`) to find the per-step costs worth removing.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace rlx::cli {

struct OpTime {
  std::string name;
  int64_t calls = 0;
  double self_us = 0;   // time in the operator, not in the operators it called
  double total_us = 0;  // including them (outermost calls only: a recursion counts once)
  double self_device_us = 0;  // on the GPU: between its CUDA events, less its callees'
};

class OpProfile {
 public:
  void start(bool cuda = false);  // profile this thread (and the tasks it launches)
  std::vector<OpTime> stop();     // by self time (on the GPU: device self time), largest first
  // The `top` operators, times and calls divided by `per` (e.g. per step), and the sum of
  // all operators' self time as a last row named "(all)".
  static nlohmann::json to_json(const std::vector<OpTime>& ops, size_t top, double per = 1);
  static std::string table(const nlohmann::json& rows);

 private:
  bool cuda_ = false;
};

// A kernel-level trace: LibTorch's Kineto profiler (CUPTI on a GPU), which sees each kernel a
// CUDA graph replays (the operator profile above sees one replay). stop(dir) writes
// DIR/kernels.csv (name, launches, total and mean microseconds, largest total first: the
// device's kernels and copies, or the CPU operators where no device ran) and, where this
// LibTorch was built with Kineto, DIR/trace.json (Chrome trace format); it returns a
// summary for the bench's JSON. Used by `rlx bench sampler --trace` and `rlx bench learner
// --trace`.
class KernelTrace {
 public:
  void start(bool cuda);
  nlohmann::json stop(const std::string& dir, double per = 1);
};

}  // namespace rlx::cli
