// The engine's core: one step at a time, on the thread that calls Engine::step(). It takes
// what other threads handed in (EngineInbox), applies a staged weight update following its
// policy, asks the Scheduler for a plan, has the ModelRunner carry it out, and appends the
// sampled tokens to the requests (RequestTable). Decode steps may overlap: see
// decode_pipeline.cpp.
//
//   EngineCore core(model, cfg, tokenizer, version, inbox);
//   while (inbox.has_work()) for (auto& r : core.step()) use(r);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rlx/rollout/engine.hpp"
#include "rlx/rollout/scheduler.hpp"
#include "rollout/engine_inbox.hpp"
#include "rollout/engine_requests.hpp"
#include "rollout/model_runner.hpp"

namespace rlx {

class EngineCore {
 public:
  using Tensors = std::vector<std::pair<std::string, at::Tensor>>;
  EngineCore(std::shared_ptr<Transformer> model, EngineConfig cfg, std::shared_ptr<const Tokenizer> tokenizer,
             int64_t weight_version, EngineInbox& inbox);
  ~EngineCore();  // the decode steps in flight land (their tokens are appended)
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Throws unless r fits this model and cache (Engine::add's checks before the inbox's).
  void check_request(const GenerationRequest& r, const std::string& who) const;
  std::vector<GenerationResult> step();
  // Results finished during generate() for other callers: the next step() returns them.
  void hand_back(std::vector<GenerationResult> results);

  ModelRunner::Tensors staged_weights(const std::string& who, const Tensors& tensors) const;
  int64_t load_weights(int64_t version, const Tensors& tensors, const std::string& who);
  void sleep();
  void wake();
  bool asleep() const { return asleep_; }

  EngineStats stats() const;
  const EngineConfig& config() const { return cfg_; }
  int64_t max_model_len() const { return max_model_len_; }
  const BlockAllocator& blocks() const { return scheduler_.blocks(); }
  const BlockRouting& routing() const { return routing_; }
  const ModelRunner& runner() const { return runner_; }

 private:
  void take_inbox();
  bool maybe_apply_update();
  // Copies a checked set of weights into the model as `version` (between steps).
  int64_t install_weights(int64_t version, const Tensors& tensors);
  // A prefill or mixed step: the planned chunks' forward, then the rows whose known tokens
  // are all computed sample (a group's leader forks its followers first).
  void forward_and_sample();
  void sample_completing(const at::Tensor& hidden, const std::vector<Sequence*>& completing,
                         const std::vector<int64_t>& last_rows);
  // Appends row i's sampled token to rows[i]; a row whose sequence is gone or finished
  // (a pipelined step's) is discarded. Then finished sequences leave the running set.
  void append_rows(const std::vector<Sequence*>& rows, const std::vector<int64_t>& tokens,
                   const std::vector<float>& logprobs, std::vector<std::vector<TokenLogprob>>& top);
  // Decode steps that may overlap (decode_pipeline.cpp): every planned row one token that
  // samples. launch_decode() enqueues one (chained: the same rows again, one token further,
  // before the last launch's tokens are known); land_decode() appends the oldest launch's.
  bool plain_decode() const;
  bool try_chain();
  void launch_decode(bool chained);
  void land_decode();
  void land_all();
  // The sampling rows of `seqs`: their parameters and the uniform of the position they
  // sample (`ahead` tokens past their known tokens: 1 for a chained decode step).
  SamplingBatch sampling_batch(const std::vector<Sequence*>& seqs, int64_t ahead = 0) const;
  // Log-prob alternatives (engine_logprobs.cpp): what each of `seqs` asks (empty if none);
  // the prompt log-probs of the planned prefill chunks that ask, from the step's hidden
  // states [tokens, H] in plan order.
  static Alternatives alternatives(const std::vector<Sequence*>& seqs);
  void record_prompt_logprobs(const at::Tensor& hidden);
  // Mixture-of-experts routing: `rows` ([tokens][layers x top_k]) of the tokens each span
  // computed, into their KV slots; a null or finished span's rows are skipped.
  struct RoutedSpan {
    Sequence* seq;
    int64_t from, n;
  };
  void store_routing(const std::vector<int16_t>& rows, const std::vector<RoutedSpan>& spans);
  // Runs a step's forward; if it throws, the prefix cache forgets what the step published.
  template <class F>
  auto forgetting_on_error(F&& forward) -> decltype(forward());

  EngineConfig cfg_;
  int64_t max_model_len_;
  EngineInbox& inbox_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  Scheduler scheduler_;
  BlockRouting routing_;  // mixture-of-experts with record_routing: each KV slot's experts
  ModelRunner runner_;
  RequestTable requests_;
  int64_t version_;
  std::optional<PendingUpdate> update_;
  EngineStats stats_;
  StepPlan plan_;  // the step being carried out
  std::vector<GenerationResult> unclaimed_;
  bool asleep_ = false;  // sleep(): the KV pool is freed
};

template <class F>
auto EngineCore::forgetting_on_error(F&& forward) -> decltype(forward()) {
  try {
    return forward();
  } catch (...) {
    scheduler_.forget_prefixes();  // blocks published for this step were never computed
    throw;
  }
}

}  // namespace rlx
