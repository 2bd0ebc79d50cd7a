#include "rlx/algo/advantages.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"

namespace rlx::algo {

GroupBaseline group_baseline_from_string(const std::string& s) {
  return config::parse_enum<GroupBaseline>(s, "group baseline");
}

std::vector<double> group_advantages(const std::vector<double>& r, GroupBaseline baseline, double eps) {
  const size_t n = r.size();
  std::vector<double> out(n, 0.0);
  if (baseline == GroupBaseline::none) return r;
  if (n < 2) return out;
  const double mean = std::accumulate(r.begin(), r.end(), 0.0) / static_cast<double>(n);
  double var = 0;
  for (double x : r) var += (x - mean) * (x - mean);
  const double std = std::sqrt(var / static_cast<double>(n - 1));
  for (size_t i = 0; i < n; ++i) {
    switch (baseline) {
      case GroupBaseline::mean_std: out[i] = (r[i] - mean) / (std + eps); break;
      case GroupBaseline::mean: out[i] = r[i] - mean; break;
      case GroupBaseline::rloo: out[i] = static_cast<double>(n) / static_cast<double>(n - 1) * (r[i] - mean); break;
      case GroupBaseline::none: break;
    }
  }
  return out;
}

std::pair<double, double> weighted_mean_std(const std::vector<double>& values, const std::vector<double>& weights,
                                            const AllReduceSum& all_reduce) {
  RLX_CHECK(values.size() == weights.size(), "weighted_mean_std: {} values, {} weights", values.size(), weights.size());
  std::vector<double> sums{0, 0, 0};  // weight, sum, sum of squares
  for (size_t i = 0; i < values.size(); ++i) {
    sums[0] += weights[i];
    sums[1] += weights[i] * values[i];
    sums[2] += weights[i] * values[i] * values[i];
  }
  if (all_reduce) all_reduce(sums);
  if (sums[0] <= 0) return {0.0, 0.0};
  const double mean = sums[1] / sums[0];
  if (sums[0] < 2) return {mean, 0.0};
  return {mean, std::sqrt(std::max(0.0, (sums[2] - sums[0] * mean * mean) / (sums[0] - 1)))};
}

std::pair<at::Tensor, at::Tensor> gae(const at::Tensor& rewards, const at::Tensor& values, double gamma, double lambda) {
  RLX_CHECK(rewards.dim() == 1 && values.sizes() == rewards.sizes(), "gae: rewards and values must be [T] alike");
  auto r = rewards.to(at::kDouble), v = values.to(at::kDouble);
  const int64_t T = r.size(0);
  auto adv = at::zeros({T}, at::kDouble);
  auto ra = r.accessor<double, 1>(), va = v.accessor<double, 1>(), aa = adv.accessor<double, 1>();
  double next_adv = 0, next_value = 0;
  for (int64_t t = T - 1; t >= 0; --t) {
    const double delta = ra[t] + gamma * next_value - va[t];
    next_adv = delta + gamma * lambda * next_adv;
    aa[t] = next_adv;
    next_value = va[t];
  }
  auto ret = adv + v;
  return {adv.to(rewards.scalar_type()), ret.to(rewards.scalar_type())};
}

at::Tensor discounted_returns(const at::Tensor& rewards, double gamma) {
  RLX_CHECK(rewards.dim() == 1, "discounted_returns: rewards must be [T]");
  auto r = rewards.to(at::kDouble);
  auto out = at::zeros_like(r);
  auto ra = r.accessor<double, 1>(), oa = out.accessor<double, 1>();
  double acc = 0;
  for (int64_t t = r.size(0) - 1; t >= 0; --t) {
    acc = ra[t] + gamma * acc;
    oa[t] = acc;
  }
  return out.to(rewards.scalar_type());
}

at::Tensor whiten(const at::Tensor& x, const at::Tensor& mask, bool shift_mean, double eps) {
  auto m = mask.to(x.scalar_type());
  const double n = m.sum().item<double>();
  if (n < 2) return x * m;
  const double mean = (x * m).sum().item<double>() / n;
  const double var = ((x - mean).pow(2) * m).sum().item<double>() / (n - 1);
  auto centred = shift_mean ? x - mean : x;
  return centred / (std::sqrt(var) + eps) * m;
}

double overlong_penalty(int64_t length, int64_t max_length, int64_t buffer) {
  RLX_CHECK(buffer >= 0 && buffer <= max_length, "overlong penalty: buffer {} must be in [0, max_length {}]", buffer,
            max_length);
  const int64_t start = max_length - buffer;
  if (length <= start) return 0.0;
  if (length > max_length || buffer == 0) return -1.0;
  return static_cast<double>(start - length) / static_cast<double>(buffer);
}

}  // namespace rlx::algo
