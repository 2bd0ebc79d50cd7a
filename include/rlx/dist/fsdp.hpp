// FSDP-style sharding of rlx's transformer across the ranks of a Communicator.
//
// The parameters are grouped into units: one per transformer block, plus a root
// unit (embeddings, final norm, LM head). Each unit is one flat fp32 buffer,
// padded to a multiple of the group size and split evenly: a rank owns only its
// shard (the master copy, which the optimizer updates). Before a block runs, its
// full parameters are all-gathered in the compute dtype (the next block's gather
// is already in flight); after it runs they are freed. Backward gathers them
// again, computes the block's gradients and reduce-scatters them (in the
// reduce dtype) into the shard's .grad. The root unit stays gathered from the
// start of forward to finish_backward().
//
// With activation checkpointing a block keeps only its input during forward and
// recomputes itself in backward; without it the block's activations are kept.
//
// One rank computing in fp32 gathers nothing: the parameters are views of the shards. One
// rank in a lower precision keeps the cast of its shards and makes it again only after they
// change (their version counter moved: an optimizer step or a load).
//
//   rlx::dist::ShardedTransformer model(cfg, *comm, {.activation_checkpointing = true});
//   model.init_weights(seed);
//   auto logits = model.logits(model.forward_hidden({.tokens = ids, .segments = seg}));
//   loss.backward();  model.finish_backward();   // shard grads are now in unit.shard.grad()
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rlx/dist/comm.hpp"
#include "rlx/model/transformer.hpp"

namespace rlx::dist {

struct FsdpOptions {
  at::ScalarType compute_dtype = at::kFloat;  // gathered weights and activations (bf16 on CUDA)
  at::ScalarType reduce_dtype = at::kFloat;   // gradients while they are reduce-scattered
  bool activation_checkpointing = false;      // recompute each block in backward
  bool prefetch = true;                       // start the next block's gather before this one runs
  at::Device device = at::kCPU;
};

// Where one parameter lives in its unit's flat buffer.
struct FlatSlot {
  std::string name;  // HF name
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
  bool decay = false;  // weight decay applies (matrices; not norms or biases)
};

struct ShardedUnit {
  std::string name;  // "root" or "layers.N"
  std::vector<FlatSlot> slots;
  int64_t numel = 0;        // parameters in the unit
  int64_t padded = 0;       // numel rounded up to a multiple of the group size
  int64_t shard_numel = 0;  // padded / group size
  at::Tensor shard;         // fp32 [shard_numel] master shard, a leaf; its .grad is this rank's gradient shard
  at::Tensor decay_mask;    // fp32 [shard_numel], 1 where weight decay applies
  // Gathering state (owned by ShardedTransformer):
  at::Tensor full;          // compute dtype [padded]; the module's parameters are views into it
  at::Tensor send;          // the shard in the compute dtype while a gather is in flight
  std::unique_ptr<Work> pending;
  bool gathered = false;
  int64_t cast_version = -1;  // one rank: the shard's version counter when `full` was cast from it
};

class ShardedTransformer {
 public:
  ShardedTransformer(const ModelConfig& cfg, Communicator& comm, FsdpOptions options = {});
  ~ShardedTransformer();
  ShardedTransformer(const ShardedTransformer&) = delete;
  ShardedTransformer& operator=(const ShardedTransformer&) = delete;

  // This rank's shards of a full model's parameters (same config; any dtype).
  void load_from(const Transformer& full);
  // As Transformer::init_weights(seed) would initialise the whole model.
  void init_weights(uint64_t seed);

  // Hidden states [B, T, hidden]; differentiable with respect to the shards when
  // grad mode is on.
  at::Tensor forward_hidden(const ForwardInput& in);
  at::Tensor logits(const at::Tensor& hidden);
  // The LM-head weight, gathered (for rlx::token_logprobs, which never makes all the logits).
  const at::Tensor& lm_head_weight();
  // After the last backward of a step: the root unit's gradients are reduce-scattered
  // into its shard's .grad and its full parameters freed.
  void finish_backward();
  // Frees whatever is still gathered (after a forward without backward).
  void release_all();

  // Full parameters by HF name (fp32, gathered from the masters on every rank).
  std::vector<std::pair<std::string, at::Tensor>> gather_parameters();

  const ModelConfig& config() const { return cfg_; }
  const FsdpOptions& options() const { return opt_; }
  Communicator& comm() { return comm_; }
  std::vector<ShardedUnit>& units() { return units_; }
  // The module whose parameters are views into the gathered buffers (valid only while gathered).
  Transformer& module() { return *model_; }
  // Parameters held by this rank (shards only) and in the whole model.
  int64_t local_numel() const;
  int64_t total_numel() const;
  // One rank in fp32: the module's parameters are views of the shards (no gather, no free,
  // no copies), and the optimizer's updates are the module's weights.
  bool in_place() const;

  // Used by the per-block autograd function.
  void gather(size_t unit);
  void start_gather(size_t unit);
  void release(size_t unit);
  std::vector<at::Tensor> unit_parameters(size_t unit);
  // Flattens the unit's parameter gradients and reduce-scatters them; returns the fp32 shard gradient.
  at::Tensor reduce_gradients(size_t unit, const std::vector<at::Tensor>& grads);

 private:
  void free_storage(ShardedUnit& u);
  void allocate_storage(ShardedUnit& u);

  ModelConfig cfg_;
  Communicator& comm_;
  FsdpOptions opt_;
  std::shared_ptr<Transformer> model_;
  std::vector<ShardedUnit> units_;  // [0] root, [1 + l] layer l
  std::vector<std::vector<at::Tensor>> params_;  // the module's parameter tensors per unit, slot order
};

}  // namespace rlx::dist
