// The sampler/learner mismatch measured every step: each trained token's log(old /
// behaviour) counted in fixed bins, as sums (so micro-batches and ranks add up like every
// other metric), turned into ratio quantiles at the end of the step.
//
//   add_mismatch_histogram(log_ratio, mask, sums);    // per micro-batch
//   add_mismatch_quantiles(summed, out);              // mismatch_ratio_p01 / p50 / p99
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "rlx/core/metric_sums.hpp"

namespace rlx::algo {

// The histogram's metric names (mismatch_lr_bin_00 ...), for metric_names().
const std::vector<std::string>& mismatch_bin_names();
// Adds the masked tokens' log ratios to the bins of `sums`.
void add_mismatch_histogram(const at::Tensor& log_ratio, const at::Tensor& mask, MetricSums& sums);
// The ratio at quantile q in [0, 1] of the summed bins: linear in log ratio inside a bin, the
// outer bins at their finite edge (ratios beyond e^-3 and e^3 read as those). NaN without tokens.
double mismatch_ratio_quantile(const std::map<std::string, double>& sums, double q);
// mismatch_ratio_p01, _p50 and _p99 into `out` when `sums` holds bins.
void add_mismatch_quantiles(const std::map<std::string, double>& sums, std::map<std::string, double>& out);

}  // namespace rlx::algo
