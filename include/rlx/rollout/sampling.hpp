// Sampling parameters, their validation, and batched sampling on the logits' device.
//
// Order of the transforms (HF's): temperature, then top-k, top-p (on the
// renormalised top-k distribution) and min-p (relative to the most likely token).
// Temperature 0 is greedy (first index of the maximum); any other temperature must be at
// least kMinTemperature (0.01; smaller ones are refused, not rounded to greedy: a run's
// log-probs are of log_softmax(logits / T), which greedy would silently change). The exact rule (thresholds with
// ties kept, integer masses, the inverse CDF in vocabulary order) is written once in
// cuda/sampling_rule.hpp and followed by this CPU sampler and the GPU kernel alike:
// the same uniform gives the same token on both, up to ties.
//
// The log-prob recorded for a token is that of the distribution it was sampled
// from after temperature and before truncation: log_softmax(logits / T)[token]
// (T = 1 for greedy). That is what the learner recomputes from a full forward.
//
// Randomness is counter-based: the uniform that picks a sequence's token at a
// position is philox(seed; request, sample, position), so a request's tokens do
// not depend on the batch it ran in, on its order, or on preemption.
//
//   rlx::SamplingParams p{.temperature = 0.8, .top_p = 0.95, .max_new_tokens = 64};
//   p.validate("request 7");       // throws rlx::Error naming the request and the field
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/core/config.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/cuda/sampling_rule.hpp"

namespace rlx {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy; else >= kMinTemperature
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // in (0, 1]; 1: off
  double min_p = 0.0;        // in [0, 1); 0: off
  int64_t max_new_tokens = 256;
  int64_t n = 1;                          // samples of the prompt (a GRPO group); they share its KV blocks
  std::vector<TokenId> stop_token_ids;    // finishing tokens (kept in the output)
  std::vector<std::string> stop_strings;  // UTF-8; the sample ends with the token that completes one
  bool ignore_eos = false;                // do not stop at the tokenizer's EOS
  // Log-prob alternatives (a server's, not a run's: outside visit()). Both are of the
  // distribution the sampled token's log-prob is from, log_softmax(logits / T) (T = 1 for
  // greedy), as vLLM's `logprobs` and `prompt_logprobs`.
  int64_t logprobs = 0;          // per generated token, its most likely alternatives, 0 to kMaxLogprobs
  int64_t prompt_logprobs = -1;  // -1: none; else every prompt token's log-prob given the ones before it,
                                 // with this many alternatives (0 to kMaxLogprobs); the prompt is
                                 // computed whole (no prefix-cache reuse)
  static constexpr int64_t kMaxLogprobs = 20;
  static constexpr double kMinTemperature = hd::kMinTemperature;  // below it fp32 sampling is not sound (sampling_rule.hpp)

  template <class V>
  void visit(V& v) {
    v("temperature", temperature, "softmax temperature; 0 is greedy, else at least 0.01", config::at_least(0));
    v("top_k", top_k, "keep the k most likely tokens (0: off)", config::at_least(0));
    v("top_p", top_p, "nucleus: smallest set with probability >= top_p (1: off)", config::in_half_open(0, 1));
    v("min_p", min_p, "drop tokens less likely than min_p times the most likely (0: off)", config::in_range(0, 1));
    v("max_new_tokens", max_new_tokens, "tokens to generate at most", config::at_least(1));
    v("n", n, "samples per prompt (GRPO group size); they share the prompt's KV blocks", config::in_range(1, 4096));
    v("stop_token_ids", stop_token_ids, "token ids that end a sample");
    v("stop_strings", stop_strings, "strings that end a sample (needs a tokenizer)");
    v("ignore_eos", ignore_eos, "keep generating past the tokenizer's EOS token");
  }

  bool greedy() const { return temperature == 0.0; }
  // Throws rlx::Error "<who>: <field> ..." for a value out of range. `vocab_size` bounds
  // stop token ids; `has_tokenizer` is required for stop strings.
  void validate(std::string_view who, int64_t vocab_size, bool has_tokenizer) const;
};

// The uniform in [0, 1) that samples (request, sample)'s token at `position`.
double sampling_uniform(uint64_t seed, std::string_view request_id, int64_t sample, int64_t position);

// Per-row sampling inputs for a batch (host vectors; moved to the logits' device).
struct SamplingBatch {
  std::vector<double> temperature;  // 0: greedy
  std::vector<int64_t> top_k;
  std::vector<double> top_p, min_p;
  std::vector<double> uniform;
  void add(const SamplingParams& p, double u);
  size_t size() const { return uniform.size(); }
};

// A token and its log-prob (an alternative of a sampled or prompt token).
struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0;
  bool operator==(const TokenLogprob&) const = default;
};

// The k[i] most likely tokens of log_softmax(logits[i] / T[i]) (T 0: 1), most likely first
// (equal log-probs: the lower token id first), for each row of `logits` [S, V] (any float
// dtype and device; computed in fp32). Rows with k[i] = 0 get an empty list. With
// `sampled` (a row's sampled token and the log-prob the sampler recorded for it), the
// alternatives' log-probs are that one's plus their logit differences / T: the sampled
// token, when among them, has exactly its recorded log-prob.
std::vector<std::vector<TokenLogprob>> top_logprobs(const at::Tensor& logits, const std::vector<double>& temperature,
                                                    const std::vector<int64_t>& k,
                                                    const std::vector<TokenLogprob>& sampled = {});
// log_softmax(logits[i] / T)[targets[i]] for each row of `logits` [R, V] (T 0: 1).
std::vector<float> target_logprobs(const at::Tensor& logits, const std::vector<int64_t>& targets, double temperature);

struct Sampled {
  at::Tensor tokens;    // [S] int64
  at::Tensor logprobs;  // [S] fp32: log_softmax(logits / T)[token]
};

// Samples one token per row of `logits` [S, V] (any float dtype; computed in fp32), on the
// logits' device: the CPU rule on CPU, the sampler kernel on CUDA.
Sampled sample(const at::Tensor& logits, const SamplingBatch& batch);

// One row on the CPU: the rule's reference.
struct SampledRow {
  int64_t token = 0;
  float logprob = 0;  // log_softmax(logits / T)[token]
};
SampledRow sample_row(const float* logits, int64_t vocab, const SamplingParams& p, double uniform);

// The distribution sample() draws from for one row after truncation (probabilities, [V]
// fp64, on the CPU), for tests and diagnostics.
at::Tensor sampling_distribution(const at::Tensor& logits_row, const SamplingParams& p);

}  // namespace rlx
