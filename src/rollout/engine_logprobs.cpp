// The engine's log-prob alternatives, for a server's `logprobs` / `top_logprobs` and
// `echo` (prompt log-probs): the most likely tokens of the distribution each generated
// token was sampled from, and every prompt token's log-prob given those before it. Both
// read the logits of the step that computes them (the model runner's); neither changes
// what is sampled.
#include <algorithm>

#include "rollout/engine_core.hpp"

namespace rlx {

Alternatives EngineCore::alternatives(const std::vector<Sequence*>& seqs) {
  const auto asks = [](const Sequence* s) { return s != nullptr && as_seq(*s).req->req.params.logprobs > 0; };
  if (std::none_of(seqs.begin(), seqs.end(), asks)) return {};
  Alternatives out;
  for (const Sequence* s : seqs) {
    const auto* params = s == nullptr ? nullptr : &as_seq(*s).req->req.params;
    out.temperature.push_back(params == nullptr ? 1.0 : params->temperature);
    out.k.push_back(params == nullptr ? 0 : params->logprobs);
  }
  return out;
}

void EngineCore::record_prompt_logprobs(const at::Tensor& hidden) {
  int64_t offset = 0;
  for (const auto& [s, n] : plan_.chunks) {
    const int64_t first = offset;
    offset += n;
    RequestState& r = *as_seq(s)->req;
    const auto& params = r.req.params;
    if (params.prompt_logprobs < 0) continue;
    // Row p of the chunk (position p) predicts token p + 1: prompt tokens up to the last.
    const int64_t prompt = static_cast<int64_t>(r.prompt_logprobs.size()) + 1;
    const int64_t begin = s->computed, end = std::min(s->computed + n, prompt - 1);
    if (end <= begin) continue;
    runner_.prompt_logprobs(hidden.narrow(0, first, end - begin), s->tokens.data() + begin + 1, end - begin,
                            params.temperature, params.prompt_logprobs, r.prompt_logprobs.data() + begin,
                            params.prompt_logprobs > 0 ? r.prompt_top.data() + begin : nullptr);
  }
}

}  // namespace rlx
