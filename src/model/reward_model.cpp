#include "rlx/model/reward_model.hpp"

#include <c10/core/GradMode.h>

#include <algorithm>

#include "rlx/core/error.hpp"

namespace rlx {

RewardModel::RewardModel(std::shared_ptr<Transformer> body, at::Tensor score) : body_(std::move(body)) {
  RLX_CHECK(body_ != nullptr, "reward model: no body");
  RLX_CHECK(score.defined() && score.numel() == body_->config().hidden_size,
            "reward model: the score head has {} weights, the body's hidden size is {}", score.defined() ? score.numel() : 0,
            body_->config().hidden_size);
  score_ = score.detach().reshape({-1}).to(body_->device(), at::kFloat);
}

RewardModel RewardModel::load(const std::filesystem::path& dir, HfLoadOptions options) {
  at::Tensor score;
  options.score = &score;
  auto body = load_hf(dir, options);
  return RewardModel(std::move(body), score);
}

std::vector<double> RewardModel::score(const std::vector<std::vector<int64_t>>& sequences, int64_t max_batch_tokens) const {
  c10::NoGradGuard no_grad;
  std::vector<double> out(sequences.size(), 0.0);
  // Longest first, so that each padded batch holds sequences of similar length.
  std::vector<size_t> order(sequences.size());
  for (size_t i = 0; i < order.size(); ++i) {
    RLX_CHECK(!sequences[i].empty(), "reward model: sequence {} is empty", i);
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sequences[a].size() > sequences[b].size(); });
  for (size_t begin = 0; begin < order.size();) {
    const auto longest = static_cast<int64_t>(sequences[order[begin]].size());
    const auto rows = static_cast<size_t>(std::max<int64_t>(1, max_batch_tokens / longest));
    const size_t end = std::min(order.size(), begin + rows);
    const auto n = static_cast<int64_t>(end - begin);
    auto tokens = at::zeros({n, longest}, at::kLong), segments = at::zeros({n, longest}, at::kLong);
    auto last = at::empty({n}, at::kLong);
    for (int64_t r = 0; r < n; ++r) {
      const auto& s = sequences[order[begin + static_cast<size_t>(r)]];
      const auto len = static_cast<int64_t>(s.size());
      tokens[r].narrow(0, 0, len).copy_(at::tensor(s, at::kLong));
      segments[r].narrow(0, 0, len).fill_(1);  // 0: padding
      last[r] = len - 1;
    }
    auto hidden = body_->forward_hidden({.tokens = tokens, .segments = segments});  // [n, T, H]
    auto at_last = hidden.gather(1, last.to(hidden.device()).view({n, 1, 1}).expand({n, 1, hidden.size(2)})).squeeze(1);
    auto scores = at::matmul(at_last.to(at::kFloat), score_).to(at::kCPU, at::kDouble).contiguous();
    const double* v = scores.data_ptr<double>();
    for (int64_t r = 0; r < n; ++r) out[order[begin + static_cast<size_t>(r)]] = v[r];
    begin = end;
  }
  return out;
}

void save_hf_reward_model(const Transformer& body, const at::Tensor& score, const std::filesystem::path& dir) {
  RLX_CHECK(score.defined() && score.numel() == body.config().hidden_size,
            "save_hf_reward_model: the score head has {} weights, the hidden size is {}", score.defined() ? score.numel() : 0,
            body.config().hidden_size);
  save_hf(body, dir, {.score = score});
}

}  // namespace rlx
