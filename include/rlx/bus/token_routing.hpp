// A sample's expert routing (mixture-of-experts models, rollout routing replay): for every
// token and every sparse layer, the experts the rollout engine's router chose when it
// forwarded that token, so that the learner can run the same experts (model/moe.hpp).
//
// Held as int16 per (token, layer, slot), [tokens][layers][top_k], -1 where nothing was
// recorded (a token the engine never forwarded: the last one it sampled, or one whose keys
// came from another request's cached prefix); the learner routes such tokens itself. A
// dense model's samples carry none (layers = top_k = 0, no values).
//
//   rlx::bus::TokenRouting r{.layers = 2, .top_k = 2};
//   r.experts = {0, 5, 1, 3,   -1, -1, -1, -1};   // token 0: layer 0 {0, 5}, layer 1 {1, 3}; token 1: none
//   r.tokens() == 2
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rlx/bus/token_versions.hpp"

namespace rlx::bus {

// The largest expert count a sparse layer may have (ModelConfig::num_experts' bound): a
// recorded expert is in [-1, kMaxExperts).
inline constexpr int16_t kMaxExperts = 4096;

struct TokenRouting {
  uint16_t layers = 0;           // sparse layers (S)
  uint16_t top_k = 0;            // experts each token uses per layer (k)
  std::vector<int16_t> experts;  // [tokens][layers][top_k]; empty: none recorded
  size_t per_token() const { return static_cast<size_t>(layers) * top_k; }
  size_t tokens() const { return per_token() == 0 ? 0 : experts.size() / per_token(); }
  bool empty() const { return experts.empty(); }
  bool operator==(const TokenRouting&) const = default;
};

// A sample's routing read in place (from a payload or over a TokenRouting).
struct RoutingView {
  uint16_t layers = 0, top_k = 0;
  Unaligned<int16_t> experts;
  size_t per_token() const { return static_cast<size_t>(layers) * top_k; }
  bool empty() const { return experts.size() == 0; }
  // Routing read from a peer or a file: none (dimensions 0), or exactly tokens x layers x
  // top_k values; a FrameError (malformed) that says what is wrong otherwise. The values
  // themselves are checked by routing_mismatch (the hub).
  static RoutingView checked(uint16_t layers, uint16_t top_k, Unaligned<int16_t> experts, size_t tokens);
  static RoutingView of(const TokenRouting& r) {
    return {r.layers, r.top_k, {reinterpret_cast<const char*>(r.experts.data()), r.experts.size()}};
  }
  TokenRouting copy() const {
    TokenRouting r{.layers = layers, .top_k = top_k};
    experts.append_to(r.experts);
    return r;
  }
};

// What is wrong with a sample's routing for its `tokens` tokens, or nothing: its shape as
// RoutingView::checked requires, every value in [-1, kMaxExperts).
std::optional<std::string> routing_mismatch(const RoutingView& r, size_t tokens);

}  // namespace rlx::bus
