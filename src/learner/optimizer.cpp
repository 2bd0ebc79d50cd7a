#include "rlx/learner/optimizer.hpp"

#include <ATen/Parallel.h>
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
  Slot s{param, decay_mask, at::zeros_like(param.detach()), at::zeros_like(param.detach()), {}};
  if (param.is_cuda()) {
    // Runs of equal mask value (the shard's slots: a weight matrix, then a bias, ...).
    const auto mask = decay_mask.to(at::kCPU).contiguous().view({-1});
    const float* m = mask.data_ptr<float>();
    const int64_t n = mask.numel();
    for (int64_t i = 0; i < n;) {
      int64_t j = i + 1;
      while (j < n && (m[j] != 0) == (m[i] != 0)) ++j;
      s.runs.emplace_back(i, j - i, m[i] != 0);
      i = j;
    }
  }
  slots_.push_back(std::move(s));
}

namespace {

// One pass over a CPU shard: the same update as the tensor ops below, element by element,
// with the gradient scaled (clipped) on the way in.
void adamw_cpu(const at::Tensor& param, const at::Tensor& grad, const AdamW::Slot& s, const AdamWOptions& o,
               double lr, double step_size, double bc2_sqrt, double grad_scale) {
  float* p = param.data_ptr<float>();
  const float* g = grad.defined() ? grad.data_ptr<float>() : nullptr;
  float* m = s.exp_avg.data_ptr<float>();
  float* v = s.exp_avg_sq.data_ptr<float>();
  const float* mask = s.decay_mask.data_ptr<float>();
  const auto decay = static_cast<float>(lr * o.weight_decay), b1 = static_cast<float>(o.beta1),
             b2 = static_cast<float>(o.beta2), gs = static_cast<float>(grad_scale),
             ss = static_cast<float>(step_size), bc2 = static_cast<float>(bc2_sqrt), eps = static_cast<float>(o.eps);
  at::parallel_for(0, param.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = g ? g[i] * gs : 0.0f;
      float pi = p[i];
      if (decay != 0.0f) pi *= 1.0f - decay * mask[i];
      const float mi = m[i] * b1 + gi * (1.0f - b1);
      const float vi = v[i] * b2 + gi * gi * (1.0f - b2);
      m[i] = mi;
      v[i] = vi;
      p[i] = pi - ss * mi / (std::sqrt(vi) / bc2 + eps);
    }
  });
}

}  // namespace

bool AdamW::step_fused([[maybe_unused]] double lr, [[maybe_unused]] double grad_scale,
                       [[maybe_unused]] std::vector<bool>& done) {
#if RLX_WITH_CUDA && RLX_TORCH_AT_LEAST(2, 2)
  // Views of every CUDA slot's runs, decay runs in one list and the others in another.
  std::array<std::array<std::vector<at::Tensor>, 4>, 2> lists;  // [decay][param, grad, m, v]
  at::Device device = at::kCPU;
  for (size_t i = 0; i < slots_.size(); ++i) {
    auto& s = slots_[i];
    if (!s.param.is_cuda() || s.runs.empty() || (device.is_cuda() && s.param.device() != device)) continue;
    device = s.param.device();
    auto p = s.param.detach().view({-1});
    auto g = s.param.grad().defined() ? s.param.grad().view({-1}) : at::zeros_like(p);
    for (const auto& [start, len, decay] : s.runs) {
      auto& l = lists[decay ? 1 : 0];
      l[0].push_back(p.narrow(0, start, len));
      l[1].push_back(g.narrow(0, start, len));
      l[2].push_back(s.exp_avg.view({-1}).narrow(0, start, len));
      l[3].push_back(s.exp_avg_sq.view({-1}).narrow(0, start, len));
    }
    done[i] = true;
  }
  if (!device.is_cuda()) return false;
  auto fopts = at::TensorOptions().dtype(at::kFloat).device(device);
  if (!device_step_.defined() || device_step_.device() != device) device_step_ = at::zeros({}, fopts);
  device_step_.fill_(static_cast<double>(step_));
  // The kernel divides gradients by grad_scale (AMP's unscale): the clip factor's inverse.
  const auto unscale = at::full({}, 1.0 / grad_scale, fopts);
  for (int decay = 0; decay < 2; ++decay) {
    auto& l = lists[static_cast<size_t>(decay)];
    if (l[0].empty()) continue;
    const std::vector<at::Tensor> steps(l[0].size(), device_step_);
    at::_fused_adamw_(l[0], l[1], l[2], l[3], /*max_exp_avg_sqs=*/{}, steps, lr, opt_.beta1, opt_.beta2,
                      decay ? opt_.weight_decay : 0.0, opt_.eps, /*amsgrad=*/false, /*maximize=*/false, unscale,
                      /*found_inf=*/{});
  }
  return true;
#else
  return false;
#endif
}

void AdamW::step(double lr, double grad_scale) {
  c10::NoGradGuard no_grad;
  ++step_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(step_));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, static_cast<double>(step_)));
  const double step_size = lr / bc1;
  std::vector<bool> done(slots_.size(), false);
  step_fused(lr, grad_scale, done);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (done[i]) continue;
    auto& s = slots_[i];
    auto p = s.param.detach();
    auto g = s.param.grad();
    if (p.is_cpu() && p.is_contiguous() && (!g.defined() || g.is_contiguous()) && s.exp_avg.is_contiguous() &&
        s.exp_avg_sq.is_contiguous() && s.decay_mask.is_contiguous()) {
      adamw_cpu(p, g, s, opt_, lr, step_size, bc2_sqrt, grad_scale);
      p.unsafeGetTensorImpl()->bump_version();  // written through a pointer: say it changed, as an op would
      continue;
    }
    if (!g.defined()) g = at::zeros_like(p);
    if (grad_scale != 1.0) g = g * grad_scale;
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
  // Blocks of a fixed size, each summed in order in fp64, then the block sums in order: the
  // same result on any thread count.
  constexpr int64_t kBlock = 1 << 14;
  double sum = 0;
  std::vector<at::Tensor> others;  // not CPU fp32: LibTorch's multi-tensor norm
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    if (!(g.is_cpu() && g.scalar_type() == at::kFloat && g.is_contiguous())) {
      others.push_back(g);
      continue;
    }
    const float* d = g.data_ptr<float>();
    const int64_t n = g.numel(), blocks = (n + kBlock - 1) / kBlock;
    std::vector<double> partial(static_cast<size_t>(blocks));
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        double acc = 0;
        for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) acc += static_cast<double>(d[i]) * d[i];
        partial[static_cast<size_t>(b)] = acc;
      }
    });
    for (double x : partial) sum += x;
  }
  if (!others.empty()) {
    // Per-device lists (the multi-tensor kernel takes one device), each one sync.
    while (!others.empty()) {
      const auto device = others.front().device();
      std::vector<at::Tensor> same;
      std::erase_if(others, [&](const at::Tensor& g) {
        if (g.device() != device) return false;
        same.push_back(g);
        return true;
      });
      auto norms = at::_foreach_norm(same, 2);
      for (auto& n : norms) n = n.to(at::kDouble);
      sum += at::stack(norms).pow(2).sum().item<double>();
    }
  }
  return sum;
}

double clip_factor(double total_norm, double max_norm) {
  return max_norm > 0 ? std::min(1.0, max_norm / (total_norm + 1e-6)) : 1.0;
}

}  // namespace rlx
