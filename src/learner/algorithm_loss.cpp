#include "rlx/learner/algorithm_loss.hpp"

#include <algorithm>
#include <numeric>

#include "rlx/core/error.hpp"

namespace rlx {

namespace {

// `on_policy`: the batch's old policy is the one being stepped (see train_on_batch), so a
// missing old log-prob is this step's own, detached.
algo::LossInputs loss_inputs(const MicroBatch& mb, const TokenOutputs& out, bool on_policy = false) {
  const auto device = (out.logprobs.defined() ? out.logprobs : out.values).device();
  auto value = [&](const char* name) {
    auto it = mb.values.find(name);
    return it == mb.values.end() ? at::Tensor() : it->second.to(device);
  };
  algo::LossInputs in;
  in.mask = mb.loss_mask.to(device);
  in.sequence = mb.sequence.to(device);
  in.logprobs = out.logprobs;
  in.entropy = out.entropy;
  in.values = out.values;
  in.advantages = value("advantages");
  in.returns = value("returns");
  in.old_logprobs = value("old_logprobs");
  if (on_policy && !in.old_logprobs.defined() && out.logprobs.defined()) in.old_logprobs = out.logprobs.detach();
  in.old_values = value("old_values");
  in.ref_logprobs = value("ref_logprobs");
  in.teacher_logprobs = value("teacher_logprobs");
  in.behaviour_logprobs = value("behaviour_logprobs");
  return in;
}

algo::Normalizers normalizers(const algo::Algorithm& algorithm, const StepContext& ctx) {
  return {.tokens = std::max(ctx.global_loss_tokens, 1.0),
          .sequences = std::max(ctx.global_sequences, 1.0),
          .max_tokens = algorithm.options().max_tokens};
}

algo::AllReduceSum all_reduce_sum(dist::Communicator& comm, const char* what) {
  return [&comm, what](std::vector<double>& v) {
    auto t = at::tensor(v, at::kDouble);
    comm.all_reduce(t, dist::ReduceOp::sum, what)->wait();
    for (size_t i = 0; i < v.size(); ++i) v[i] = t[static_cast<int64_t>(i)].item<double>();
  };
}

// The trained positions of a sequence's per-token value, in order: [n] fp64.
at::Tensor trained(const Sequence& s, const std::string& key) {
  const auto& v = s.values.at(key);
  std::vector<double> out;
  for (size_t k = 0; k < s.tokens.size(); ++k)
    if (s.loss_mask[k]) out.push_back(v[k]);
  return at::tensor(out, at::kDouble);
}

void scatter_trained(Sequence& s, const std::string& key, const at::Tensor& values) {
  auto& v = s.values[key];
  v.assign(s.tokens.size(), 0.0f);
  int64_t i = 0;
  for (size_t k = 0; k < s.tokens.size(); ++k)
    if (s.loss_mask[k]) v[k] = static_cast<float>(values[i++].item<double>());
}

// Rejects a batch whose parts do not match, or models the algorithm needs but lacks.
void check_batch(const algo::Algorithm& algorithm, const TrainModels& m, const std::vector<Sequence>& seqs,
                 const std::vector<double>& rewards, const std::vector<size_t>& group_sizes,
                 const std::vector<uint8_t>& truncated) {
  const auto& o = algorithm.options();
  RLX_CHECK(rewards.size() == seqs.size(), "train_on_batch: {} rewards for {} sequences", rewards.size(), seqs.size());
  RLX_CHECK(std::accumulate(group_sizes.begin(), group_sizes.end(), size_t{0}) == seqs.size(),
            "train_on_batch: the group sizes do not add up to the {} sequences", seqs.size());
  RLX_CHECK(truncated.empty() || truncated.size() == seqs.size(), "train_on_batch: {} truncation marks for {} sequences",
            truncated.size(), seqs.size());
  const bool head = algorithm.needs_critic() && o.critic == algo::CriticKind::head;
  RLX_CHECK(!algorithm.needs_critic() || head || m.critic, "{}: needs a critic (algorithm.critic = separate)", o.name);
  RLX_CHECK(!head || m.policy.options().value_head, "{}: critic = head needs a policy learner with a value head", o.name);
  RLX_CHECK(!algorithm.needs_reference() || m.reference, "{}: needs the reference model (kl_coef or kl_target > 0)",
            o.name);
  RLX_CHECK(!algorithm.needs_teacher() || m.teacher, "{}: needs a teacher model (algorithm.teacher)", o.name);
}

// 1. What the models say about the batch before any update: old log-probs (and values), the
// reference's and the teacher's log-probs, a separate critic's values.
void annotate_batch(const algo::Algorithm& algorithm, const TrainModels& m, std::vector<Sequence>& seqs, bool on_policy,
                    bool head) {
  if (algorithm.needs_old_logprobs() && !on_policy) m.policy.annotate(seqs, "old_logprobs", head ? "old_values" : "");
  const auto& po = m.policy.options();
  if (m.reference && algorithm.needs_reference())
    m.reference->annotate(seqs, po.packing, "ref_logprobs", po.head_on_loss_tokens);
  if (algorithm.needs_teacher()) m.teacher->annotate(seqs, po.packing, "teacher_logprobs", po.head_on_loss_tokens);
  if (algorithm.needs_critic() && !head) m.critic->annotate(seqs, "", "old_values");
}

// A critic's per-token advantages and returns into the sequences; the advantages of all
// trained tokens, in order.
std::vector<double> critic_advantages(const algo::Algorithm& algorithm, std::vector<Sequence>& seqs,
                                      const std::vector<double>& shaped, const algo::AllReduceSum& sum) {
  std::vector<double> adv_values;
  std::vector<algo::TokenTrajectory> batch;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const bool ref = seqs[i].values.count("ref_logprobs") > 0;
    batch.push_back({.reward = shaped[i],
                     .values = trained(seqs[i], "old_values"),
                     .old_logprobs = trained(seqs[i], "old_logprobs"),
                     .ref_logprobs = ref ? trained(seqs[i], "ref_logprobs") : at::Tensor()});
  }
  auto targets = algorithm.critic()->token_advantages(batch, sum);
  for (size_t i = 0; i < seqs.size(); ++i) {
    scatter_trained(seqs[i], "advantages", targets[i].advantages);
    scatter_trained(seqs[i], "returns", targets[i].returns);
    auto a = targets[i].advantages.contiguous();
    adv_values.insert(adv_values.end(), a.data_ptr<double>(), a.data_ptr<double>() + a.numel());
  }
  return adv_values;
}

// An outcome's advantage per sequence (from its group's rewards) on every token; the
// advantages of all trained tokens, in order.
std::vector<double> outcome_advantages(const algo::Algorithm& algorithm, std::vector<Sequence>& seqs,
                                       const std::vector<double>& shaped, const std::vector<int64_t>& lengths,
                                       const std::vector<size_t>& group_sizes, const algo::AllReduceSum& sum) {
  std::vector<double> adv_values;
  std::vector<std::vector<algo::Sample>> groups;
  size_t i = 0;
  for (auto n : group_sizes) {
    auto& g = groups.emplace_back();
    for (size_t k = 0; k < n; ++k, ++i) g.push_back({.reward = shaped[i], .response_tokens = lengths[i]});
  }
  auto adv = algorithm.outcome()->advantages(groups, sum);
  i = 0;
  for (const auto& g : adv)
    for (double a : g) {
      set_advantage(seqs[i], a);
      adv_values.insert(adv_values.end(), static_cast<size_t>(lengths[i]), a);  // per trained token
      ++i;
    }
  return adv_values;
}

// 2. Advantages (and returns), from rewards shaped by the overlong penalty; the batch's
// metrics (algo::batch_metrics, the mean overlong penalty).
algo::Metrics add_advantages(const algo::Algorithm& algorithm, std::vector<Sequence>& seqs,
                             const std::vector<double>& rewards, const std::vector<size_t>& group_sizes,
                             dist::Communicator& comm, const algo::AllReduceSum& sum) {
  const auto& o = algorithm.options();
  std::vector<int64_t> lengths;
  for (const auto& s : seqs) lengths.push_back(std::accumulate(s.loss_mask.begin(), s.loss_mask.end(), int64_t{0}));
  std::vector<double> shaped = rewards;
  double penalty_sum = 0;
  if (o.overlong_buffer > 0)
    for (size_t i = 0; i < shaped.size(); ++i) {
      const double p = o.overlong_factor * algo::overlong_penalty(lengths[i], o.max_response_tokens, o.overlong_buffer);
      shaped[i] += p;
      penalty_sum += p;
    }
  const std::vector<double> adv_values = algorithm.needs_critic()
                                             ? critic_advantages(algorithm, seqs, shaped, sum)
                                             : outcome_advantages(algorithm, seqs, shaped, lengths, group_sizes, sum);
  auto metrics = algo::batch_metrics(rewards, adv_values, lengths, sum, [&comm](std::vector<double>& v) {
    auto t = at::tensor(v, at::kDouble);
    comm.all_reduce(t, dist::ReduceOp::max, "batch maxima")->wait();
    for (size_t i = 0; i < v.size(); ++i) v[i] = t[static_cast<int64_t>(i)].item<double>();
  });

  if (o.overlong_buffer > 0) {
    std::vector<double> p{penalty_sum, static_cast<double>(seqs.size())};
    sum(p);
    metrics["overlong_penalty_mean"] = p[1] > 0 ? p[0] / p[1] : 0.0;
  }
  return metrics;
}

// 3. The adaptive KL controller sees the batch's KL per sequence (old policy vs reference).
void observe_kl(algo::Algorithm& algorithm, const std::vector<Sequence>& seqs, const algo::AllReduceSum& sum) {
  std::vector<double> kl{0, static_cast<double>(seqs.size())};
  for (const auto& s : seqs) kl[0] += (trained(s, "old_logprobs") - trained(s, "ref_logprobs")).sum().item<double>();
  sum(kl);
  if (kl[1] > 0) algorithm.observe_kl(kl[0] / kl[1], kl[1]);
}

// The sums over a batch's optimizer steps, of the policy's and a separate critic's.
struct StepSums {
  Metrics sums, critic_sums;
  RoutingStats routing;
  double loss = 0, grad_norm = 0, lr = 0, critic_loss_sum = 0;
  int64_t steps = 0;
};

// 4. Epochs x mini-batches of optimizer steps, in a fixed shuffled order from the policy's
// random stream.
StepSums optimize(const algo::Algorithm& algorithm, const TrainModels& m, const std::vector<Sequence>& seqs,
                  bool on_policy, bool head) {
  const auto& o = algorithm.options();
  const auto names = algorithm.metric_names();
  auto critic_names = algorithm.critic() ? algorithm.critic()->value_metric_names() : std::vector<std::string>{};
  critic_names.push_back("tokens");
  StepSums t;
  std::vector<size_t> order(seqs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const auto n_mb = static_cast<size_t>(o.mini_batches);
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    if (epoch > 0)  // Fisher-Yates from the policy's stream: the same order on a resumed run
      for (size_t i = order.size(); i > 1; --i)
        std::swap(order[i - 1], order[static_cast<size_t>(m.policy.rng().uniform_int(0, static_cast<int64_t>(i) - 1))]);
    for (size_t b = 0; b < n_mb; ++b) {
      std::vector<Sequence> part;
      for (size_t i = b * order.size() / n_mb; i < (b + 1) * order.size() / n_mb; ++i) part.push_back(seqs[order[i]]);
      auto r = m.policy.step(part, algorithm_loss(algorithm, on_policy), names);
      for (const auto& [k, v] : r.metrics) t.sums[k] += v;
      t.routing += r.routing;
      t.loss += r.loss, t.grad_norm += r.grad_norm, t.lr = r.lr, ++t.steps;
      if (algorithm.needs_critic() && !head) {
        auto c = m.critic->step(part, critic_loss(algorithm), critic_names);
        for (const auto& [k, v] : c.metrics) t.critic_sums[k] += v;
        t.critic_loss_sum += c.loss;
      }
    }
  }
  return t;
}

// The steps' means into the batch's metrics, with "lr", "kl_coef", "optimizer_steps" and
// the routing statistics.
void add_step_means(const algo::Algorithm& algorithm, const StepSums& t, bool head, algo::Metrics& metrics) {
  for (const auto& [k, v] : algo::Algorithm::means(t.sums))
    if (head || k.rfind("value", 0) != 0) metrics[k] = v;  // the policy reports values only with a value head
  for (const auto& [k, v] : algo::Algorithm::means(t.critic_sums))
    if (k != "tokens") metrics["critic_" + k] = v;
  for (const char* k : {"pg_loss", "value_loss", "critic_value_loss"})  // step losses: the mean over steps
    if (metrics.count(k)) metrics[k] /= static_cast<double>(t.steps);
  metrics["loss"] = t.loss / static_cast<double>(t.steps);
  metrics["grad_norm"] = t.grad_norm / static_cast<double>(t.steps);
  if (algorithm.needs_critic() && !head) metrics["critic_loss"] = t.critic_loss_sum / static_cast<double>(t.steps);
  metrics["lr"] = t.lr;
  metrics["kl_coef"] = algorithm.kl_coef();
  metrics["optimizer_steps"] = static_cast<double>(t.steps);
  t.routing.add_to(metrics);
}

}  // namespace

LossFn algorithm_loss(const algo::Algorithm& algorithm, bool on_policy) {
  return [&algorithm, on_policy](const MicroBatch& mb, const TokenOutputs& out, const StepContext& ctx,
                                 MetricSums& metrics) {
    return algorithm.loss(loss_inputs(mb, out, on_policy), normalizers(algorithm, ctx), metrics);
  };
}

LossFn critic_loss(const algo::Algorithm& algorithm) {
  return [&algorithm](const MicroBatch& mb, const TokenOutputs& out, const StepContext& ctx, MetricSums& metrics) {
    auto in = loss_inputs(mb, out);
    metrics.add("tokens", in.mask.sum());
    return algorithm.critic()->value_loss(in, normalizers(algorithm, ctx), metrics);
  };
}

void set_advantage(Sequence& seq, double advantage) {
  seq.values["advantages"] = std::vector<float>(seq.tokens.size(), static_cast<float>(advantage));
}

algo::Metrics train_on_batch(algo::Algorithm& algorithm, const TrainModels& m, std::vector<Sequence>& seqs,
                             const std::vector<double>& rewards, const std::vector<size_t>& group_sizes,
                             const std::vector<uint8_t>& truncated) {
  check_batch(algorithm, m, seqs, rewards, group_sizes, truncated);
  const auto& o = algorithm.options();
  auto& comm = m.policy.comm();
  const bool head = algorithm.needs_critic() && o.critic == algo::CriticKind::head;
  auto sum = all_reduce_sum(comm, "batch statistics");
  // With one optimizer step on the batch, no critic and no KL controller, the policy before
  // the update is the one the step runs: its log-probs come from the step's own forward,
  // detached (the values a forward pass of their own would give, as verl and TRL take
  // them), not from one more pass.
  const bool on_policy = o.epochs == 1 && o.mini_batches == 1 && o.kl_target <= 0 && !algorithm.needs_critic();
  annotate_batch(algorithm, m, seqs, on_policy, head);
  auto metrics = add_advantages(algorithm, seqs, rewards, group_sizes, comm, sum);
  if (o.kl_target > 0) observe_kl(algorithm, seqs, sum);
  // DAPO's overlong filtering: a sample cut by max_new_tokens trains nothing; its reward
  // counted above, in its group's advantages.
  if (o.mask_truncated)
    for (size_t i = 0; i < truncated.size(); ++i)
      if (truncated[i]) std::fill(seqs[i].loss_mask.begin(), seqs[i].loss_mask.end(), uint8_t{0});
  add_step_means(algorithm, optimize(algorithm, m, seqs, on_policy, head), head, metrics);
  return metrics;
}

}  // namespace rlx
