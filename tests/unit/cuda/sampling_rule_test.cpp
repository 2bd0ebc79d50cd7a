#include "rlx/cuda/sampling_rule.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "rlx/rollout/sampling.hpp"

namespace hd = rlx::hd;

namespace {
// Logits with many exact ties (values from a small set) or continuous ones.
std::vector<float> logits(std::mt19937& g, int n, bool ties) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::uniform_int_distribution<int> level(-6, 6);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = ties ? 0.5f * static_cast<float>(level(g)) : d(g);
  return x;
}

// The rule's kept set, written from its definitions with a sort: the k-th largest z, the
// smallest most-likely prefix of the top-k set holding `need` of its mass (ties kept).
std::vector<uint64_t> kept_by_definition(const std::vector<float>& x, const rlx::SamplingParams& p) {
  const size_t n = x.size();
  const auto t = static_cast<float>(p.temperature);
  std::vector<float> z(n), w(n);
  for (size_t i = 0; i < n; ++i) z[i] = x[i] / t;
  const float m = *std::max_element(z.begin(), z.end());
  for (size_t i = 0; i < n; ++i) w[i] = std::exp(z[i] - m);
  std::vector<float> sorted = z;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  float tk = -std::numeric_limits<float>::infinity();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) tk = sorted[static_cast<size_t>(p.top_k) - 1];
  float tp = -std::numeric_limits<float>::infinity();
  if (p.top_p < 1.0) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i)
      if (z[i] >= tk) total += hd::mass_units(w[i]);
    const uint64_t need = hd::top_p_need(p.top_p, total);
    for (float v : sorted) {  // descending: the first value whose upper set reaches need
      if (v < tk) break;
      uint64_t mass = 0;
      for (size_t i = 0; i < n; ++i)
        if (z[i] >= v && z[i] >= tk) mass += hd::mass_units(w[i]);
      if (mass >= need) {
        tp = v;
        break;
      }
    }
  }
  std::vector<uint64_t> q(n);
  for (size_t i = 0; i < n; ++i)
    q[i] = z[i] >= tk && z[i] >= tp && w[i] >= static_cast<float>(p.min_p) ? hd::mass_units(w[i]) : 0;
  return q;
}
}  // namespace

TEST_CASE("sampling rule: order_key orders floats as integers", "[rollout]") {
  std::vector<float> v{-std::numeric_limits<float>::infinity(), -1e30f, -2.5f, -1e-30f, -0.0f, 0.0f, 1e-30f, 1.0f,
                       3.5f, 1e30f, std::numeric_limits<float>::infinity()};
  for (size_t i = 1; i < v.size(); ++i) CHECK(hd::order_key(v[i - 1]) < hd::order_key(v[i]));
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float a = d(g), b = d(g);
    CHECK((a < b) == (hd::order_key(a) < hd::order_key(b)));
  }
}

TEST_CASE("sampling rule: radix select finds the k-th largest key and the mass threshold", "[rollout]") {
  std::mt19937 g(2);
  for (int trial = 0; trial < 40; ++trial) {
    const bool ties = trial % 2 == 0;
    const auto x = logits(g, 1 + trial * 17, ties);
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<uint32_t> keys(x.size());
    for (size_t i = 0; i < x.size(); ++i) keys[i] = hd::order_key(x[i]);
    std::vector<uint32_t> desc = keys;
    std::sort(desc.begin(), desc.end(), std::greater<>());
    auto key_of = [&](int64_t i, uint32_t& k) { return k = keys[static_cast<size_t>(i)], true; };
    for (int64_t k : {int64_t{1}, n / 3 + 1, n}) {
      INFO("n " << n << " k " << k << " ties " << ties);
      CHECK(hd::radix_select(n, static_cast<uint64_t>(k), key_of, [](int64_t) { return uint64_t{1}; }) ==
            desc[static_cast<size_t>(k - 1)]);
    }
    // Masses: the largest key whose upper set holds at least `need`.
    std::vector<uint64_t> mass(x.size());
    for (auto& q : mass) q = 1 + g() % 1000;
    uint64_t total = 0;
    for (auto q : mass) total += q;
    for (uint64_t need : {uint64_t{1}, total / 2, total}) {
      uint32_t want = 0;
      for (uint32_t v : desc) {
        uint64_t above = 0;
        for (size_t i = 0; i < x.size(); ++i) above += keys[i] >= v ? mass[i] : 0;
        if (above >= need) {
          want = v;
          break;
        }
      }
      CHECK(hd::radix_select(n, need, key_of, [&](int64_t i) { return mass[static_cast<size_t>(i)]; }) == want);
    }
  }
}

TEST_CASE("sampling rule: the CPU sampler keeps and draws exactly as the rule's definitions say", "[rollout]") {
  std::mt19937 g(3);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int draws = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const auto x = logits(g, 50 + trial * 7, trial % 3 == 0);
    rlx::SamplingParams p{.temperature = 0.5 + 0.1 * (trial % 9), .top_k = trial % 4 == 0 ? 0 : 1 + trial % 23,
                          .top_p = trial % 5 == 0 ? 1.0 : 0.3 + 0.1 * (trial % 7), .min_p = trial % 6 == 0 ? 0.1 : 0.0};
    INFO("trial " << trial << " T " << p.temperature << " k " << p.top_k << " p " << p.top_p << " min_p " << p.min_p);
    const auto q = kept_by_definition(x, p);
    uint64_t total = 0;
    for (auto m : q) total += m;
    REQUIRE(total > 0);
    auto dist = rlx::sampling_distribution(at::from_blob(const_cast<float*>(x.data()), {static_cast<int64_t>(x.size())}), p);
    for (size_t i = 0; i < q.size(); ++i)
      CHECK(dist[static_cast<int64_t>(i)].item<double>() == static_cast<double>(q[i]) / static_cast<double>(total));
    for (int j = 0; j < 20; ++j) {
      const double u = unit(g);
      const uint64_t target = hd::draw_target(u, total);
      uint64_t run = 0;
      size_t want = 0;
      while ((run += q[want]) <= target) ++want;
      const auto got = rlx::sample_row(x.data(), static_cast<int64_t>(x.size()), p, u);
      CHECK(got.token == static_cast<int64_t>(want));
      ++draws;
    }
  }
  CHECK(draws == 1200);
}

TEST_CASE("sampling rule: integer masses and targets stay in range at the edges", "[rollout]") {
  CHECK(hd::mass_units(1.0f) == (uint64_t{1} << 40));
  CHECK(hd::mass_units(0.0f) == 0);
  CHECK(hd::top_p_need(1e-30, 5) == 1);  // the top token always kept
  CHECK(hd::draw_target(0.0, 7) == 0);
  for (uint64_t total : {uint64_t{1}, uint64_t{3}, (uint64_t{1} << 62) - 1, ~uint64_t{0}})
    CHECK(hd::draw_target(std::nextafter(1.0, 0.0), total) < total);  // the double product may round up
  // A 2^23-token vocabulary of equal logits sums without overflow.
  CHECK((uint64_t{1} << 23) * hd::mass_units(1.0f) == uint64_t{1} << 63);
}
