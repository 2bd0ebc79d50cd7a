#include "rlx/dist/fsdp.hpp"

#include <fmt/ranges.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx::dist {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

constexpr const char* kLayerPrefix = "model.layers.";

// What a block needs of the forward's state to run again in backward (checkpointing).
void save_state(AutogradContext* ctx, const ForwardState& st) {
  auto& d = ctx->saved_data;
  d["batch"] = st.batch;
  d["time"] = st.time;
  d["lora_key"] = static_cast<int64_t>(st.lora_key);
  d["train"] = st.train;
  if (st.mask.defined()) d["mask"] = st.mask;
  d["cos"] = st.cos;
  d["sin"] = st.sin;
  if (st.routing.defined()) d["routing"] = st.routing;
  if (st.valid.defined()) d["valid"] = st.valid;
  if (st.trace) d["trace"] = reinterpret_cast<int64_t>(st.trace);
  if (!st.varlen.defined()) return;
  d["cu_q"] = st.varlen.cu_q;
  d["cu_k"] = st.varlen.cu_k;
  if (st.varlen.kv_index.defined()) d["kv_index"] = st.varlen.kv_index;  // shared prefixes' keys
  d["q_lens"] = st.varlen.q_lens;
  d["k_lens"] = st.varlen.k_lens;
  d["max_q"] = st.varlen.max_q;
  d["max_k"] = st.varlen.max_k;
}
ForwardState load_state(AutogradContext* ctx) {
  auto& d = ctx->saved_data;
  ForwardState st;
  st.batch = d["batch"].toInt();
  st.time = d["time"].toInt();
  st.lora_key = static_cast<uint64_t>(d["lora_key"].toInt());
  st.train = d["train"].toBool();
  if (d.count("mask") != 0) st.mask = d["mask"].toTensor();
  st.cos = d["cos"].toTensor();
  st.sin = d["sin"].toTensor();
  if (d.count("routing") != 0) st.routing = d["routing"].toTensor();
  if (d.count("valid") != 0) st.valid = d["valid"].toTensor();
  // The trace outlives the step's backward (its owner passed it with the forward).
  if (d.count("trace") != 0) st.trace = reinterpret_cast<RoutingTrace*>(d["trace"].toInt());
  if (d.count("cu_q") == 0) return st;
  st.varlen.cu_q = d["cu_q"].toTensor();
  st.varlen.cu_k = d["cu_k"].toTensor();
  if (d.count("kv_index") != 0) st.varlen.kv_index = d["kv_index"].toTensor();
  st.varlen.q_lens = d["q_lens"].toIntVector();
  st.varlen.k_lens = d["k_lens"].toIntVector();
  st.varlen.max_q = d["max_q"].toInt();
  st.varlen.max_k = d["max_k"].toInt();
  return st;
}

// One transformer block as an autograd function of (its unit's shard, its input).
// Forward gathers the block's weights, runs it and frees them; backward gathers
// again, differentiates the block (recomputing it when checkpointing), and
// reduce-scatters the gradient into the shard's (returned on one rank; queued on
// several: reduce_gradients). `shard` is the block's trained shard (its
// adapters' with LoRA).
struct BlockFunction : torch::autograd::Function<BlockFunction> {
  static Variable forward(AutogradContext* ctx, ShardedTransformer* self, int64_t layer, const ForwardState* st,
                          Variable shard, Variable h) {
    self->gather_block(layer);
    if (self->options().prefetch && layer + 1 < self->config().num_layers) self->start_gather_block(layer + 1);
    ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
    ctx->saved_data["layer"] = layer;
    save_state(ctx, *st);
    Variable out;
    if (self->options().activation_checkpointing) {
      out = self->module().layer(layer, h, *st);
      ctx->saved_data["input"] = h;
    } else {
      c10::AutoGradMode grad(true);
      auto leaf = h.detach().requires_grad_(true);
      auto inner = self->module().layer(layer, leaf, *st);
      ctx->saved_data["input"] = leaf;
      ctx->saved_data["output"] = inner;
      out = inner.detach();
    }
    self->release_block(layer);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto* self = reinterpret_cast<ShardedTransformer*>(ctx->saved_data["self"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    self->gather_block(layer);
    if (self->options().prefetch && layer > 0) self->start_gather_block(layer - 1);
    Variable input, output;
    {
      c10::AutoGradMode grad(true);
      if (self->options().activation_checkpointing) {
        const ForwardState st = load_state(ctx);
        input = ctx->saved_data["input"].toTensor().detach().requires_grad_(true);
        output = self->module().layer(layer, input, st);
      } else {
        input = ctx->saved_data["input"].toTensor();
        output = ctx->saved_data["output"].toTensor();
      }
    }
    const size_t tu = self->trained_unit_of_block(layer);
    variable_list inputs{input};
    auto params = self->unit_parameters(tu);
    inputs.insert(inputs.end(), params.begin(), params.end());
    auto grads = torch::autograd::grad({output}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    ctx->saved_data.clear();
    std::vector<at::Tensor> param_grads(grads.begin() + 1, grads.end());
    self->release_block(layer);
    auto shard_grad = self->reduce_gradients(tu, param_grads);
    return {Variable(), Variable(), Variable(), shard_grad, grads[0]};
  }
};

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// A shard's gradient += g (the first one taken as it is).
void accumulate_grad(at::Tensor shard, const at::Tensor& g) {
  auto& grad = shard.mutable_grad();
  if (grad.defined())
    grad.add_(g);
  else
    grad = g;
}

}  // namespace

ShardedTransformer::ShardedTransformer(const ModelConfig& cfg, Communicator& comm, FsdpOptions options)
    : cfg_(cfg), comm_(comm), opt_(options) {
  RLX_CHECK(opt_.compute_dtype == at::kFloat || opt_.compute_dtype == at::kBFloat16 || opt_.compute_dtype == at::kHalf,
            "fsdp: compute dtype must be float32, bfloat16 or float16");
  RLX_CHECK(opt_.reduce_dtype == at::kFloat || opt_.reduce_dtype == at::kBFloat16,
            "fsdp: gradient reduce dtype must be float32 or bfloat16");
  RLX_CHECK(!(opt_.frozen && opt_.lora.enabled()), "fsdp: a frozen model has no adapters to train");
  model_ = std::make_shared<Transformer>(cfg_, opt_.compute_dtype, opt_.device);
  const bool lora = opt_.lora.enabled();
  if (lora) model_->add_lora(opt_.lora, LoraMode::unmerged);
  const int64_t world = comm_.size();
  const auto layers = static_cast<size_t>(cfg_.num_layers);

  units_.resize(1 + layers * (lora ? 2 : 1));
  params_.resize(units_.size());
  units_[0].name = "root";
  for (size_t l = 0; l < layers; ++l) {
    units_[1 + l].name = fmt::format("layers.{}", l);
    if (lora) units_[1 + layers + l].name = fmt::format("layers.{}.lora", l);
  }
  for (auto& u : units_) u.trained = !opt_.frozen && (!lora || u.name.ends_with(".lora"));
  auto named = model_->hf_parameters();
  for (auto& a : model_->lora_parameters()) named.push_back(a);
  // A unit's matrices and norms first, its biases after, each in the module's order: a
  // block's q, k and v weights (and gate and up's) then lie back to back, one GEMM's operand
  // without a copy (fused::join_rows), as do their biases. Checkpoints record the order.
  std::stable_partition(named.begin(), named.end(), [](const auto& np) { return !np.first.ends_with(".bias"); });
  for (auto& [name, p] : named) {
    size_t u = 0;
    if (name.rfind(kLayerPrefix, 0) == 0)
      u = 1 + std::stoul(name.substr(std::strlen(kLayerPrefix))) + (is_lora_parameter(name) ? layers : 0);
    RLX_ASSERT(u < units_.size(), "parameter {} outside the model's layers", name);
    auto& unit = units_[u];
    if (!unit.trained) p.requires_grad_(false);
    FlatSlot slot;
    slot.name = name;
    slot.shape = p.sizes().vec();
    slot.offset = unit.numel;
    slot.numel = p.numel();
    slot.decay = p.dim() >= 2;
    unit.numel += slot.numel;
    unit.slots.push_back(slot);
    params_[u].push_back(p);
  }
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(opt_.device);
  c10::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    auto& unit = units_[u];
    unit.padded = round_up(unit.numel, world);
    unit.shard_numel = unit.padded / world;
    // A trained shard is an fp32 master; a frozen one is kept in the compute dtype.
    unit.shard = at::zeros({unit.shard_numel}, unit.trained ? fp32 : fp32.dtype(opt_.compute_dtype));
    if (unit.trained) {
      unit.shard.requires_grad_(true);
      auto mask = at::zeros({unit.padded}, fp32);
      for (const auto& s : unit.slots)
        if (s.decay) mask.narrow(0, s.offset, s.numel).fill_(1.0);
      unit.decay_mask = mask.narrow(0, comm_.rank() * unit.shard_numel, unit.shard_numel).clone();
    }
    // The module's parameters become views into the unit's flat buffer, whose storage
    // is freed and reallocated as the unit is released and gathered. One rank whose shard
    // is in the compute dtype has nothing to gather: the buffer is the shard itself,
    // always there (trained in place when trained).
    unit.in_place = world == 1 && unit.shard.scalar_type() == opt_.compute_dtype;
    unit.full = unit.in_place ? unit.shard.detach()
                              : at::empty({unit.padded}, at::TensorOptions().dtype(opt_.compute_dtype).device(opt_.device));
    for (size_t i = 0; i < unit.slots.size(); ++i) {
      const auto& s = unit.slots[i];
      auto& p = params_[u][i];
      p.set_(unit.full.storage(), s.offset, s.shape, c10::contiguous_strides(s.shape));
    }
    if (unit.in_place)
      unit.gathered = true;
    else
      free_storage(unit);  // one rank in a lower precision allocates it once, at the first gather
  }
}

std::vector<ShardedUnit*> ShardedTransformer::trained_units() {
  std::vector<ShardedUnit*> out;
  for (auto& u : units_)
    if (u.trained) out.push_back(&u);
  return out;
}

size_t ShardedTransformer::trained_unit_of_block(int64_t l) const {
  const auto u = 1 + static_cast<size_t>(l) + (opt_.lora.enabled() ? static_cast<size_t>(cfg_.num_layers) : 0);
  return units_[u].trained ? u : std::string::npos;
}

void ShardedTransformer::gather_block(int64_t l) {
  gather(1 + static_cast<size_t>(l));
  if (opt_.lora.enabled()) gather(1 + static_cast<size_t>(cfg_.num_layers + l));
}

void ShardedTransformer::start_gather_block(int64_t l) {
  start_gather(1 + static_cast<size_t>(l));
  if (opt_.lora.enabled()) start_gather(1 + static_cast<size_t>(cfg_.num_layers + l));
}

void ShardedTransformer::release_block(int64_t l) {
  release(1 + static_cast<size_t>(l));
  if (opt_.lora.enabled()) release(1 + static_cast<size_t>(cfg_.num_layers + l));
}

ShardedTransformer::~ShardedTransformer() {
  for (auto& u : units_) {
    if (u.pending) {
      try {
        u.pending->wait();
      } catch (...) {
        // The group is already broken; the error was reported where it happened.
      }
    }
  }
}

void ShardedTransformer::free_storage(ShardedUnit& u) {
  auto* impl = u.full.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, u.full.device()));
  impl->set_nbytes(0);
  u.gathered = false;
}

void ShardedTransformer::allocate_storage(ShardedUnit& u) {
  auto* impl = u.full.storage().unsafeGetStorageImpl();
  if (impl->nbytes() != 0) return;
  const size_t bytes = static_cast<size_t>(u.padded) * u.full.element_size();
  impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
  impl->set_nbytes(bytes);
}

bool ShardedTransformer::in_place() const {
  return std::all_of(units_.begin(), units_.end(), [](const ShardedUnit& u) { return u.in_place; });
}

void ShardedTransformer::start_gather(size_t index) {
  auto& u = units_[index];
  if (u.gathered || u.pending) return;
  allocate_storage(u);
  if (comm_.size() == 1) {
    // One rank in a lower precision: the cast stays allocated and is made again only after
    // the shard changed (an optimizer step, a load), not per gather.
    if (u.cast_version != static_cast<int64_t>(u.shard._version())) {
      c10::NoGradGuard no_grad;
      u.full.copy_(u.shard.detach());
      u.cast_version = static_cast<int64_t>(u.shard._version());
    }
    u.gathered = true;
    return;
  }
  u.send = u.shard.detach().to(opt_.compute_dtype).contiguous();
  if (u.send.is_same(u.shard)) u.send = u.send.clone();
  u.pending = comm_.all_gather(u.full, u.send, fmt::format("{} weights", u.name));
}

void ShardedTransformer::gather(size_t index) {
  auto& u = units_[index];
  if (u.gathered) return;
  start_gather(index);
  if (u.gathered) return;  // one rank: nothing in flight
  auto work = std::move(u.pending);
  work->wait();
  u.send = at::Tensor();
  u.gathered = true;
}

void ShardedTransformer::release(size_t index) {
  if (comm_.size() == 1) {  // nothing was gathered: the parameters stay (in place, or the kept cast)
    units_[index].gathered = units_[index].in_place;
    return;
  }
  auto& u = units_[index];
  if (u.pending) {
    auto work = std::move(u.pending);
    work->wait();
    u.send = at::Tensor();
  }
  free_storage(u);
}

void ShardedTransformer::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) release(u);
}

void ShardedTransformer::abandon() {
  reducing_.clear();
  for (auto& u : units_) {
    u.pending.reset();
    u.send = at::Tensor();
    if (comm_.size() == 1) u.gathered = u.in_place;
    else free_storage(u);
  }
  // A backward cut short leaves the root's gradients accumulated in its parameters (they are
  // reduce-scattered only by finish_backward): the next step must not add to them.
  for (auto& unit : params_)
    for (auto& p : unit) p.mutable_grad() = at::Tensor();
}

std::vector<at::Tensor> ShardedTransformer::unit_parameters(size_t unit) { return params_[unit]; }

at::Tensor ShardedTransformer::reduce_gradients(size_t index, const std::vector<at::Tensor>& grads) {
  auto& u = units_[index];
  RLX_ASSERT(grads.size() == u.slots.size(), "one gradient per parameter");
  // One rank: the flat gradient is the shard's (fp32, every element written), no collective.
  const bool one = comm_.size() == 1;
  const auto o = at::TensorOptions().dtype(one ? at::kFloat : opt_.reduce_dtype).device(opt_.device);
  auto flat = one ? at::empty({u.padded}, o) : at::zeros({u.padded}, o);
  for (size_t i = 0; i < grads.size(); ++i) {
    auto part = flat.narrow(0, u.slots[i].offset, u.slots[i].numel);
    if (grads[i].defined())
      part.copy_(grads[i].reshape({-1}));
    else if (one)
      part.zero_();
  }
  if (one) {
    if (u.padded > u.numel) flat.narrow(0, u.numel, u.padded - u.numel).zero_();
    return flat;
  }
  auto shard = at::empty({u.shard_numel}, flat.options());
  auto work = comm_.reduce_scatter(shard, flat, fmt::format("{} gradients", u.name));
  reducing_.push_back({.unit = index, .work = std::move(work), .flat = flat, .shard = shard});
  while (reducing_.size() > kReducesInFlight) complete_reduce();
  return {};
}

void ShardedTransformer::complete_reduce() {
  auto r = std::move(reducing_.front());
  reducing_.pop_front();
  r.work->wait();
  accumulate_grad(units_[r.unit].shard, r.shard.to(at::kFloat));
}

void ShardedTransformer::wait_reduces() {
  while (!reducing_.empty()) complete_reduce();
}

at::Tensor ShardedTransformer::forward_hidden(const ForwardInput& in) {
  gather(0);
  auto st = model_->begin_forward(in);
  const int64_t layers = cfg_.num_layers;
  if (opt_.prefetch && layers > 0) start_gather_block(0);
  auto h = model_->embed(st);
  // A frozen model (or a forward without gradients) runs its blocks directly.
  const bool grad = c10::GradMode::is_enabled() && !opt_.frozen;
  for (int64_t l = 0; l < layers; ++l) {
    if (grad) {
      h = BlockFunction::apply(this, l, &st, units_[trained_unit_of_block(l)].shard, h);
    } else {
      gather_block(l);
      if (opt_.prefetch && l + 1 < layers) start_gather_block(l + 1);
      h = model_->layer(l, h, st);
      release_block(l);
    }
  }
  return model_->end_forward(h, st);
}

const at::Tensor& ShardedTransformer::lm_head_weight() {
  gather(0);
  return model_->lm_head_weight();
}

at::Tensor ShardedTransformer::logits(const at::Tensor& hidden) {
  gather(0);
  return model_->logits(hidden);
}

void ShardedTransformer::finish_backward() {
  auto& root = units_[0];
  if (!root.trained) {  // frozen (LoRA): its parameters have no gradient
    wait_reduces();
    release(0);
    return;
  }
  std::vector<at::Tensor> grads;
  bool any = false;
  for (auto& p : params_[0]) {
    grads.push_back(p.grad());
    any = any || p.grad().defined();
  }
  if (any) {
    auto g = reduce_gradients(0, grads);
    if (g.defined()) accumulate_grad(root.shard, g);  // one rank; with several it is queued below
    for (auto& p : params_[0]) p.mutable_grad() = at::Tensor();
  }
  wait_reduces();
  release(0);
}

void ShardedTransformer::load_from(const Transformer& full) {
  RLX_CHECK(full.config().num_layers == cfg_.num_layers && full.config().hidden_size == cfg_.hidden_size &&
                full.config().vocab_size == cfg_.vocab_size,
            "fsdp: the model to shard has a different shape");
  load_units(0, 1 + static_cast<size_t>(cfg_.num_layers), full.hf_parameters(), "parameter");
}

void ShardedTransformer::load_units(size_t first, size_t end, const std::vector<std::pair<std::string, at::Tensor>>& named,
                                    const char* what) {
  std::map<std::string, at::Tensor> by_name(named.begin(), named.end());
  c10::NoGradGuard no_grad;
  for (size_t i = first; i < end; ++i) {
    auto& u = units_[i];
    auto flat = at::zeros({u.padded}, at::TensorOptions().dtype(at::kFloat));
    for (const auto& s : u.slots) {
      auto it = by_name.find(s.name);
      RLX_CHECK(it != by_name.end(), "fsdp: no {} {} given", what, s.name);
      RLX_CHECK(it->second.sizes().vec() == s.shape, "fsdp: {} {} has shape [{}], expected [{}]", what, s.name,
                fmt::join(it->second.sizes().vec(), ", "), fmt::join(s.shape, ", "));
      flat.narrow(0, s.offset, s.numel).copy_(it->second.reshape({-1}));
    }
    u.shard.copy_(flat.narrow(0, comm_.rank() * u.shard_numel, u.shard_numel));
  }
}

void ShardedTransformer::init_weights(uint64_t seed) {
  Transformer full(cfg_, at::kFloat, at::kCPU);
  full.init_weights(seed);
  load_from(full);
}

void ShardedTransformer::init_lora(uint64_t seed) {
  RLX_CHECK(opt_.lora.enabled(), "fsdp: init_lora without adapters");
  std::vector<std::pair<std::string, at::Tensor>> adapters;
  for (size_t u = 1 + static_cast<size_t>(cfg_.num_layers); u < units_.size(); ++u)
    for (const auto& s : units_[u].slots) adapters.emplace_back(s.name, at::empty(s.shape, at::kFloat));
  init_lora_weights(adapters, seed);
  load_lora(adapters);
}

void ShardedTransformer::load_lora(const std::vector<std::pair<std::string, at::Tensor>>& adapters) {
  RLX_CHECK(opt_.lora.enabled(), "fsdp: load_lora without adapters");
  load_units(1 + static_cast<size_t>(cfg_.num_layers), units_.size(), adapters, "adapter");
}

std::vector<std::pair<std::string, at::Tensor>> ShardedTransformer::gather_units(size_t first, size_t end,
                                                                                 at::ScalarType dtype) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = first; i < end; ++i) {
    auto& u = units_[i];
    auto full = at::empty({u.padded}, u.shard.options().requires_grad(false));
    comm_.all_gather(full, u.shard.detach(), fmt::format("{} master weights", u.name))->wait();
    for (const auto& s : u.slots)
      out.emplace_back(s.name, full.narrow(0, s.offset, s.numel).view(s.shape).to(dtype, false, /*copy=*/true));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedTransformer::gather_parameters() {
  const auto base_end = 1 + static_cast<size_t>(cfg_.num_layers);
  auto out = gather_units(0, base_end);
  if (!opt_.lora.enabled()) return out;
  // Each target's weight with its adapter merged in: W + scale * B A.
  std::map<std::string, at::Tensor> adapters;
  for (auto& [name, t] : gather_units(base_end, units_.size())) adapters.emplace(name, t);
  const double scale = opt_.lora.scale();
  for (auto& [name, w] : out) {
    constexpr std::string_view suffix = ".weight";
    if (!name.ends_with(suffix)) continue;
    const auto stem = name.substr(0, name.size() - suffix.size());
    auto a = adapters.find(stem + ".lora_A.weight");
    if (a == adapters.end()) continue;
    w.add_(at::matmul(adapters.at(stem + ".lora_B.weight"), a->second), scale);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedTransformer::gather_lora_parameters() {
  if (!opt_.lora.enabled()) return {};
  return gather_units(1 + static_cast<size_t>(cfg_.num_layers), units_.size());
}

std::vector<std::pair<std::string, at::Tensor>> ShardedTransformer::sync_parameters(at::ScalarType dtype) {
  const auto base_end = 1 + static_cast<size_t>(cfg_.num_layers);  // with LoRA the adapters, else the base units
  return opt_.lora.enabled() ? gather_units(base_end, units_.size(), dtype) : gather_units(0, base_end, dtype);
}

int64_t ShardedTransformer::local_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.shard_numel;
  return n;
}

int64_t ShardedTransformer::total_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.numel;
  return n;
}

}  // namespace rlx::dist
