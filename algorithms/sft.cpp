// SFT: cross-entropy on the trained (masked) tokens, aggregated like any loss.
// Used to warm-start the examples.
#include "rlx/algo/algorithm.hpp"

namespace rlx::algo {

class Sft : public Algorithm, public OutcomeAdvantages {
 public:
  using Algorithm::Algorithm;
  std::vector<std::vector<double>> advantages(const std::vector<std::vector<Sample>>& groups,
                                              const AllReduceSum&) const override {
    std::vector<std::vector<double>> out;
    for (const auto& g : groups) out.emplace_back(g.size(), 0.0);
    return out;
  }
  at::Tensor loss(const LossInputs& in, const Normalizers& norm, MetricSums& metrics) const override {
    auto loss = aggregate(-in.logprobs, in.mask, in.sequence, opt_.aggregation, norm);
    metrics.add("nll", (-in.logprobs.detach() * in.mask).sum());
    metrics.add("tokens", in.mask.sum());
    return loss;
  }
  std::vector<std::string> metric_names() const override { return {"nll", "tokens"}; }
  bool needs_old_logprobs() const override { return false; }
};

void register_sft() {
  register_algorithm("sft", [](const AlgoOptions& o) { return std::make_unique<Sft>(o); });
}

}  // namespace rlx::algo
