// Sampling metrics of a validation set: pass@k with the unbiased estimator of Chen et al.
// (2021, "Evaluating Large Language Models Trained on Code"), mean@n and maj@n, from each
// task's n scored samples. Pure arithmetic: the validation runner and `rlx eval` fill it.
//
//   std::vector<TaskSamples> tasks = {{.correct = {1, 0, 0, 1}, .answers = {"3", "4", "4", "3"}}};
//   auto m = sample_metrics(tasks, {1, 2});
//   // m.mean_at_n == 0.5, m.pass_at_k[0] == 0.5, m.pass_at_k[1] == 1 - C(2,2)/C(4,2) = 5/6,
//   // m.maj_at_n == 1 (a tie between "3" and "4" goes to the answer seen first: "3", correct)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rlx::rl {

// pass@k for one task: 1 - C(n-c, k) / C(n, k), the chance that k of its n samples drawn
// without replacement hold at least one correct one. Needs 1 <= k <= n and 0 <= c <= n.
double pass_at_k(int64_t n, int64_t c, int64_t k);

// One task's samples: whether each is correct, and each one's answer (the extracted answer,
// else the response text) for the majority vote. answers is empty or has correct's size.
struct TaskSamples {
  std::vector<uint8_t> correct;
  std::vector<std::string> answers;
};

struct SampleMetrics {
  double mean_at_n = 0;            // mean over tasks of the fraction of correct samples
  std::vector<double> pass_at_k;   // per k asked (k > n: left out, see ks_used)
  std::vector<int64_t> ks_used;    // the ks of pass_at_k, those <= the smallest n
  double maj_at_n = 0;             // fraction of tasks whose most frequent answer is correct
  int64_t tasks = 0;
};

// Over tasks with at least one sample (those without are skipped). A k larger than the
// fewest samples any task has is left out (its estimate is undefined).
SampleMetrics sample_metrics(const std::vector<TaskSamples>& tasks, const std::vector<int64_t>& ks);

}  // namespace rlx::rl
