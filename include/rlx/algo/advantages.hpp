// Advantage estimators: per group of samples of one prompt (GRPO, Dr.GRPO, RLOO),
// per token with a critic (GAE), and discounted returns with batch whitening
// (REINFORCE++). Plain numbers in, plain numbers out: no model, no learner.
//
//   auto adv = rlx::algo::group_advantages({1, 0, 0, 1}, rlx::algo::GroupBaseline::mean_std);
//   // {0.866, -0.866, -0.866, 0.866}: (r - mean) / (sample std + eps)
#pragma once

#include <ATen/ATen.h>

#include "rlx/algo/options.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <string>
#include <vector>

namespace rlx::algo {

// A batch's sums across every rank (for batch-wide statistics): sums `values` in place.
using AllReduceSum = std::function<void(std::vector<double>& values)>;

GroupBaseline group_baseline_from_string(const std::string& s);

// One advantage per sample of a group. A group of one has advantage 0 for the
// baselines that need others (mean_std, mean, rloo).
std::vector<double> group_advantages(const std::vector<double>& rewards, GroupBaseline baseline, double eps = 1e-6);

// Generalised advantage estimation over one sequence's T trained steps:
// rewards [T], values [T] (V(s_t)), value after the last step = 0 (terminal).
// Returns {advantages [T], returns [T] = advantages + values}.
std::pair<at::Tensor, at::Tensor> gae(const at::Tensor& rewards, const at::Tensor& values, double gamma, double lambda);

// sum_{k >= t} gamma^(k - t) r_k over one sequence's T steps.
at::Tensor discounted_returns(const at::Tensor& rewards, double gamma);

// (x - mean) / (std + eps) over the entries where mask is 1 (others stay 0); with
// shift_mean false only the scale changes (REINFORCE++ keeps the sign of the return).
at::Tensor whiten(const at::Tensor& x, const at::Tensor& mask, bool shift_mean = true, double eps = 1e-8);

// Mean and unbiased standard deviation of `values` counted with `weights` (one
// weight per value; a REINFORCE++ sample counts once per token), over every rank.
std::pair<double, double> weighted_mean_std(const std::vector<double>& values, const std::vector<double>& weights,
                                            const AllReduceSum& all_reduce);

// DAPO's soft overlong penalty added to the reward of a response of `length` tokens:
// 0 up to max_length - buffer, then linearly down to -1 at max_length, -1 beyond.
double overlong_penalty(int64_t length, int64_t max_length, int64_t buffer);

}  // namespace rlx::algo
