#include "rlx/rl/validation_metrics.hpp"

#include <bit>
#include <cmath>
#include <random>

#include "../helpers.hpp"

using rlx::rl::pass_at_k;
using rlx::rl::sample_metrics;
using rlx::rl::TaskSamples;

namespace {
// The definition, by enumeration: the share of k-subsets of n samples (c correct) holding a
// correct one.
double pass_at_k_by_subsets(int n, int c, int k) {
  int64_t hit = 0, all = 0;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    if (std::popcount(mask) != k) continue;
    ++all;
    if ((mask & ((1u << c) - 1)) != 0) ++hit;  // samples 0..c-1 are the correct ones
  }
  return static_cast<double>(hit) / static_cast<double>(all);
}
}  // namespace

TEST_CASE("pass@k: hand-computed values", "[rollout][validation]") {
  CHECK(pass_at_k(10, 3, 1) == Approx(0.3));
  CHECK(pass_at_k(10, 3, 5) == Approx(1.0 - 21.0 / 252.0));  // 1 - C(7,5)/C(10,5)
  CHECK(pass_at_k(4, 0, 4) == 0.0);
  CHECK(pass_at_k(4, 1, 4) == 1.0);
  CHECK(pass_at_k(8, 6, 3) == 1.0);  // fewer than k wrong samples
  CHECK_THROWS(pass_at_k(4, 1, 5));
  CHECK_THROWS(pass_at_k(4, 5, 1));
}

TEST_CASE("pass@k equals the share of k-subsets with a correct sample (every n <= 12)", "[rollout][validation]") {
  for (int n = 1; n <= 12; ++n)
    for (int c = 0; c <= n; ++c)
      for (int k = 1; k <= n; ++k) {
        INFO("n=" << n << " c=" << c << " k=" << k);
        CHECK(pass_at_k(n, c, k) == Approx(pass_at_k_by_subsets(n, c, k)).margin(1e-12));
      }
}

TEST_CASE("pass@k is stable for large n and grows with k", "[rollout][validation]") {
  const double p = pass_at_k(1000, 1, 1);
  CHECK(p == Approx(0.001));
  double last = 0;
  for (int64_t k = 1; k <= 1000; k *= 2) {
    const double v = pass_at_k(1000, 10, k);
    CHECK(v >= last);
    CHECK(v <= 1.0);
    last = v;
  }
}

TEST_CASE("sample metrics: mean@n, pass@k, maj@n over tasks", "[rollout][validation]") {
  const std::vector<TaskSamples> tasks = {
      {.correct = {1, 0, 0, 1}, .answers = {"3", "4", "4", "3"}},  // tie 3/4: the first seen, "3", is right
      {.correct = {0, 0, 0, 1}, .answers = {"7", "7", "8", "5"}},  // majority "7" is wrong
      {.correct = {1, 1, 1, 0}, .answers = {}},                    // no answers: the verdicts vote
  };
  const auto m = sample_metrics(tasks, {1, 2, 8});
  CHECK(m.tasks == 3);
  CHECK(m.mean_at_n == Approx((0.5 + 0.25 + 0.75) / 3));
  REQUIRE(m.ks_used == std::vector<int64_t>{1, 2});  // 8 > n: left out
  CHECK(m.pass_at_k[0] == Approx(m.mean_at_n));  // pass@1 is mean@n
  CHECK(m.pass_at_k[1] == Approx(((1 - 1.0 / 6) + (1 - 3.0 / 6) + 1.0) / 3));
  CHECK(m.maj_at_n == Approx(2.0 / 3));
  CHECK_THROWS(sample_metrics({{.correct = {1, 0}, .answers = {"a"}}}, {1}));
}

TEST_CASE("sample metrics: pass@k >= mean@n, increasing in k (random tasks, fixed seed)", "[rollout][validation]") {
  std::mt19937 rng(52);
  std::vector<TaskSamples> tasks(50);
  for (auto& t : tasks)
    for (int i = 0; i < 8; ++i) t.correct.push_back(static_cast<uint8_t>(rng() % 3 == 0));
  const auto m = sample_metrics(tasks, {1, 2, 4, 8});
  REQUIRE(m.pass_at_k.size() == 4);
  CHECK(m.pass_at_k[0] == Approx(m.mean_at_n));
  for (size_t i = 1; i < m.pass_at_k.size(); ++i) CHECK(m.pass_at_k[i] >= m.pass_at_k[i - 1]);
  CHECK(m.pass_at_k[3] <= 1.0);
}
