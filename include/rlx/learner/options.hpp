// The `learner:` section of a run config: torch-free, so reading a config compiles no
// ATen. learner_options() (learner.hpp) turns it into LearnerOptions.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>

#include "rlx/core/config.hpp"
#include "rlx/model/config.hpp"

namespace rlx {

enum class LrScheduleKind { constant, linear_warmup, cosine };
constexpr std::array<std::pair<LrScheduleKind, std::string_view>, 3> enum_names(LrScheduleKind) {
  return {{{LrScheduleKind::constant, "constant"},
           {LrScheduleKind::linear_warmup, "linear_warmup"},
           {LrScheduleKind::cosine, "cosine"}}};
}


struct LearnerSection {
  double lr = 1e-6;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  LrScheduleKind schedule = LrScheduleKind::constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr_ratio = 0.0;
  double max_grad_norm = 1.0;
  int64_t micro_batch_tokens = 8192;
  int64_t row_tokens = 2048;
  bool pack = true;
  bool share_prefix = true;
  DType compute_dtype = DType::float32;
  DType reduce_dtype = DType::float32;
  bool activation_checkpointing = false;
  int checkpoint_keep_last = 3;
  int64_t checkpoint_every = 0;
  bool prefetch_batch = false;
  double router_aux_loss_coef = 0.0;

  template <class V>
  void visit(V& v) {
    v("lr", lr, "peak learning rate (AdamW)", config::at_least(0));
    v("beta1", beta1, "AdamW beta1", config::in_range(0, 0.999999));
    v("beta2", beta2, "AdamW beta2", config::in_range(0, 0.999999));
    v("eps", eps, "AdamW epsilon", config::greater_than(0));
    v("weight_decay", weight_decay, "decoupled weight decay on matrices (not norms or biases)", config::at_least(0));
    v("schedule", schedule, "learning-rate schedule: constant, linear_warmup, cosine");
    v("warmup_steps", warmup_steps, "linear warmup steps (every schedule)", config::at_least(0));
    v("total_steps", total_steps, "cosine: the step at which the rate reaches min_lr_ratio x lr", config::at_least(0));
    v("min_lr_ratio", min_lr_ratio, "cosine floor as a fraction of lr", config::in_range(0, 1));
    v("max_grad_norm", max_grad_norm, "clip gradients by their global norm; 0 off", config::at_least(0));
    v("micro_batch_tokens", micro_batch_tokens, "tokens per micro-batch, padding included (gradient accumulation above)",
      config::at_least(1));
    v("row_tokens", row_tokens, "longest packed row (and longest sequence)", config::at_least(1));
    v("pack", pack, "pack several sequences per row (padding-free)");
    v("share_prefix", share_prefix,
      "with pack: sequences that begin with the same untrained tokens (one prompt's samples) share them, packed and "
      "run once");
    v("compute_dtype", compute_dtype, "gathered weights and activations (bfloat16 on CUDA); masters stay fp32");
    v("reduce_dtype", reduce_dtype, "gradients while reduce-scattered (float32 or bfloat16)");
    v("activation_checkpointing", activation_checkpointing, "recompute each block in backward");
    v("checkpoint_keep_last", checkpoint_keep_last, "complete checkpoints kept", config::in_range(1, 1000));
    v("checkpoint_every", checkpoint_every, "save every N steps; 0: only at the end", config::at_least(0));
    v("prefetch_batch", prefetch_batch,
      "ask the hub for the next batch while training this one (it holds only groups still within "
      "hub.replay.max_staleness of the version it will be trained with)");
    v("router_aux_loss_coef", router_aux_loss_coef,
      "mixture-of-experts models: weight of the router's load-balancing loss (HF's definition) in training; 0 off, "
      "as RL recipes keep it", config::at_least(0));
  }
  void validate() const {
    RLX_CHECK(micro_batch_tokens >= row_tokens, "learner.micro_batch_tokens ({}) must be >= learner.row_tokens ({})",
              micro_batch_tokens, row_tokens);
    RLX_CHECK(schedule != LrScheduleKind::cosine || total_steps > warmup_steps,
              "learner.total_steps ({}) must exceed learner.warmup_steps ({}) for the cosine schedule", total_steps,
              warmup_steps);
    RLX_CHECK(reduce_dtype != DType::float16, "learner.reduce_dtype must be float32 or bfloat16");
  }
};

}  // namespace rlx
