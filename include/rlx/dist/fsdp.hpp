// FSDP-style sharding of rlx's transformer across the ranks of a Communicator.
//
// The parameters are grouped into units: one per transformer block, plus a root
// unit (embeddings, final norm, LM head). Each unit is one flat fp32 buffer (its matrices and
// norms, then its biases, so that a block's q, k, v and gate, up weights lie back to back),
// padded to a multiple of the group size and split evenly: a rank owns only its
// shard (the master copy, which the optimizer updates). Before a block runs, its
// full parameters are all-gathered in the compute dtype (the next block's gather
// is already in flight); after it runs they are freed. Backward gathers them
// again, computes the block's gradients and reduce-scatters them (in the
// reduce dtype) into the shard's .grad, the collective travelling while the next
// blocks' backward runs (two in flight; wait_reduces() or finish_backward() waits
// for the rest). The root unit stays gathered from the start of forward to
// finish_backward().
//
// With activation checkpointing a block keeps only its input during forward and
// recomputes itself in backward; without it the block's activations are kept.
//
// One rank computing in fp32 gathers nothing: the parameters are views of the shards. One
// rank in a lower precision keeps the cast of its shards and makes it again only after they
// change (their version counter moved: an optimizer step or a load).
//
// Frozen units (a reference model's, or the base weights under LoRA) keep their shards in
// the compute dtype, get no gradients and no optimizer state. With LoRA (FsdpOptions::lora)
// each block's adapters are a unit of their own ("layers.N.lora", fp32, trained), gathered
// and released with the block; they are all that trained_units() lists.
//
//   rlx::dist::ShardedTransformer model(cfg, *comm, {.activation_checkpointing = true});
//   model.init_weights(seed);
//   auto logits = model.logits(model.forward_hidden({.tokens = ids, .segments = seg}));
//   loss.backward();  model.finish_backward();   // shard grads are now in unit.shard.grad()
#pragma once

#include <ATen/ATen.h>

#include <deque>
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
  bool frozen = false;                        // nothing is trained (a reference model)
  LoraSpec lora{.rank = 0};                   // adapters: only they are trained
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
  bool trained = true;        // false: frozen (the shard in the compute dtype, no gradient)
  bool in_place = false;      // one rank, the shard in the compute dtype: `full` is the shard
};

class ShardedTransformer {
 public:
  ShardedTransformer(const ModelConfig& cfg, Communicator& comm, FsdpOptions options = {});
  ~ShardedTransformer();
  ShardedTransformer(const ShardedTransformer&) = delete;
  ShardedTransformer& operator=(const ShardedTransformer&) = delete;

  // This rank's shards of a full model's parameters (same config; any dtype). Adapters
  // are not touched.
  void load_from(const Transformer& full);
  // As Transformer::init_weights(seed) would initialise the whole model (not the adapters:
  // init_lora, which a Learner calls with its own seed).
  void init_weights(uint64_t seed);
  // The adapters as Transformer::init_lora(seed) initialises them (A random, B zero).
  void init_lora(uint64_t seed);
  // This rank's shards of adapters given by name (lora_parameters()' names; all of them).
  void load_lora(const std::vector<std::pair<std::string, at::Tensor>>& adapters);

  // Hidden states [B, T, hidden]; differentiable with respect to the shards when
  // grad mode is on.
  at::Tensor forward_hidden(const ForwardInput& in);
  at::Tensor logits(const at::Tensor& hidden);
  // The LM-head weight, gathered (for rlx::token_logprobs, which never makes all the logits).
  const at::Tensor& lm_head_weight();
  // After the last backward of a step: the root unit's gradients are reduce-scattered
  // into its shard's .grad and its full parameters freed.
  void finish_backward();
  // After a backward (several ranks): waits for its reduce-scatters still in flight, each
  // added to its unit's shard gradient in the order issued.
  void wait_reduces();
  // Frees whatever is still gathered (after a forward without backward).
  void release_all();
  // After a collective of the group failed: drops the collectives in flight without waiting
  // for them, frees what is gathered and drops the gradients a cut-short backward left
  // (before the group re-forms; the shards stay as they were, for the caller to restore).
  void abandon();

  // Full parameters by HF name (fp32, gathered from the masters on every rank); with LoRA
  // the adapters merged in (W + scale * B A), as an exported model has them.
  std::vector<std::pair<std::string, at::Tensor>> gather_parameters();
  // The adapters by name (fp32, gathered on every rank); empty without LoRA.
  std::vector<std::pair<std::string, at::Tensor>> gather_lora_parameters();
  // What a weight update to rollout engines carries (collective): the adapters with LoRA,
  // else every parameter (Transformer::sync_parameters()'s names and order), in `dtype`
  // (the engines': a bf16 gather is half an fp32 one, and rounds as publishing would).
  std::vector<std::pair<std::string, at::Tensor>> sync_parameters(at::ScalarType dtype = at::kFloat);
  // Trained mode LoRA: whether forward adds the adapters (off: the base weights, KL's
  // reference at no extra memory).
  void set_lora_active(bool on) { model_->set_lora_active(on); }
  const LoraSpec& lora() const { return opt_.lora; }

  const ModelConfig& config() const { return cfg_; }
  const FsdpOptions& options() const { return opt_; }
  Communicator& comm() { return comm_; }
  std::vector<ShardedUnit>& units() { return units_; }
  // The units an optimizer updates, in a stable order: every unit, or with LoRA only the
  // adapters' (none when frozen).
  std::vector<ShardedUnit*> trained_units();
  // The module whose parameters are views into the gathered buffers (valid only while gathered).
  Transformer& module() { return *model_; }
  // Parameters held by this rank (shards only) and in the whole model.
  int64_t local_numel() const;
  int64_t total_numel() const;
  // One rank in fp32: the module's parameters are views of the shards (no gather, no free,
  // no copies), and the optimizer's updates are the module's weights.
  bool in_place() const;

  // A block (layer `l`'s unit and its adapters' unit): gathered, prefetched and released together.
  void gather_block(int64_t l);
  void start_gather_block(int64_t l);
  void release_block(int64_t l);
  // The unit whose shard a block's gradients go to (its adapters' with LoRA); npos when frozen.
  size_t trained_unit_of_block(int64_t l) const;

  // Used by the per-block autograd function.
  void gather(size_t unit);
  void start_gather(size_t unit);
  void release(size_t unit);
  std::vector<at::Tensor> unit_parameters(size_t unit);
  // Flattens the unit's parameter gradients and reduce-scatters them into its shard's fp32
  // gradient. One rank: returns that gradient (nothing to reduce). Several: the collective is
  // queued and its result added to the shard's .grad when it lands, at most
  // kReducesInFlight at a time (wait_reduces() waits for the rest), so backward runs on
  // while it travels; returns an undefined tensor.
  at::Tensor reduce_gradients(size_t unit, const std::vector<at::Tensor>& grads);
  static constexpr size_t kReducesInFlight = 2;

 private:
  void free_storage(ShardedUnit& u);
  void allocate_storage(ShardedUnit& u);
  // Waits for the oldest reduce-scatter in flight and adds it to its unit's shard gradient.
  void complete_reduce();

  ModelConfig cfg_;
  Communicator& comm_;
  FsdpOptions opt_;
  std::shared_ptr<Transformer> model_;
  std::vector<std::pair<std::string, at::Tensor>> gather_units(size_t first, size_t end,
                                                               at::ScalarType dtype = at::kFloat);
  // Units [first, end) from named full tensors (this rank's slice of each flat buffer).
  void load_units(size_t first, size_t end, const std::vector<std::pair<std::string, at::Tensor>>& named,
                  const char* what);

  std::vector<ShardedUnit> units_;  // [0] root, [1 + l] layer l, then with LoRA [1 + L + l] layer l's adapters
  std::vector<std::vector<at::Tensor>> params_;  // the module's parameter tensors per unit, slot order
  struct Reducing {
    size_t unit = 0;
    std::unique_ptr<Work> work;
    at::Tensor flat, shard;  // the collective's input and output, alive until it lands
  };
  std::deque<Reducing> reducing_;  // reduce-scatters in flight, oldest first
};

}  // namespace rlx::dist
