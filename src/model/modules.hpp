// The transformer's modules (private to src/model): their registered names are HF's, so
// named_parameters() gives a checkpoint's tensor names one to one.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <vector>

#include "rlx/core/error.hpp"
#include "rlx/model/config.hpp"
#include "rlx/model/fused_ops.hpp"
#include "rlx/model/moe.hpp"

namespace rlx::detail {

// One matrix of a LoRA adapter (its module name, lora_A or lora_B, is PEFT's).
struct LoraWeight : torch::nn::Module {
  at::Tensor weight;
  LoraWeight(int64_t rows, int64_t cols, const at::TensorOptions& o) {
    weight = register_parameter("weight", at::zeros({rows, cols}, o));
  }
};

struct Projection : torch::nn::Module {
  at::Tensor weight, bias;
  std::shared_ptr<LoraWeight> lora_A, lora_B;  // add_lora(): A [rank, in], B [out, rank]
  at::Tensor base;                             // LoraMode::merged: the weight without the adapter
  Projection(int64_t in, int64_t out, bool with_bias, const at::TensorOptions& o) {
    weight = register_parameter("weight", at::empty({out, in}, o));
    if (with_bias) bias = register_parameter("bias", at::empty({out}, o));
  }
  at::Tensor operator()(const at::Tensor& x) const { return at::linear(x, weight, bias); }
  void add_lora(int64_t rank) {
    const auto o = weight.options();
    lora_A = register_module("lora_A", std::make_shared<LoraWeight>(rank, weight.size(1), o));
    lora_B = register_module("lora_B", std::make_shared<LoraWeight>(weight.size(0), rank, o));
  }
};

struct RmsNorm : torch::nn::Module {
  at::Tensor weight;
  double eps;
  RmsNorm(int64_t dim, double eps, const at::TensorOptions& o) : eps(eps) {
    weight = register_parameter("weight", at::empty({dim}, o));
  }
  // HF: normalise in fp32, cast back, then scale (one op on the CPU: model/fused_ops.hpp).
  at::Tensor operator()(const at::Tensor& x) const { return fused::rms_norm(x, weight, eps); }
};

// Makes `parts` (parameters of equal trailing shape) views of one new tensor, their
// concatenation along dim 0, and returns it.
inline at::Tensor fuse(const std::vector<at::Tensor*>& parts) {
  std::vector<at::Tensor> values;
  for (auto* p : parts) values.push_back(*p);
  auto fused = at::cat(values, 0).contiguous();
  int64_t at = 0;
  for (auto* p : parts) {
    const int64_t n = p->size(0);
    p->set_data(fused.narrow(0, at, n));
    at += n;
  }
  return fused;
}

struct Attention : torch::nn::Module {
  std::shared_ptr<Projection> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RmsNorm> q_norm, k_norm;  // qk_norm (Qwen3): over each head's head_dim
  at::Tensor qkv_weight, qkv_bias;          // fuse_projections(): q, k, v concatenated
  Attention(const ModelConfig& c, const at::TensorOptions& o) {
    q_proj = register_module("q_proj", std::make_shared<Projection>(c.hidden_size, c.num_heads * c.head_dim, c.qkv_bias, o));
    k_proj = register_module("k_proj", std::make_shared<Projection>(c.hidden_size, c.num_kv_heads * c.head_dim, c.qkv_bias, o));
    v_proj = register_module("v_proj", std::make_shared<Projection>(c.hidden_size, c.num_kv_heads * c.head_dim, c.qkv_bias, o));
    o_proj = register_module("o_proj", std::make_shared<Projection>(c.num_heads * c.head_dim, c.hidden_size, c.o_bias, o));
    if (c.qk_norm) {
      q_norm = register_module("q_norm", std::make_shared<RmsNorm>(c.head_dim, c.rms_norm_eps, o));
      k_norm = register_module("k_norm", std::make_shared<RmsNorm>(c.head_dim, c.rms_norm_eps, o));
    }
  }
};

// A SwiGLU MLP: down(silu(gate x) * up x). A dense layer's, or one expert's (Mixtral names
// its projections w1 (gate), w3 (up) and w2 (down)).
struct Mlp : torch::nn::Module {
  std::shared_ptr<Projection> gate_proj, up_proj, down_proj;
  at::Tensor gate_up_weight, gate_up_bias;  // fuse_projections(): gate, up concatenated
  Mlp(int64_t hidden, int64_t inner, bool bias, bool mixtral_names, const at::TensorOptions& o) {
    gate_proj = register_module(mixtral_names ? "w1" : "gate_proj", std::make_shared<Projection>(hidden, inner, bias, o));
    up_proj = register_module(mixtral_names ? "w3" : "up_proj", std::make_shared<Projection>(hidden, inner, bias, o));
    down_proj = register_module(mixtral_names ? "w2" : "down_proj", std::make_shared<Projection>(inner, hidden, bias, o));
  }
};

// A sparse layer: the router (`gate`, [num_experts, hidden], no bias) and the experts.
struct SparseMoe : torch::nn::Module {
  std::shared_ptr<Projection> gate;
  torch::nn::ModuleList expert_list;
  std::vector<std::shared_ptr<Mlp>> experts;
  // fuse_projections(): every expert's gate and up rows [E, 2 I, H], and downs [E, H, I];
  // the experts' parameters are views of them.
  at::Tensor gate_up_all, down_all;
  SparseMoe(const ModelConfig& c, const at::TensorOptions& o) {
    gate = register_module("gate", std::make_shared<Projection>(c.hidden_size, c.num_experts, false, o));
    expert_list = register_module("experts", torch::nn::ModuleList());
    for (int64_t e = 0; e < c.num_experts; ++e) {
      experts.push_back(std::make_shared<Mlp>(c.hidden_size, c.moe_intermediate_size, false, c.arch == Arch::mixtral, o));
      expert_list->push_back(experts.back());
    }
  }
};

struct Block : torch::nn::Module {
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<Mlp> mlp;        // a dense layer
  std::shared_ptr<SparseMoe> moe;  // a sparse layer (Qwen3-MoE: "mlp", Mixtral: "block_sparse_moe")
  int64_t sparse_slot = -1;        // the layer's index among the sparse layers
  std::shared_ptr<RmsNorm> input_layernorm, post_attention_layernorm;
  // The projections a LoRA target names (model/lora.hpp's kLoraTargets): an MLP target in a
  // sparse layer is that projection of every expert (Mixtral: gate w1, up w3, down w2).
  std::vector<Projection*> projections(std::string_view name) {
    if (name == "q_proj") return {self_attn->q_proj.get()};
    if (name == "k_proj") return {self_attn->k_proj.get()};
    if (name == "v_proj") return {self_attn->v_proj.get()};
    if (name == "o_proj") return {self_attn->o_proj.get()};
    RLX_CHECK(name == "gate_proj" || name == "up_proj" || name == "down_proj", "no projection named {:?}", name);
    auto pick = [&](Mlp& m) { return name == "gate_proj" ? m.gate_proj.get() : name == "up_proj" ? m.up_proj.get() : m.down_proj.get(); };
    if (mlp) return {pick(*mlp)};
    std::vector<Projection*> out;
    for (auto& e : moe->experts) out.push_back(pick(*e));
    return out;
  }
  Block(const ModelConfig& c, int64_t index, const at::TensorOptions& o) {
    self_attn = register_module("self_attn", std::make_shared<Attention>(c, o));
    if (c.is_sparse(index)) {
      moe = register_module(c.arch == Arch::mixtral ? "block_sparse_moe" : "mlp", std::make_shared<SparseMoe>(c, o));
      const auto sparse = c.sparse_layers();
      sparse_slot = std::find(sparse.begin(), sparse.end(), index) - sparse.begin();
    } else {
      mlp = register_module("mlp", std::make_shared<Mlp>(c.hidden_size, c.intermediate_size, c.mlp_bias, false, o));
    }
    input_layernorm = register_module("input_layernorm", std::make_shared<RmsNorm>(c.hidden_size, c.rms_norm_eps, o));
    post_attention_layernorm =
        register_module("post_attention_layernorm", std::make_shared<RmsNorm>(c.hidden_size, c.rms_norm_eps, o));
  }
};

struct Embedding : torch::nn::Module {
  at::Tensor weight;
  Embedding(int64_t n, int64_t dim, const at::TensorOptions& o) { weight = register_parameter("weight", at::empty({n, dim}, o)); }
};

struct Body : torch::nn::Module {
  std::shared_ptr<Embedding> embed_tokens;
  torch::nn::ModuleList layers;
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<RmsNorm> norm;
  Body(const ModelConfig& c, const at::TensorOptions& o) {
    embed_tokens = register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, o));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_layers; ++i) {
      blocks.push_back(std::make_shared<Block>(c, i, o));
      layers->push_back(blocks.back());
    }
    norm = register_module("norm", std::make_shared<RmsNorm>(c.hidden_size, c.rms_norm_eps, o));
  }
};


// Adds the unmerged LoRA adapters of `projections` (joined outputs y, shared input x) to y;
// the identity without adapters. `site` keys dropout masks.
using LoraHook = std::function<at::Tensor(const at::Tensor& y, std::initializer_list<const Projection*> projections,
                                          const at::Tensor& x, uint64_t site)>;

// One sparse layer's forward. x [N, H] (the flattened tokens), valid [N] bool (false:
// padding; undefined: all valid), forced [N, k] int64 (the experts to use; a row of -1: the
// router chooses; undefined: all route). `site` is the layer's first LoRA dropout site.
at::Tensor moe_forward(const SparseMoe& moe, const ModelConfig& cfg, const at::Tensor& x, const at::Tensor& valid,
                       const at::Tensor& forced, RoutingTrace* trace, int64_t slot, MoeStrategy strategy,
                       const LoraHook& lora, uint64_t site);

}  // namespace rlx::detail
