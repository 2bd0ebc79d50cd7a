// The engine's log-prob alternatives, for a server's `logprobs` / `top_logprobs` and
// `echo` (prompt log-probs): the most likely tokens of the distribution each generated
// token was sampled from, and every prompt token's log-prob given those before it. Both
// read the logits of the step that computes them; neither changes what is sampled.
#include <c10/core/GradMode.h>

#include <algorithm>

#include "rollout/engine_state.hpp"

namespace rlx {

bool Engine::wants_alternatives(const std::vector<Seq*>& seqs) {
  return std::any_of(seqs.begin(), seqs.end(), [](const Seq* s) { return s != nullptr && s->req->req.params.logprobs > 0; });
}

std::vector<std::vector<TokenLogprob>> Engine::alternatives(const at::Tensor& logits, const std::vector<Seq*>& seqs,
                                                            const int64_t* tokens, const float* logprobs) const {
  if (!wants_alternatives(seqs)) return {};
  std::vector<double> temperature;
  std::vector<int64_t> k;
  std::vector<TokenLogprob> sampled;
  for (size_t i = 0; i < seqs.size(); ++i) {
    temperature.push_back(seqs[i] == nullptr ? 1.0 : seqs[i]->req->req.params.temperature);
    k.push_back(seqs[i] == nullptr ? 0 : seqs[i]->req->req.params.logprobs);
    sampled.push_back({static_cast<TokenId>(tokens[i]), logprobs[i]});
  }
  return top_logprobs(logits, temperature, k, sampled);
}

void Engine::record_prompt_logprobs(const at::Tensor& hidden) {
  // Logits of this many rows at a time: a long prompt never holds [prompt, vocab] at once.
  static constexpr int64_t kRows = 256;
  int64_t offset = 0;
  c10::NoGradGuard no_grad;
  for (const auto& [s, n] : plan_) {
    const int64_t first = offset;
    offset += n;
    RequestState& r = *s->req;
    const auto& params = r.req.params;
    if (params.prompt_logprobs < 0) continue;
    // Row p of the chunk (position p) predicts token p + 1: prompt tokens up to the last.
    const int64_t prompt = static_cast<int64_t>(r.prompt_logprobs.size()) + 1;
    const int64_t begin = s->computed, end = std::min(s->computed + n, prompt - 1);
    for (int64_t p0 = begin; p0 < end; p0 += kRows) {
      const int64_t m = std::min(kRows, end - p0);
      const auto logits = model_->logits(hidden.narrow(0, first + (p0 - begin), m));
      std::vector<int64_t> targets(s->tokens.begin() + p0 + 1, s->tokens.begin() + p0 + 1 + m);
      const auto lps = target_logprobs(logits, targets, params.temperature);
      std::copy(lps.begin(), lps.end(), r.prompt_logprobs.begin() + p0);
      if (params.prompt_logprobs == 0) continue;
      auto top = top_logprobs(logits, std::vector<double>(static_cast<size_t>(m), params.temperature),
                              std::vector<int64_t>(static_cast<size_t>(m), params.prompt_logprobs));
      std::move(top.begin(), top.end(), r.prompt_top.begin() + p0);
    }
  }
}

}  // namespace rlx
