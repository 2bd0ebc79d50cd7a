#include "rlx/learner/preference.hpp"

#include <cmath>

#include "rlx/core/error.hpp"

namespace rlx {

std::vector<Sequence> preference_sequences(const std::vector<PreferencePair>& pairs, int64_t end_token) {
  std::vector<Sequence> out;
  out.reserve(2 * pairs.size());
  for (const auto& p : pairs) {
    for (const auto* side : {&p.chosen, &p.rejected}) {
      RLX_CHECK(!side->empty(), "a preference pair has an empty sequence");
      Sequence s;
      s.tokens = *side;
      s.tokens.push_back(end_token);
      s.loss_mask.assign(s.tokens.size(), 0);
      s.loss_mask.back() = 1;
      out.push_back(std::move(s));
    }
  }
  return out;
}

PreferenceStats bradley_terry(std::vector<Sequence>& seqs) {
  RLX_CHECK(seqs.size() % 2 == 0, "bradley_terry: {} sequences are not pairs", seqs.size());
  const size_t pairs = seqs.size() / 2;
  PreferenceStats s;
  for (size_t i = 0; i < pairs; ++i) {
    auto &c = seqs[2 * i], &r = seqs[2 * i + 1];
    RLX_CHECK(c.values.contains(kPreferenceScore) && r.values.contains(kPreferenceScore),
              "bradley_terry: pair {} is not scored", i);
    const double d = c.values[kPreferenceScore].back() - r.values[kPreferenceScore].back();
    s.loss += std::log1p(std::exp(-std::abs(d))) + std::max(-d, 0.0);  // softplus(-d), stable
    s.accuracy += d > 0 ? 1.0 : d == 0 ? 0.5 : 0.0;
    s.margin += d;
    // d loss / d r_c = -sigmoid(-d) / pairs; d loss / d r_r = +sigmoid(-d) / pairs.
    const auto g = static_cast<float>(1.0 / (1.0 + std::exp(d)) / static_cast<double>(pairs));
    for (auto* seq : {&c, &r}) {
      auto& w = seq->values[kPreferenceWeight];
      w.assign(seq->tokens.size(), 0.0f);
      w.back() = seq == &c ? -g : g;
    }
  }
  const auto n = static_cast<double>(std::max<size_t>(pairs, 1));
  return {s.loss / n, s.accuracy / n, s.margin / n};
}

LossFn bradley_terry_loss() {
  return [](const MicroBatch& mb, const TokenOutputs& out, const StepContext&, MetricSums&) {
    auto it = mb.values.find(kPreferenceWeight);
    if (it == mb.values.end()) return out.values.sum() * 0.0;  // an empty micro-batch
    return (out.values * it->second).sum();
  };
}

}  // namespace rlx
