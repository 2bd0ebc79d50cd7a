// The engine's requests in flight: each request's samples (Seq: the scheduler's Sequence
// plus what is returned), the tokens appended to them with their stop rules, and the
// results handed back once every sample has finished. Sequences are created here and
// queued in the Scheduler; finishing one gives its blocks back to it.
//
//   RequestTable table(scheduler, routing, tokenizer, eos, max_model_len);
//   table.add(std::move(request));              // its leader waits in the scheduler
//   table.append(seq, token, logprob, {}, version);  // may finish seq (stop, length)
//   table.collect(finished, [](const RequestState&) {});
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "rlx/rollout/engine.hpp"
#include "rlx/rollout/scheduler.hpp"

namespace rlx {

struct RequestState;

// One sample of a request.
struct Seq : Sequence {
  RequestState* req = nullptr;
  int64_t sample = 0;
  SampleOutput out;
};
// The engine's sequences are all Seqs: the scheduler hands back what the table gave it.
inline Seq& as_seq(Sequence& s) { return static_cast<Seq&>(s); }
inline const Seq& as_seq(const Sequence& s) { return static_cast<const Seq&>(s); }
inline Seq* as_seq(Sequence* s) { return static_cast<Seq*>(s); }

struct RequestState {
  GenerationRequest req;
  std::vector<std::unique_ptr<Seq>> seqs;
  int64_t remaining = 0;
  // req.params.prompt_logprobs >= 0: by prompt position from 1, filled as prefill computes it.
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<TokenLogprob>> prompt_top;
  // Mixture-of-experts: the prompt's routing, [prompt][layers x top_k] (-1 until a sample
  // that computed it finishes).
  std::vector<int16_t> prompt_routing;
};

class RequestTable {
 public:
  RequestTable(Scheduler& scheduler, const BlockRouting& routing, std::shared_ptr<const Tokenizer> tokenizer,
               int64_t eos, int64_t max_model_len)
      : scheduler_(scheduler),
        routing_(routing),
        tokenizer_(std::move(tokenizer)),
        eos_(eos),
        max_model_len_(max_model_len) {}

  // A checked request: its params.n samples; the first (the leader) waits in the scheduler.
  void add(GenerationRequest r);
  RequestState* find(const std::string& id);
  // Appends a sampled token (recorded with the weight `version`); finishes s on a stop
  // token or string, or its length.
  void append(Seq& s, TokenId token, float logprob, std::vector<TokenLogprob> top, int64_t version);
  // Ends every unfinished sample of r (finish reason abort).
  void abort(RequestState& r);
  // Aborts every request with a sample in flight (a weight update with policy abort).
  void abort_started();
  // Moves out every request whose samples have all finished; `retiring` sees each first.
  // Returns their ids.
  std::vector<std::string> collect(std::vector<GenerationResult>& finished,
                                   const std::function<void(const RequestState&)>& retiring);
  int64_t generated_tokens() const { return generated_tokens_; }

 private:
  void finish(Seq& s, FinishReason reason, std::string stop = {});
  // The stop string that `token`, just appended to s, completes (nullptr: none).
  const std::string* stop_string(const Seq& s, TokenId token) const;
  // A finishing sequence's routing, read from its blocks (before they are released).
  void take_routing(Seq& s);

  Scheduler& scheduler_;
  const BlockRouting& routing_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t eos_;  // -1: none
  int64_t max_model_len_;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  int64_t generated_tokens_ = 0;
};

}  // namespace rlx
