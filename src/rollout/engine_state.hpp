// The engine's per-sample and per-request state, shared by its source files
// (engine.cpp, decode_pipeline.cpp).
#pragma once

#include "rlx/rollout/engine.hpp"
#if RLX_WITH_CUDA
#include "rollout/decode_graphs.hpp"
#else
namespace rlx::cuda {
class DecodeGraphs {};  // CUDA builds only
}  // namespace rlx::cuda
#endif

namespace rlx {

struct Engine::Seq {
  RequestState* req = nullptr;
  int64_t sample = 0;
  std::vector<TokenId> tokens;   // prompt, then generated
  int64_t computed = 0;          // leading tokens whose keys/values are in `blocks`
  std::vector<BlockId> blocks;
  std::vector<uint64_t> hashes;  // prefix hashes of the leading full blocks
  std::vector<Seq*> followers;   // samples forked from this one once its prompt is computed
  bool running = false, done = false;
  SampleOutput out;
  int64_t generated() const { return static_cast<int64_t>(out.tokens.size()); }
};

struct Engine::RequestState {
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


template <class F>
auto Engine::forgetting_on_error(F&& forward) -> decltype(forward()) {
  try {
    return forward();
  } catch (...) {
    blocks_.clear_cache();  // blocks published for this step were never computed
    throw;
  }
}

}  // namespace rlx
