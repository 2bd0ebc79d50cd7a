#include "rlx/rl/validation_metrics.hpp"

#include <algorithm>
#include <map>

#include "rlx/core/error.hpp"

namespace rlx::rl {

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  RLX_CHECK(k >= 1 && k <= n, "pass@k: k={} must be in [1, n={}]", k, n);
  RLX_CHECK(c >= 0 && c <= n, "pass@k: c={} correct of n={} samples", c, n);
  if (n - c < k) return 1.0;
  // C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i): a product of terms in (0, 1], stable
  // for any n (the numerically stable form of the paper's code).
  double fail = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) fail *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - fail;
}

SampleMetrics sample_metrics(const std::vector<TaskSamples>& tasks, const std::vector<int64_t>& ks) {
  SampleMetrics m;
  int64_t min_n = INT64_MAX;
  for (const auto& t : tasks) {
    RLX_CHECK(t.answers.empty() || t.answers.size() == t.correct.size(),
              "sample metrics: {} answers for {} samples", t.answers.size(), t.correct.size());
    if (!t.correct.empty()) min_n = std::min<int64_t>(min_n, static_cast<int64_t>(t.correct.size()));
  }
  for (const auto k : ks)
    if (k >= 1 && k <= min_n) m.ks_used.push_back(k);
  m.pass_at_k.assign(m.ks_used.size(), 0.0);
  for (const auto& t : tasks) {
    const auto n = static_cast<int64_t>(t.correct.size());
    if (n == 0) continue;
    int64_t c = 0;
    for (const auto x : t.correct) c += x ? 1 : 0;
    ++m.tasks;
    m.mean_at_n += static_cast<double>(c) / static_cast<double>(n);
    for (size_t i = 0; i < m.ks_used.size(); ++i) m.pass_at_k[i] += pass_at_k(n, c, m.ks_used[i]);
    // Majority vote: the most frequent answer, ties to the one seen first; it is correct when
    // a sample that gave it is (answers are compared as text: equal text, equal verdict).
    if (t.answers.empty()) {
      m.maj_at_n += 2 * c > n ? 1.0 : 0.0;  // no answers: the verdicts vote
      continue;
    }
    std::map<std::string, std::pair<int64_t, size_t>> votes;  // answer -> (count, first index)
    for (size_t i = 0; i < t.answers.size(); ++i) {
      auto [it, fresh] = votes.try_emplace(t.answers[i], 0, i);
      ++it->second.first;
    }
    size_t best = 0;
    int64_t best_count = 0;
    for (const auto& [answer, v] : votes)
      if (v.first > best_count || (v.first == best_count && v.second < best)) best_count = v.first, best = v.second;
    bool right = false;
    for (size_t i = 0; i < t.answers.size(); ++i)
      if (t.answers[i] == t.answers[best] && t.correct[i]) right = true;
    m.maj_at_n += right ? 1.0 : 0.0;
  }
  if (m.tasks > 0) {
    const auto d = static_cast<double>(m.tasks);
    m.mean_at_n /= d;
    m.maj_at_n /= d;
    for (auto& p : m.pass_at_k) p /= d;
  }
  return m;
}

}  // namespace rlx::rl
