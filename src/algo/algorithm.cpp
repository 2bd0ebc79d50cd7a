#include "rlx/algo/algorithm.hpp"

#include <mutex>

#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"

namespace rlx::algo {

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, AlgorithmFactory>& registry() {
  static std::map<std::string, AlgorithmFactory> r;
  return r;
}
}  // namespace

std::vector<std::string> PolicyGradient::metric_names() const {
  return {"pg_loss", "clipped_tokens", "ratio", "kl", "entropy", "tokens", "mismatch_kl"};
}

at::Tensor PolicyGradient::loss(const LossInputs& in, const Normalizers& norm, Metrics& metrics) const {
  RLX_CHECK(in.advantages.defined(), "{}: the batch has no advantages", opt_.name);
  RLX_CHECK(in.old_logprobs.defined(), "{}: the batch has no old log-probs", opt_.name);
  auto pg = clipped_policy_loss(in.logprobs, in.old_logprobs, in.advantages, opt_.clip, log_ratio(in));
  auto per_token = pg.loss;
  if (opt_.tis_cap > 0) {
    RLX_CHECK(in.behaviour_logprobs.defined(), "{}: truncated IS needs the sampler's log-probs", opt_.name);
    per_token = per_token * truncated_is_weights(in.old_logprobs, in.behaviour_logprobs, opt_.tis_cap);
  }
  auto m = in.mask;
  auto loss = aggregate(per_token, m, in.sequence, opt_.aggregation, norm);
  metrics["pg_loss"] += loss.item<double>();
  metrics["clipped_tokens"] += (pg.clipped * m).sum().item<double>();
  metrics["ratio"] += (pg.ratio * m).sum().item<double>();
  metrics["tokens"] += m.sum().item<double>();
  if (in.behaviour_logprobs.defined())
    metrics["mismatch_kl"] +=
        (kl_penalty(in.old_logprobs, in.behaviour_logprobs, KlEstimator::k3) * m).sum().item<double>();
  if (opt_.kl_coef > 0) {
    RLX_CHECK(in.ref_logprobs.defined(), "{}: kl_coef > 0 needs the reference model's log-probs", opt_.name);
    auto kl = kl_penalty(in.logprobs, in.ref_logprobs, opt_.kl_estimator);
    loss = loss + opt_.kl_coef * aggregate(kl, m, in.sequence, opt_.aggregation, norm);
    metrics["kl"] += (kl.detach() * m).sum().item<double>();
  }
  if (opt_.entropy_coef > 0) {
    RLX_CHECK(in.entropy.defined(), "{}: entropy_coef > 0 needs the entropy", opt_.name);
    loss = loss - opt_.entropy_coef * aggregate(in.entropy, m, in.sequence, opt_.aggregation, norm);
    metrics["entropy"] += (in.entropy.detach() * m).sum().item<double>();
  }
  return loss;
}

void register_algorithm(const std::string& name, AlgorithmFactory factory) {
  RLX_CHECK(!name.empty() && factory, "register_algorithm: a name and a factory are needed");
  std::lock_guard lock(registry_mutex());
  registry()[name] = std::move(factory);
}

std::vector<std::string> algorithm_names() {
  std::lock_guard lock(registry_mutex());
  std::vector<std::string> out;
  for (const auto& kv : registry()) out.push_back(kv.first);
  return out;
}

std::unique_ptr<Algorithm> make_algorithm(const AlgoOptions& options) {
  AlgorithmFactory f;
  {
    std::lock_guard lock(registry_mutex());
    auto it = registry().find(options.name);
    if (it != registry().end()) f = it->second;
  }
  if (!f) {
    auto names = algorithm_names();
    auto guess = config::closest(options.name, names);
    throw ConfigError(fmt::format("algorithm.name: unknown algorithm {:?} (known: {}){}", options.name,
                                  fmt::join(names, ", "), guess.empty() ? "" : fmt::format("; did you mean {:?}?", guess)));
  }
  return f(options);
}

}  // namespace rlx::algo
