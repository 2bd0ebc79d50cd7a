// AdamW on flat fp32 shards, learning-rate schedules, and gradient clipping by the
// global norm across shards.
//
// The update is PyTorch's AdamW (decoupled weight decay, bias-corrected moments),
// element-wise, so a sharded and an unsharded model that see the same gradients take
// the same steps:
//
//   rlx::AdamW opt({.lr = 1e-5, .weight_decay = 0.01});
//   opt.add(shard, decay_mask);                 // once per parameter tensor
//   opt.step(lr_schedule.at(step), clip);       // uses each tensor's .grad() times clip
#pragma once

#include <ATen/ATen.h>

#include "rlx/learner/options.hpp"

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>
#include <string>
#include <tuple>
#include <vector>

namespace rlx {

struct AdamWOptions {
  double lr = 1e-5;            // peak learning rate (the schedule scales it)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;   // decoupled, applied where the decay mask is 1
  void validate() const;       // throws rlx::ConfigError naming the field
};

class AdamW {
 public:
  struct Slot {
    at::Tensor param;       // fp32, updated in place
    at::Tensor decay_mask;  // fp32, same shape: 1 where weight decay applies
    at::Tensor exp_avg, exp_avg_sq;
    // CUDA with LibTorch's fused AdamW: the flat runs of equal mask value, as [start, length)
    // with their decay flag (the fused kernel takes one weight decay per call).
    std::vector<std::tuple<int64_t, int64_t, bool>> runs;
  };

  explicit AdamW(AdamWOptions options);
  void add(const at::Tensor& param, const at::Tensor& decay_mask);

  // One update with learning rate `lr` from every parameter's .grad() times `grad_scale`
  // (the clipping factor; a missing gradient counts as zero). Increments step(). On the
  // CPU one pass over each tensor; on CUDA LibTorch's fused multi-tensor AdamW
  // (`_fused_adamw_`, LibTorch >= 2.2: two launches, decay and no-decay runs as views);
  // elsewhere LibTorch ops.
  void step(double lr, double grad_scale = 1.0);
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  std::vector<Slot>& slots() { return slots_; }
  const AdamWOptions& options() const { return opt_; }

 private:
  // The fused CUDA update of the slots it takes; returns false if it took none.
  bool step_fused(double lr, double grad_scale, std::vector<bool>& done);

  AdamWOptions opt_;
  std::vector<Slot> slots_;
  int64_t step_ = 0;
  at::Tensor device_step_;  // the step count as the fused kernel reads it (one fp32 on the device)
};


struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::constant;
  int64_t warmup_steps = 0;   // linear from 0 to the peak over these steps (all kinds)
  int64_t total_steps = 0;    // cosine: decays to min_lr_ratio * peak at this step
  double min_lr_ratio = 0.0;  // cosine floor, as a fraction of the peak
  void validate() const;
  // The learning rate of optimizer step `step` (0-based) for a peak of `peak`.
  double at(int64_t step, double peak) const;
};

LrScheduleKind lr_schedule_kind_from_string(const std::string& s);

// Sum of squares of the tensors' .grad() (fp64 accumulate, fixed order), this rank's part.
// CPU gradients in one fp64 pass each; the others by `_foreach_norm`, one host sync.
double grad_sq_norm(const std::vector<at::Tensor>& params);
// The clipping factor min(1, max_norm / (total_norm + 1e-6)) (1 when max_norm is 0), which
// AdamW::step takes as its gradient scale.
double clip_factor(double total_norm, double max_norm);

}  // namespace rlx
