#include "rlx/algo/algorithm.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <type_traits>
#include <cmath>
#include <mutex>
#include <set>
#include <tuple>

#include "rlx/algo/mismatch_metrics.hpp"
#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"

namespace rlx::algo {

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
struct Registered {
  AlgorithmFactory factory;
  std::vector<AlgoOption> options;
};
std::map<std::string, Registered>& registry() {
  static std::map<std::string, Registered> r;
  return r;
}

// What algorithm.options.KEY holds, as the config wrote it: a JSON value when it parses.
nlohmann::json option_value(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json(text) : j;
}
}  // namespace

std::vector<std::string> PolicyGradient::metric_names() const {
  std::vector<std::string> names{"pg_loss",   "clipped_tokens",  "ratio",           "approx_kl",  "kl",
                                 "entropy",   "tokens",          "mismatch_kl",     "value_loss", "value_clipped",
                                 "value",     "mismatch_masked", "mismatch_weight"};
  const auto& bins = mismatch_bin_names();
  names.insert(names.end(), bins.begin(), bins.end());
  return names;
}

const OutcomeAdvantages* Algorithm::outcome() const { return dynamic_cast<const OutcomeAdvantages*>(this); }
const CriticAdvantages* Algorithm::critic() const { return dynamic_cast<const CriticAdvantages*>(this); }

at::Tensor clipped_value_loss(const AlgoOptions& opt, const LossInputs& in, const Normalizers& norm,
                              MetricSums& metrics) {
  RLX_CHECK(in.values.defined() && in.returns.defined(), "{}: the value loss needs values and returns", opt.name);
  auto m = in.mask;
  const auto old = in.old_values.defined() ? in.old_values : in.values.detach();
  auto per_token = opt.value_clip > 0 ? clipped_value_loss(in.values, old, in.returns, opt.value_clip)
                                      : 0.5 * (in.values - in.returns).pow(2);
  auto loss = aggregate(per_token, m, in.sequence, Aggregation::token_mean, norm);
  metrics.add("value_loss", loss);
  metrics.add("value", (in.values.detach() * m).sum());
  if (opt.value_clip > 0)
    metrics.add("value_clipped", (((in.values.detach() - old).abs() > opt.value_clip).to(m.scalar_type()) * m).sum());
  return loss;
}

void Algorithm::observe_kl(double kl, double sequences) {
  if (opt_.kl_target <= 0) return;
  // Ziegler et al. (2019): a proportional controller on log(kl_coef), error clipped to +-20%.
  const double error = std::clamp(kl / opt_.kl_target - 1.0, -0.2, 0.2);
  kl_coef_ *= 1.0 + error * sequences / opt_.kl_horizon;
}

std::vector<std::vector<double>> group_advantages_of(const std::vector<std::vector<Sample>>& groups, GroupBaseline baseline) {
  std::vector<std::vector<double>> out;
  for (const auto& g : groups) {
    std::vector<double> rewards;
    for (const auto& s : g) rewards.push_back(s.reward);
    out.push_back(group_advantages(rewards, baseline));
  }
  return out;
}

Metrics Algorithm::means(const Metrics& sums) {
  static const std::map<std::string, std::string> per_token{
      {"clipped_tokens", "clip_fraction"}, {"ratio", "ratio"},   {"approx_kl", "approx_kl"},
      {"kl", "kl"},                        {"entropy", "entropy"}, {"mismatch_kl", "mismatch_kl"},
      {"value_clipped", "value_clip_fraction"}, {"value", "value_mean"},
      {"mismatch_masked", "mismatch_masked_fraction"}, {"mismatch_weight", "mismatch_weight_mean"},
      {"teacher_kl", "teacher_kl"}};
  static const std::set<std::string> bins(mismatch_bin_names().begin(), mismatch_bin_names().end());
  Metrics out;
  auto it = sums.find("tokens");
  const double tokens = it == sums.end() ? 0.0 : it->second;
  for (const auto& [name, value] : sums) {
    if (bins.contains(name)) continue;  // read as quantiles below
    auto p = per_token.find(name);
    if (p == per_token.end())
      out[name] = value;
    else if (tokens > 0)
      out[p->second] = value / tokens;
  }
  add_mismatch_quantiles(sums, out);
  return out;
}

Metrics batch_metrics(const std::vector<double>& rewards, const std::vector<double>& advantages,
                      const std::vector<int64_t>& lengths, const AllReduceSum& all_reduce,
                      const std::function<void(std::vector<double>&)>& all_reduce_max) {
  std::vector<double> sums(8, 0.0), maxima{-1e300, -1e300, -1e300};  // max adv, -min adv, max length
  for (double r : rewards) sums[0] += 1, sums[1] += r, sums[2] += r * r;
  for (double a : advantages) {
    sums[3] += 1, sums[4] += a, sums[5] += a * a;
    maxima[0] = std::max(maxima[0], a), maxima[1] = std::max(maxima[1], -a);
  }
  for (auto n : lengths) {
    sums[6] += 1, sums[7] += static_cast<double>(n);
    maxima[2] = std::max(maxima[2], static_cast<double>(n));
  }
  if (all_reduce) all_reduce(sums);
  if (all_reduce_max) all_reduce_max(maxima);
  auto stats = [](double n, double s, double sq) {
    if (n <= 0) return std::pair{0.0, 0.0};
    const double mean = s / n;
    return std::pair{mean, std::sqrt(std::max(sq / n - mean * mean, 0.0))};
  };
  Metrics out;
  std::tie(out["reward_mean"], out["reward_std"]) = stats(sums[0], sums[1], sums[2]);
  std::tie(out["advantage_mean"], out["advantage_std"]) = stats(sums[3], sums[4], sums[5]);
  if (sums[3] > 0) out["advantage_max"] = maxima[0], out["advantage_min"] = -maxima[1];
  out["response_length_mean"] = sums[6] > 0 ? sums[7] / sums[6] : 0.0;
  if (sums[6] > 0) out["response_length_max"] = maxima[2];
  out["samples"] = sums[0];
  return out;
}

at::Tensor PolicyGradient::loss(const LossInputs& in, const Normalizers& norm, MetricSums& metrics) const {
  RLX_CHECK(in.advantages.defined(), "{}: the batch has no advantages", opt_.name);
  RLX_CHECK(in.old_logprobs.defined(), "{}: the batch has no old log-probs", opt_.name);
  auto pg = policy_loss(in);
  auto per_token = pg.loss;
  auto m = in.mask;
  auto mismatch = opt_.mismatch;
  if (opt_.tis_cap > 0) mismatch = {.mode = Mismatch::token_truncate, .low = 0, .high = opt_.tis_cap};
  RLX_CHECK(mismatch.mode == Mismatch::none || in.behaviour_logprobs.defined(),
            "{}: algorithm.mismatch ({}) needs the sampler's log-probs", opt_.name, config::enum_to_string(mismatch.mode));
  if (in.behaviour_logprobs.defined()) {
    auto w = mismatch_weights(in.old_logprobs, in.behaviour_logprobs, m, in.sequence, mismatch);
    if (mismatch.mode != Mismatch::none) per_token = per_token * w.weights;
    metrics.add("mismatch_kl", (kl_penalty(in.old_logprobs, in.behaviour_logprobs, KlEstimator::k3) * m).sum());
    metrics.add("mismatch_masked", ((1 - w.kept) * m).sum());
    metrics.add("mismatch_weight", (w.weights * m).sum());
    add_mismatch_histogram(w.log_ratio, m, metrics);
  }
  auto loss = aggregate(per_token, m, in.sequence, opt_.aggregation, norm);
  metrics.add("pg_loss", loss);
  metrics.add("clipped_tokens", (pg.clipped * m).sum());
  metrics.add("ratio", (pg.ratio * m).sum());
  metrics.add("approx_kl", (kl_penalty(in.logprobs.detach(), in.old_logprobs, KlEstimator::k3) * m).sum());
  metrics.add("tokens", m.sum());
  if (in.ref_logprobs.defined()) {
    auto kl = kl_penalty(in.logprobs, in.ref_logprobs, opt_.kl_estimator);
    if (opt_.kl_placement == KlPlacement::loss && kl_coef_ > 0)
      loss = loss + kl_coef_ * aggregate(kl, m, in.sequence, opt_.aggregation, norm);
    metrics.add("kl", (kl.detach() * m).sum());
  } else {
    RLX_CHECK(opt_.kl_placement != KlPlacement::loss || kl_coef_ == 0,
              "{}: kl_coef > 0 needs the reference model's log-probs", opt_.name);
  }
  if (opt_.entropy_coef > 0) {
    RLX_CHECK(in.entropy.defined(), "{}: entropy_coef > 0 needs the entropy", opt_.name);
    loss = loss - opt_.entropy_coef * aggregate(in.entropy, m, in.sequence, opt_.aggregation, norm);
  }
  if (in.entropy.defined()) metrics.add("entropy", (in.entropy.detach() * m).sum());
  if (in.values.defined()) {  // critic = head
    RLX_CHECK(critic(), "{}: values were given, but the algorithm has no critic", opt_.name);
    loss = loss + opt_.vf_coef * critic()->value_loss(in, norm, metrics);
  }
  return loss;
}

void register_algorithm(const std::string& name, AlgorithmFactory factory, std::vector<AlgoOption> options) {
  RLX_CHECK(!name.empty() && factory, "register_algorithm: a name and a factory are needed");
  for (const auto& o : options) RLX_CHECK(!o.key.empty(), "register_algorithm({:?}): an option without a key", name);
  std::lock_guard lock(registry_mutex());
  RLX_CHECK(!registry().contains(name), "algorithm registry: {:?} is already registered", name);
  registry()[name] = {std::move(factory), std::move(options)};
}

std::vector<AlgoOption> algorithm_options(const std::string& name) {
  std::lock_guard lock(registry_mutex());
  auto it = registry().find(name);
  return it == registry().end() ? std::vector<AlgoOption>{} : it->second.options;
}

template <class T>
T option(const AlgoOptions& o, const std::string& key, T fallback, config::Bounds bounds) {
  auto it = o.options.find(key);
  if (it == o.options.end()) return fallback;
  const auto v = option_value(it->second);
  const auto where = fmt::format("algorithm.options.{}", key);
  T out{};
  if constexpr (std::is_same_v<T, std::string>) {
    out = v.is_string() ? v.get<std::string>() : it->second;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) throw ConfigError(fmt::format("{}: {:?} is not true or false", where, it->second));
    out = v.get<bool>();
  } else {
    const bool ok = std::is_same_v<T, double> ? v.is_number() : v.is_number_integer();
    if (!ok)
      throw ConfigError(fmt::format("{}: {:?} is not {}", where, it->second,
                                    std::is_same_v<T, double> ? "a number" : "an integer"));
    out = v.get<T>();
    if (!config::within(static_cast<double>(out), bounds))
      throw ConfigError(fmt::format("{}: {} is not {}", where, it->second, config::describe(bounds)));
  }
  return out;
}
template double option<double>(const AlgoOptions&, const std::string&, double, config::Bounds);
template int64_t option<int64_t>(const AlgoOptions&, const std::string&, int64_t, config::Bounds);
template bool option<bool>(const AlgoOptions&, const std::string&, bool, config::Bounds);
template std::string option<std::string>(const AlgoOptions&, const std::string&, std::string, config::Bounds);

std::vector<std::string> algorithm_names() {
  std::lock_guard lock(registry_mutex());
  std::vector<std::string> out;
  for (const auto& kv : registry()) out.push_back(kv.first);
  return out;
}

std::unique_ptr<Algorithm> make_algorithm(const AlgoOptions& options) {
  options.validate();
  AlgorithmFactory f;
  std::vector<AlgoOption> declared;
  {
    std::lock_guard lock(registry_mutex());
    auto it = registry().find(options.name);
    if (it != registry().end()) f = it->second.factory, declared = it->second.options;
  }
  if (!f) {
    auto names = algorithm_names();
    auto guess = config::closest(options.name, names);
    throw ConfigError(fmt::format("algorithm.name: unknown algorithm {:?} (known: {}){}", options.name,
                                  fmt::join(names, ", "), guess.empty() ? "" : fmt::format("; did you mean {:?}?", guess)));
  }
  std::vector<std::string> keys;
  std::string takes;
  for (const auto& d : declared) {
    keys.push_back(d.key);
    takes += fmt::format("{}{} ({})", takes.empty() ? "" : "; ", d.key, d.doc);
  }
  for (const auto& [key, value] : options.options) {
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    auto guess = config::closest(key, keys);
    throw ConfigError(fmt::format("algorithm.options.{}: {} has no such option{}; {}", key, options.name,
                                  guess.empty() ? "" : fmt::format(" (did you mean {:?}?)", guess),
                                  takes.empty() ? "it takes none" : "it takes: " + takes));
  }
  auto algorithm = f(options);
  RLX_CHECK(algorithm, "algorithm {:?}: its factory returned nothing", options.name);
  RLX_CHECK((algorithm->outcome() != nullptr) != (algorithm->critic() != nullptr),
            "algorithm {:?}: it must derive from exactly one of rlx::algo::OutcomeAdvantages (advantages from group "
            "rewards) and rlx::algo::CriticAdvantages (advantages from a critic)",
            options.name);
  return algorithm;
}

}  // namespace rlx::algo
