// See rlx/algo/mismatch_metrics.hpp.
#include "rlx/algo/mismatch_metrics.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>

#include "rlx/core/device_copy.hpp"

namespace rlx::algo {
namespace {

// Bin edges in log ratio, symmetric, finer near 0 where a healthy run's ratios are: 21 bins.
constexpr std::array<double, 20> kEdges{-3,   -1,   -0.3, -0.1, -0.03, -0.01, -3e-3, -1e-3, -3e-4, -1e-4,
                                        1e-4, 3e-4, 1e-3, 3e-3, 0.01,  0.03,  0.1,   0.3,   1,     3};
constexpr size_t kBins = kEdges.size() + 1;

}  // namespace

const std::vector<std::string>& mismatch_bin_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (size_t i = 0; i < kBins; ++i) n.push_back(fmt::format("mismatch_lr_bin_{:02d}", i));
    return n;
  }();
  return names;
}

void add_mismatch_histogram(const at::Tensor& log_ratio, const at::Tensor& mask, MetricSums& sums) {
  const auto edges =
      to_device_async(at::tensor(std::vector<double>(kEdges.begin(), kEdges.end()), at::kFloat), log_ratio.device());
  // bucketize: bin i holds edges[i - 1] < x <= edges[i].
  auto bins = at::bucketize(log_ratio.detach().to(at::kFloat).reshape({-1}), edges);
  auto counts =
      at::zeros({static_cast<int64_t>(kBins)}, at::TensorOptions().dtype(at::kFloat).device(log_ratio.device()))
          .index_add(0, bins, mask.detach().to(at::kFloat).reshape({-1}));
  sums.add(mismatch_bin_names(), counts);
}

double mismatch_ratio_quantile(const std::map<std::string, double>& sums, double q) {
  const auto& names = mismatch_bin_names();
  std::array<double, kBins> n{};
  double total = 0;
  for (size_t i = 0; i < kBins; ++i) {
    auto it = sums.find(names[i]);
    n[i] = it == sums.end() ? 0.0 : it->second;
    total += n[i];
  }
  if (total <= 0) return std::numeric_limits<double>::quiet_NaN();
  const double target = std::clamp(q, 0.0, 1.0) * total;
  double below = 0;
  for (size_t i = 0; i < kBins; ++i) {
    if (n[i] > 0 && below + n[i] >= target) {
      if (i == 0) return std::exp(kEdges.front());
      if (i == kBins - 1) return std::exp(kEdges.back());
      const double lo = kEdges[i - 1], hi = kEdges[i], f = (target - below) / n[i];
      return std::exp(lo + f * (hi - lo));
    }
    below += n[i];
  }
  return std::exp(kEdges.back());
}

void add_mismatch_quantiles(const std::map<std::string, double>& sums, std::map<std::string, double>& out) {
  if (!sums.contains(mismatch_bin_names().front())) return;
  const double p01 = mismatch_ratio_quantile(sums, 0.01);
  if (std::isnan(p01)) return;
  out["mismatch_ratio_p01"] = p01;
  out["mismatch_ratio_p50"] = mismatch_ratio_quantile(sums, 0.5);
  out["mismatch_ratio_p99"] = mismatch_ratio_quantile(sums, 0.99);
}

}  // namespace rlx::algo
