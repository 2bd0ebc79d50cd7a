// Turning a rank's sequences into micro-batches by token budget, packed without
// padding where the attention path allows (each sequence is its own segment of a
// row, so a row holds several short sequences).
//
// Sequences that begin with the same untrained tokens (the samples of one prompt: a GRPO
// group) share them: the prompt is packed once, as a segment of its own, and each
// sequence's remaining tokens are a segment that attends to it (ForwardInput::prefix), at
// the positions that follow it. The model runs the prompt once instead of once per sample;
// every trained token sees exactly the context it would see alone.
//
// A mixture-of-experts rollout's routing (Sequence::routing) is packed like the tokens, as
// MicroBatch::routing, the model's routing replay input: a shared prompt takes its members'
// (the first recorded row of each token).
//
//   std::vector<rlx::Sequence> seqs = ...;           // token ids + which tokens are trained
//   auto mbs = rlx::pack_micro_batches(seqs, {.micro_batch_tokens = 8192, .row_tokens = 2048});
//   // mbs[i].tokens [R, T], .segments (0 = padding), .targets (next token), .loss_mask
//   auto hidden = model.forward_hidden(rlx::forward_input(mbs[i]));
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rlx/model/kv_cache.hpp"

namespace rlx {

struct Sequence {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> loss_mask;             // per token: 1 where the token is trained (predicted)
  std::map<std::string, std::vector<float>> values;  // per-token values (advantages, old log-probs, ...)
  // Mixture-of-experts rollouts: per token, the experts each sparse layer used when the
  // sampler forwarded it, [tokens][routing_layers][routing_top_k]; -1: not recorded (the
  // learner's router chooses). Empty: none recorded.
  std::vector<int16_t> routing;
  uint16_t routing_layers = 0, routing_top_k = 0;
};

struct PackOptions {
  int64_t micro_batch_tokens = 8192;  // rows x row length per micro-batch, padding included
  int64_t row_tokens = 2048;          // longest row; a longer sequence is an error. Rows are
                                      // only as long as the batch's longest sequence.
  bool pack = true;                   // several sequences per row (false: one per row)
  bool share_prefix = true;           // with pack: a prompt shared by several sequences packed once
};

// A prompt packed once for several sequences (MicroBatch::shared).
struct SharedPrefix {
  int64_t row = 0, start = 0, length = 0;  // where it sits: row, first column, tokens
  std::vector<int64_t> members;            // the input sequences that continue it
};

struct MicroBatch {
  at::Tensor tokens;     // [R, T] int64
  at::Tensor segments;   // [R, T] int64, 0 = padding, k = the row's k-th sequence
  at::Tensor targets;    // [R, T] int64, the next token of the same sequence (0 where none)
  at::Tensor loss_mask;  // [R, T] float32, 1 where targets[r, t] is trained
  at::Tensor sequence;   // [R, T] int64, index into the input sequences (-1 for padding and shared prefixes)
  at::Tensor positions;  // [R, T] int64, each token's position in its input sequence
  at::Tensor prefix;     // [R, T] int64, the shared prefix segment a token also sees (0: none);
                         // undefined when the micro-batch shares none
  std::map<std::string, at::Tensor> values;  // [R, T] float32, aligned with targets (value of the target token)
  at::Tensor routing;    // [R, T, S, k] int16, each token's recorded experts (-1: none, padding included);
                         // undefined when no sequence carries routing
  std::vector<int64_t> sequences;  // which input sequences it holds
  std::vector<SharedPrefix> shared;
  int64_t loss_tokens = 0;         // sum of loss_mask
  int64_t shared_tokens = 0;       // tokens not packed again thanks to shared prefixes
};

// The model's input for a micro-batch: tokens, segments, positions, shared prefixes and the
// recorded routing (replayed: a caller that routes anew drops ForwardInput::routing).
ForwardInput forward_input(const MicroBatch& mb);
// The trained positions (loss_mask > 0) as int64 flat indices on `device`, for the policy
// head (LogprobHeadOptions::positions); undefined when every position, or none, is trained.
at::Tensor loss_positions(const MicroBatch& mb, at::Device device);

// Deterministic: longest sequences first into the first row with room (first-fit
// decreasing), rows grouped in order into micro-batches within the budget.
std::vector<MicroBatch> pack_micro_batches(const std::vector<Sequence>& seqs, const PackOptions& options);

// A micro-batch with one padding token and nothing to train: what a rank with no
// data left runs so that every rank runs the same collectives.
MicroBatch empty_micro_batch();

// Which learner rank trains each group of a batch (given by its token count), so that the
// ranks' token counts are balanced: largest group first to the rank with the fewest
// tokens, ties to the earlier group and the lower rank. With at least as many groups as
// ranks every rank gets one. A pure function of the list: every rank computes the same.
std::vector<uint32_t> assign_ranks(const std::vector<int64_t>& group_tokens, uint32_t num_ranks);

}  // namespace rlx
