#include "rlx/learner/optimizer.hpp"

#include <c10/core/GradMode.h>
#include <cmath>
#include <numbers>

#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx {

void AdamWOptions::validate() const {
  if (!(lr >= 0 && std::isfinite(lr))) throw ConfigError(fmt::format("optimizer.lr must be >= 0, got {}", lr));
  if (!(beta1 >= 0 && beta1 < 1)) throw ConfigError(fmt::format("optimizer.beta1 must be in [0, 1), got {}", beta1));
  if (!(beta2 >= 0 && beta2 < 1)) throw ConfigError(fmt::format("optimizer.beta2 must be in [0, 1), got {}", beta2));
  if (!(eps > 0)) throw ConfigError(fmt::format("optimizer.eps must be > 0, got {}", eps));
  if (!(weight_decay >= 0))
    throw ConfigError(fmt::format("optimizer.weight_decay must be >= 0, got {}", weight_decay));
}

AdamW::AdamW(AdamWOptions options) : opt_(options) { opt_.validate(); }

void AdamW::add(const at::Tensor& param, const at::Tensor& decay_mask) {
  RLX_CHECK(param.scalar_type() == at::kFloat, "AdamW keeps fp32 master weights; got {}",
            c10::toString(param.scalar_type()));
  RLX_CHECK(decay_mask.sizes() == param.sizes(), "AdamW: decay mask shape {} differs from parameter shape {}",
            decay_mask.sizes(), param.sizes());
  c10::NoGradGuard no_grad;
  slots_.push_back({param, decay_mask, at::zeros_like(param.detach()), at::zeros_like(param.detach())});
}

void AdamW::step(double lr) {
  c10::NoGradGuard no_grad;
  ++step_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(step_));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, static_cast<double>(step_)));
  const double step_size = lr / bc1;
  for (auto& s : slots_) {
    auto p = s.param.detach();
    auto g = s.param.grad();
    if (!g.defined()) g = at::zeros_like(p);
    if (opt_.weight_decay != 0) p.mul_(1.0 - (lr * opt_.weight_decay) * s.decay_mask);
    s.exp_avg.mul_(opt_.beta1).add_(g, 1.0 - opt_.beta1);
    s.exp_avg_sq.mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
    auto denom = (s.exp_avg_sq.sqrt() / bc2_sqrt).add_(opt_.eps);
    p.addcdiv_(s.exp_avg, denom, -step_size);
  }
}

void LrSchedule::validate() const {
  if (warmup_steps < 0) throw ConfigError(fmt::format("schedule.warmup_steps must be >= 0, got {}", warmup_steps));
  if (kind == LrScheduleKind::cosine && total_steps <= warmup_steps)
    throw ConfigError(fmt::format("schedule.total_steps ({}) must exceed schedule.warmup_steps ({}) for cosine",
                                  total_steps, warmup_steps));
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    throw ConfigError(fmt::format("schedule.min_lr_ratio must be in [0, 1], got {}", min_lr_ratio));
}

double LrSchedule::at(int64_t step, double peak) const {
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  if (kind != LrScheduleKind::cosine) return peak;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps));
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return peak * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

LrScheduleKind lr_schedule_kind_from_string(const std::string& s) {
  return config::parse_enum<LrScheduleKind>(s, "schedule.kind");
}

double grad_sq_norm(const std::vector<at::Tensor>& params) {
  double sum = 0;
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (g.defined()) sum += g.to(at::kDouble).pow(2).sum().item<double>();
  }
  return sum;
}

double clip_grads(const std::vector<at::Tensor>& params, double total_norm, double max_norm) {
  const double factor = std::min(1.0, max_norm / (total_norm + 1e-6));
  if (factor < 1.0) {
    c10::NoGradGuard no_grad;
    for (const auto& p : params)
      if (p.grad().defined()) p.mutable_grad().mul_(factor);
  }
  return factor;
}

}  // namespace rlx
