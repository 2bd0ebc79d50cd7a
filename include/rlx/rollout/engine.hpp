// The rollout engine: continuous batching over a paged KV cache with prefix
// sharing, exact log-probs, and atomic weight updates.
//
// Requests arrive at any time (add(), from any thread); each step() admits
// waiting requests as running ones finish, packs prefill chunks and decode tokens
// into one forward bounded by `max_batch_tokens`, samples, and returns the
// requests that finished. The KV cache bounds the batch: when a running sequence
// needs a block and none is free, the most recently admitted sequence is
// preempted and recomputed later, never failed.
//
// The n samples of a request (a GRPO group) prefill their prompt once and share
// its blocks; the first write into a shared block copies it. Full blocks are also
// cached by the hash of their token prefix (per weight version), so any request
// with a known prefix reuses them.
//
// Every sampled token records its log-prob (log_softmax(logits / T), before
// truncation) and the weight version that produced it. A mixture-of-experts model's
// forwards also record, for every token and sparse layer, the experts its router chose
// (rollout routing replay: the learner can run the same ones); see SampleOutput::routing.
//
// Engine is a facade: a Scheduler (rlx/rollout/scheduler.hpp) plans each step without the
// model; a model runner (src/rollout/model_runner.hpp) carries the plan out: forward,
// sampling, CUDA graphs, the decode pipeline.
//
//   rlx::Engine engine(model, {.kv_cache_mb = 64}, tokenizer);
//   auto results = engine.generate({{.id = "q1", .prompt = ids, .params = {.n = 8, .max_new_tokens = 64}}});
//   for (auto& s : results[0].samples) use(s.tokens, s.logprobs, s.versions, s.finish);
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rlx/core/config.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/model/transformer.hpp"
#include "rlx/rollout/block_allocator.hpp"
#include "rlx/rollout/block_routing.hpp"
#include "rlx/rollout/paged_kv_cache.hpp"
#include "rlx/rollout/sampling.hpp"

namespace rlx {

// What happens to requests in flight when new weights arrive.
enum class UpdatePolicy {
  finish_old,  // in-flight requests finish on the old weights; new ones wait, then run on the new
  abort,       // in-flight requests end now (finish reason abort) with what they have
  continue_,   // partial rollout: in-flight requests go on with the new weights (their cache is recomputed)
};
constexpr std::array<std::pair<UpdatePolicy, std::string_view>, 3> enum_names(UpdatePolicy) {
  return {{{UpdatePolicy::finish_old, "finish_old"}, {UpdatePolicy::abort, "abort"}, {UpdatePolicy::continue_, "continue"}}};
}

enum class FinishReason { stop, length, abort };
constexpr std::array<std::pair<FinishReason, std::string_view>, 3> enum_names(FinishReason) {
  return {{{FinishReason::stop, "stop"}, {FinishReason::length, "length"}, {FinishReason::abort, "abort"}}};
}
std::string_view to_string(FinishReason r);

struct EngineConfig {
  int32_t block_size = 16;         // tokens per KV block
  int64_t kv_cache_blocks = 0;     // blocks in the pool; 0: from kv_cache_mb
  double kv_cache_mb = 256;        // pool size when kv_cache_blocks is 0
  int64_t max_batch_tokens = 2048; // tokens per forward (prefill chunks + decode tokens)
  int64_t max_running = 256;       // sequences in the running batch
  int64_t max_model_len = 0;       // prompt + generated; 0: the model's max_position_embeddings
  int64_t max_queued = 65536;      // requests accepted and not yet returned
  bool prefix_caching = true;      // reuse full blocks across requests by their token prefix
  UpdatePolicy update_policy = UpdatePolicy::finish_old;
  bool cuda_graphs = true;         // on CUDA: decode steps replay CUDA graphs (batch buckets 1..256)
  bool overlap = true;             // launch decode step k+1 before step k's tokens come back
  bool record_routing = true;      // mixture-of-experts models: record each token's experts (routing replay)

  template <class V>
  void visit(V& v) {
    v("block_size", block_size, "tokens per KV-cache block", config::in_range(1, 1024));
    v("kv_cache_blocks", kv_cache_blocks, "KV-cache blocks; 0 sizes the pool from kv_cache_mb", config::at_least(0));
    v("kv_cache_mb", kv_cache_mb, "KV-cache pool size in MiB when kv_cache_blocks is 0", config::greater_than(0));
    v("max_batch_tokens", max_batch_tokens, "tokens per forward pass (prefill chunks plus decode tokens)",
      config::at_least(1));
    v("max_running", max_running, "sequences decoding at once", config::at_least(1));
    v("max_model_len", max_model_len, "context length, prompt plus generated; 0: the model's", config::at_least(0));
    v("max_queued", max_queued, "requests accepted but not yet finished", config::at_least(1));
    v("prefix_caching", prefix_caching, "reuse computed KV blocks of identical token prefixes across requests");
    v("update_policy", update_policy, "requests in flight at a weight update: finish on old weights, abort, or continue");
    v("cuda_graphs", cuda_graphs,
      "on CUDA, run decode steps as captured CUDA graphs (batch buckets 1, 2, 4 .. 256; one block reserved for padding)");
    v("overlap", overlap,
      "plan and launch decode step k+1 while the device runs step k (its input tokens stay on the device); rows "
      "whose sequence stopped at step k are computed and discarded");
    v("record_routing", record_routing,
      "mixture-of-experts models: record the experts each token was routed to, for the learner's routing replay "
      "(int16 per token, sparse layer and top-k slot, kept beside the KV cache); dense models record nothing");
  }
};

struct GenerationRequest {
  std::string id;               // unique among requests in flight
  std::vector<TokenId> prompt;  // non-empty
  SamplingParams params;
  uint64_t seed = 0;            // with id, sample index and position: the sampling randomness
  std::string sampling_key;     // replaces id in the sampling randomness when set (a server's
                                // requests with equal seeds sample alike)
  // Streaming: called on the thread that runs step() with each token as it is sampled
  // (sample index, token, log-prob, its alternatives when params.logprobs > 0), before the
  // request finishes. Tokens are never taken back. It must return quickly and not call into
  // the engine.
  std::function<void(int64_t sample, TokenId token, float logprob, const std::vector<TokenLogprob>& top)> on_token;
};

struct SampleOutput {
  std::vector<TokenId> tokens;    // generated tokens (the stop token or string's last token included)
  std::vector<float> logprobs;    // per token: log_softmax(logits / T)[token]
  std::vector<int64_t> versions;  // per token: the weight version that sampled it
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // per token, with params.logprobs > 0: the alternatives
  FinishReason finish = FinishReason::length;
  std::string stop_string;        // the stop string that ended the sample, if any
  // Mixture-of-experts models (EngineConfig::record_routing): per generated token,
  // [layers][top_k] experts of each sparse layer (GenerationResult::routing_layers,
  // routing_top_k) as the router chose them when the token was forwarded; -1 for a token
  // never forwarded (the last one sampled). Empty for a dense model.
  std::vector<int16_t> routing;
};

struct GenerationResult {
  std::string id;
  std::vector<TokenId> prompt;
  std::vector<SampleOutput> samples;  // params.n of them, in sample order
  // With params.prompt_logprobs >= 0, per prompt token from the second: its log-prob given
  // the tokens before it, and (prompt_logprobs > 0) its alternatives.
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<TokenLogprob>> prompt_top_logprobs;
  // Mixture-of-experts models: the prompt's routing, [prompt][layers][top_k], computed once
  // for the n samples (a token whose keys came from another request's cached prefix has the
  // routing of the forward that computed them); -1 for a token never computed (an aborted
  // request). routing_layers = routing_top_k = 0: nothing recorded (a dense model).
  std::vector<int16_t> prompt_routing;
  uint16_t routing_layers = 0, routing_top_k = 0;
  // Smallest and largest weight version over every generated token (-1 if none).
  std::pair<int64_t, int64_t> version_range() const;
};

struct EngineStats {
  int64_t steps = 0, forward_tokens = 0, prefill_tokens = 0, generated_tokens = 0;
  int64_t preemptions = 0, prefix_hit_tokens = 0, shared_prefill_tokens = 0, cow_copies = 0;
  int64_t running = 0, waiting = 0, queued = 0;
  int32_t free_blocks = 0, total_blocks = 0;
  int64_t weight_version = 0;
  int64_t graph_steps = 0;  // decode steps replayed from a CUDA graph
  int64_t graph_captures = 0;    // graphs captured (a bucket's first step; again after every sleep())
  double graph_capture_s = 0;    // host seconds those captures took
  int64_t overlapped_steps = 0;  // decode steps launched before the previous step's tokens came back
  int64_t discarded_rows = 0;    // rows of such steps whose sequence had stopped (computed, thrown away)
};

class EngineCore;
class EngineInbox;

class Engine {
 public:
  Engine(std::shared_ptr<Transformer> model, EngineConfig cfg = {}, std::shared_ptr<const Tokenizer> tokenizer = nullptr,
         int64_t weight_version = 0);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request (any thread). Throws rlx::Error naming the request and the field for
  // bad input; nothing else is affected.
  void add(GenerationRequest request);
  // Ends a queued or running request at the next step (finish reason abort; partial samples
  // are returned). False if no such request is in flight.
  bool abort(const std::string& id);

  // One scheduling iteration and forward pass; returns the requests that finished.
  std::vector<GenerationResult> step();
  // Steps until nothing is in flight (or the engine is paused); returns everything finished.
  std::vector<GenerationResult> run();
  // Adds the requests, runs them to completion and returns them in the given order. Once
  // `cancel` reads true, the requests still running are aborted (finish reason abort).
  std::vector<GenerationResult> generate(std::vector<GenerationRequest> requests,
                                         const std::atomic<bool>* cancel = nullptr);
  bool has_work() const;

  // Stages a complete set of weights (HF names and shapes, as Transformer::hf_parameters)
  // as `version` (> every earlier version). Validated and copied now; applied at a step
  // boundary, all at once, following `policy` (default: the config's).
  void update_weights(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      std::optional<UpdatePolicy> policy = std::nullopt);
  int64_t weight_version() const;
  const ModelConfig& model_config() const;
  // Sets a complete set of weights as `version` now, with one copy into the model: for an
  // idle engine (nothing queued or running), from the thread that calls step() or one that
  // excludes it (a colocated learner holding the device). Checked as update_weights.
  // Returns the bytes copied.
  int64_t load_weights(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors);

  // Hands the KV pool's memory back while the engine is idle (a colocated learner trains on
  // the same device): the pool's tensors are freed and the prefix cache is emptied; CUDA
  // graphs, which captured the pool's addresses, are dropped. wake() allocates the pool
  // again (graphs are captured anew as decode steps need them). add() still queues while
  // asleep; step() refuses to run.
  void sleep();
  void wake();
  bool asleep() const;
  // The KV pool's bytes (allocated or not).
  int64_t kv_pool_bytes() const;

  // While paused, step() does nothing but accept aborts; add() still queues.
  void pause();
  void resume();
  bool paused() const;

  // Counters and queue sizes; call from the thread that calls step().
  EngineStats stats() const;
  const EngineConfig& config() const;
  int64_t max_model_len() const;
  const BlockAllocator& blocks() const;
  // Mixture-of-experts models with record_routing: the routing recorded per token (layers,
  // top_k); not enabled() otherwise.
  const BlockRouting& routing() const;

 private:
  // The facade: add(), abort() and the weight calls go through the inbox (any thread); the
  // core steps: its Scheduler plans, its ModelRunner forwards and samples
  // (src/rollout/engine_core.hpp).
  std::unique_ptr<EngineInbox> inbox_;
  std::unique_ptr<EngineCore> core_;
};

}  // namespace rlx
