#include "rlx/rollout/engine.hpp"

#include <c10/core/GradMode.h>
#include <algorithm>
#include <limits>
#include <map>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/core/rng.hpp"
#include "rollout/engine_state.hpp"

namespace rlx {

std::string_view to_string(FinishReason r) {
  for (const auto& [v, name] : enum_names(r))
    if (v == r) return name;
  return "?";
}

std::pair<int64_t, int64_t> GenerationResult::version_range() const {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = -1;
  for (const auto& s : samples)
    for (int64_t v : s.versions) lo = std::min(lo, v), hi = std::max(hi, v);
  return hi < 0 ? std::pair<int64_t, int64_t>{-1, -1} : std::pair{lo, hi};
}

namespace {
int64_t blocks_for(const ModelConfig& mc, const EngineConfig& c, at::ScalarType dtype) {
  if (c.kv_cache_blocks > 0) return c.kv_cache_blocks;
  const int64_t n = static_cast<int64_t>(c.kv_cache_mb * 1024 * 1024) / PagedKVCache::block_bytes(mc, c.block_size, dtype);
  RLX_CHECK(n >= 1, "engine: kv_cache_mb = {} holds no block of {} tokens ({} bytes each)", c.kv_cache_mb, c.block_size,
            PagedKVCache::block_bytes(mc, c.block_size, dtype));
  RLX_CHECK(n <= std::numeric_limits<int32_t>::max(), "engine: kv_cache_mb = {} is too many blocks", c.kv_cache_mb);
  return n;
}
uint64_t prefix_root(int64_t version) { return hash_name("rlx.prefix", static_cast<uint64_t>(version)); }
// Mixture-of-experts models that record routing: a row per KV slot; otherwise none.
BlockRouting block_routing(const ModelConfig& mc, const EngineConfig& c, const BlockAllocator& blocks) {
  if (!c.record_routing || mc.num_experts == 0) return {};
  return BlockRouting(blocks.num_blocks(), c.block_size, static_cast<int32_t>(mc.sparse_layers().size()),
                      static_cast<int32_t>(mc.num_experts_per_tok));
}
}  // namespace

Engine::Engine(std::shared_ptr<Transformer> model, EngineConfig cfg, std::shared_ptr<const Tokenizer> tokenizer,
               int64_t weight_version)
    : model_(std::move(model)),
      cfg_((config::check_bounds(cfg, "engine config"), cfg)),
      tokenizer_(std::move(tokenizer)),
      max_model_len_(cfg_.max_model_len > 0 ? cfg_.max_model_len : model_->config().max_position_embeddings),
      blocks_(static_cast<int32_t>(blocks_for(model_->config(), cfg_, model_->dtype())), cfg_.block_size),
      cache_(model_->config(), blocks_.num_blocks(), cfg_.block_size, model_->dtype(), model_->device()),
      routing_(block_routing(model_->config(), cfg_, blocks_)),
      version_(weight_version),
      prefix_root_(prefix_root(weight_version)),
      latest_version_(weight_version) {
  model_->fuse_projections();  // one GEMM for q/k/v and one for gate/up; weight updates copy into them
#if RLX_WITH_CUDA
  const auto& mc = model_->config();
  if (cfg_.cuda_graphs && model_->device().is_cuda() && (mc.head_dim == 64 || mc.head_dim == 128)) {
    // One block never handed out: padded rows of a graph's batch write and read it.
    const auto pad = blocks_.allocate();
    RLX_CHECK(pad.has_value(), "engine: no KV block left to reserve for CUDA graph padding");
    const int64_t max_seqs = std::min<int64_t>(256, cuda::DecodeGraphs::batch_bucket(cfg_.max_running));
    cache_.enable_static(max_seqs, (max_model_len_ + cfg_.block_size - 1) / cfg_.block_size, *pad);
    graphs_ = std::make_unique<cuda::DecodeGraphs>(*model_, cache_, max_seqs, routing_.per_token());
    graph_seqs_ = max_seqs;
  }
#endif
}

Engine::~Engine() {
  try {
    while (!inflight_.empty()) land_decode();  // the device finishes what it was given
  } catch (...) {
  }
}

// --- requests -------------------------------------------------------------------------

void Engine::add(GenerationRequest r) {
  RLX_CHECK(!r.id.empty() && r.id.size() <= 256, "request id must be 1 to 256 bytes, got {} bytes", r.id.size());
  const std::string who = fmt::format("request '{}'", r.id);
  RLX_CHECK(!r.prompt.empty(), "{}: prompt is empty", who);
  const int64_t vocab = model_->config().vocab_size;
  for (size_t i = 0; i < r.prompt.size(); ++i)
    RLX_CHECK(r.prompt[i] >= 0 && r.prompt[i] < vocab, "{}: prompt[{}] = {} is outside the vocabulary [0, {})", who, i,
              r.prompt[i], vocab);
  const int64_t len = static_cast<int64_t>(r.prompt.size());
  RLX_CHECK(len < max_model_len_, "{}: prompt has {} tokens; the context (max_model_len) is {}, leaving no room to generate",
            who, len, max_model_len_);
  r.params.validate(who, vocab, tokenizer_ != nullptr);
  const int64_t longest = std::min(len + r.params.max_new_tokens, max_model_len_);
  const int64_t need = (longest + cfg_.block_size - 1) / cfg_.block_size;
  RLX_CHECK(need <= blocks_.num_blocks(), "{}: up to {} tokens need {} KV blocks; the cache has {} (raise kv_cache_mb)",
            who, longest, need, blocks_.num_blocks());
  std::lock_guard lock(inbox_mu_);
  RLX_CHECK(!live_ids_.contains(r.id), "{}: duplicate request id (a request with this id is in flight)", who);
  RLX_CHECK(static_cast<int64_t>(live_ids_.size()) < cfg_.max_queued, "{}: {} requests are in flight (max_queued)", who,
            live_ids_.size());
  live_ids_.insert(r.id);
  inbox_.push_back(std::move(r));
}

bool Engine::abort(const std::string& id) {
  std::lock_guard lock(inbox_mu_);
  if (!live_ids_.contains(id)) return false;
  abort_inbox_.push_back(id);
  return true;
}

bool Engine::has_work() const {
  std::lock_guard lock(inbox_mu_);
  return !live_ids_.empty();
}

void Engine::pause() {
  std::lock_guard lock(inbox_mu_);
  paused_ = true;
}
void Engine::resume() {
  std::lock_guard lock(inbox_mu_);
  paused_ = false;
}
bool Engine::paused() const {
  std::lock_guard lock(inbox_mu_);
  return paused_;
}

int64_t Engine::weight_version() const {
  std::lock_guard lock(inbox_mu_);
  return version_;
}

void Engine::check_weights(const std::string& who,
                           const std::vector<std::pair<std::string, at::Tensor>>& tensors) const {
  std::map<std::string, at::Tensor> params;
  for (auto& [name, p] : model_->sync_parameters()) params.emplace(name, p);  // with LoRA: the adapters
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    auto it = params.find(name);
    RLX_CHECK(it != params.end(), "{}: '{}' is not a parameter of the model", who, name);
    RLX_CHECK(seen.emplace(name, i).second, "{}: '{}' is given twice", who, name);
    RLX_CHECK(t.defined() && t.sizes() == it->second.sizes(), "{}: '{}' has shape {}, the model's is {}", who, name,
              t.defined() ? t.sizes() : c10::IntArrayRef{}, it->second.sizes());
    RLX_CHECK(t.is_floating_point(), "{}: '{}' is {}, not a floating-point tensor", who, name, c10::toString(t.scalar_type()));
  }
  for (const auto& [name, p] : params) RLX_CHECK(seen.contains(name), "{}: '{}' is missing; a full set is required", who, name);
}

void Engine::update_weights(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            std::optional<UpdatePolicy> policy) {
  const std::string who = fmt::format("update_weights(version {})", version);
  {
    std::lock_guard lock(inbox_mu_);
    RLX_CHECK(version > latest_version_, "{}: versions must increase; the latest is {}", who, latest_version_);
  }
  check_weights(who, tensors);
  PendingUpdate u{version, {}, policy.value_or(cfg_.update_policy)};
  u.tensors.reserve(tensors.size());
  for (const auto& [name, t] : tensors)
    u.tensors.emplace_back(name, t.detach().to(model_->device(), model_->dtype(), /*non_blocking=*/false, /*copy=*/true));
  std::lock_guard lock(inbox_mu_);
  RLX_CHECK(version > latest_version_, "{}: versions must increase; the latest is {}", who, latest_version_);
  latest_version_ = version;
  update_inbox_ = std::move(u);  // a newer version staged before the older was applied replaces it
}

int64_t Engine::load_weights(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const std::string who = fmt::format("load_weights(version {})", version);
  {
    std::lock_guard lock(inbox_mu_);
    RLX_CHECK(version > latest_version_, "{}: versions must increase; the latest is {}", who, latest_version_);
    RLX_CHECK(live_ids_.empty(), "{}: {} requests are in flight (load_weights needs an idle engine; update_weights "
              "stages weights for a busy one)", who, live_ids_.size());
  }
  check_weights(who, tensors);
  while (!inflight_.empty()) land_decode();  // a last chained step of rows that had all stopped
  const int64_t bytes = install_weights(version, tensors);
  std::lock_guard lock(inbox_mu_);
  update_inbox_.reset();  // older than this one
  update_.reset();
  latest_version_ = version;
  return bytes;
}

void Engine::sleep() {
  if (asleep_) return;
  RLX_CHECK(!has_work(), "engine: sleep() with requests in flight");
  while (!inflight_.empty()) land_decode();
  RLX_ASSERT(running_.empty() && waiting_.empty(), "engine: idle, yet sequences hold blocks");
  blocks_.clear_cache();  // the cached prefixes' keys and values go with the pool
  compat::synchronize(model_->device());  // nothing queued on any stream still reads the pool
  graphs_.reset();
  cache_.release();
  asleep_ = true;
}

void Engine::wake() {
  if (!asleep_) return;
  cache_.restore();
#if RLX_WITH_CUDA
  if (graph_seqs_ > 0) graphs_ = std::make_unique<cuda::DecodeGraphs>(*model_, cache_, graph_seqs_, routing_.per_token());
#endif
  asleep_ = false;
}

int64_t Engine::kv_pool_bytes() const {
  return static_cast<int64_t>(blocks_.num_blocks()) *
         PagedKVCache::block_bytes(model_->config(), cfg_.block_size, model_->dtype());
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.free_blocks = blocks_.num_free();
  s.total_blocks = blocks_.num_blocks();
  std::lock_guard lock(inbox_mu_);
  s.queued = static_cast<int64_t>(live_ids_.size());
  s.weight_version = version_;
  return s;
}

// --- stepping --------------------------------------------------------------------------

std::vector<GenerationResult> Engine::step() {
  RLX_CHECK(!asleep_, "engine: step() while asleep (its KV pool is released; wake() first)");
  std::vector<GenerationResult> finished = std::move(unclaimed_);
  unclaimed_.clear();
  take_inbox(finished);
  bool paused;
  {
    std::lock_guard lock(inbox_mu_);
    paused = paused_;
  }
  // While paused nothing runs; a decode step in flight keeps its tokens until resume.
  if (!paused && !inflight_.empty() && try_chain()) {
    // Overlap: the same rows' next decode step goes to the device before this one's tokens
    // are read back.
    launch_decode(/*chained=*/true);
    land_decode();
    ++stats_.steps;
  } else if (!paused) {
    while (!inflight_.empty()) land_decode();  // the chain ends: this step schedules afresh
    maybe_apply_update();
    schedule();
    if (plain_decode()) {
      launch_decode(/*chained=*/false);
      if (!cfg_.overlap) land_decode();
    } else if (!plan_.empty()) {
      forward_and_sample();
    }
    ++stats_.steps;
  }
  collect(finished);
  return finished;
}

std::vector<GenerationResult> Engine::run() {
  std::vector<GenerationResult> out;
  while (has_work() && !paused())
    for (auto& r : step()) out.push_back(std::move(r));
  return out;
}

std::vector<GenerationResult> Engine::generate(std::vector<GenerationRequest> requests,
                                               const std::atomic<bool>* cancel) {
  std::vector<std::string> ids;
  for (const auto& r : requests) ids.push_back(r.id);
  for (auto& r : requests) add(std::move(r));
  std::unordered_map<std::string, GenerationResult> done;
  std::vector<GenerationResult> others;
  bool cancelled = false;
  while (done.size() < ids.size()) {
    if (cancel && !cancelled && cancel->load()) {
      cancelled = true;
      for (const auto& id : ids)
        if (!done.contains(id)) abort(id);
    }
    RLX_CHECK(!paused(), "generate: the engine is paused with {} requests unfinished", ids.size() - done.size());
    for (auto& r : step()) {
      if (std::find(ids.begin(), ids.end(), r.id) != ids.end()) done.emplace(r.id, std::move(r));
      else others.push_back(std::move(r));
    }
  }
  // Requests other callers added are handed out by the next step().
  for (auto& r : others) unclaimed_.push_back(std::move(r));
  std::vector<GenerationResult> out;
  for (const auto& id : ids) out.push_back(std::move(done.at(id)));
  return out;
}

void Engine::take_inbox(std::vector<GenerationResult>& finished) {
  std::vector<GenerationRequest> incoming;
  std::vector<std::string> aborts;
  {
    std::lock_guard lock(inbox_mu_);
    incoming.swap(inbox_);
    aborts.swap(abort_inbox_);
    if (update_inbox_) {
      update_ = std::move(update_inbox_);
      update_inbox_.reset();
    }
  }
  for (auto& r : incoming) {
    auto state = std::make_unique<RequestState>();
    state->remaining = r.params.n;
    state->prompt_routing.assign(r.prompt.size() * static_cast<size_t>(routing_.per_token()), -1);
    if (r.params.prompt_logprobs >= 0) {
      state->prompt_logprobs.assign(r.prompt.size() - 1, 0.0f);
      if (r.params.prompt_logprobs > 0) state->prompt_top.resize(r.prompt.size() - 1);
    }
    for (int64_t i = 0; i < r.params.n; ++i) {
      auto s = std::make_unique<Seq>();
      s->req = state.get();
      s->sample = i;
      s->tokens = r.prompt;
      state->seqs.push_back(std::move(s));
    }
    Seq* leader = state->seqs.front().get();
    for (size_t i = 1; i < state->seqs.size(); ++i) leader->followers.push_back(state->seqs[i].get());
    waiting_.push_back(leader);
    state->req = std::move(r);
    requests_.emplace(state->req.id, std::move(state));
  }
  // An abort ends a request with every token computed so far: a decode step in flight lands first.
  if (!aborts.empty())
    while (!inflight_.empty()) land_decode();
  for (const auto& id : aborts) {
    auto it = requests_.find(id);
    if (it != requests_.end()) abort_request(*it->second);
  }
}

bool Engine::in_flight(const Seq& s) const { return s.running || s.generated() > 0; }

bool Engine::maybe_apply_update() {
  if (!update_) return false;
  switch (update_->policy) {
    case UpdatePolicy::finish_old:
      if (!running_.empty()) return false;
      for (const Seq* s : waiting_)
        if (in_flight(*s)) return false;
      break;
    case UpdatePolicy::abort:
      for (auto& [id, r] : requests_) {
        bool started = false;
        for (const auto& s : r->seqs) started |= !s->done && in_flight(*s);
        if (started) abort_request(*r);
      }
      break;
    case UpdatePolicy::continue_:
      // Their cached keys/values come from the old weights: recompute them with the new.
      while (!running_.empty()) preempt(*running_.back());
      break;
  }
  install_weights(update_->version, update_->tensors);
  update_.reset();
  return true;
}

int64_t Engine::install_weights(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  int64_t bytes = 0;
  {
    c10::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> params;
    for (auto& [name, p] : model_->sync_parameters()) params.emplace(name, p);
    for (const auto& [name, t] : tensors) {
      auto& p = params.at(name);
      p.copy_(t);
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
    // Merged adapters: the served weights become base + scale * B A.
    if (model_->lora_merged()) bytes += model_->merge_lora();
  }
  blocks_.clear_cache();  // cached prefixes hold the old weights' keys and values
  prefix_root_ = prefix_root(version);
  std::lock_guard lock(inbox_mu_);
  version_ = version;
  return bytes;
}

void Engine::release_blocks(Seq& s) {
  for (BlockId b : s.blocks) blocks_.release(b);
  s.blocks.clear();
  s.hashes.clear();
  s.computed = 0;
}

void Engine::preempt(Seq& s) {
  release_blocks(s);
  s.running = false;
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  waiting_.push_front(&s);
  ++stats_.preemptions;
}

void Engine::match_prefix(Seq& s) {
  const int64_t bs = cfg_.block_size;
  // At least the last token is computed: its logits sample the next token.
  const int64_t usable = (static_cast<int64_t>(s.tokens.size()) - 1) / bs;
  uint64_t h = prefix_root_;
  for (int64_t j = 0; j < usable; ++j) {
    h = BlockAllocator::chain_hash(h, std::span<const TokenId>(s.tokens.data() + j * bs, static_cast<size_t>(bs)));
    auto b = blocks_.lookup(h);
    if (!b) break;
    s.blocks.push_back(*b);
    s.hashes.push_back(h);
    s.computed += bs;
  }
  stats_.prefix_hit_tokens += s.computed;
}

void Engine::publish_full_blocks(Seq& s, int64_t upto) {
  if (!cfg_.prefix_caching) return;
  const int64_t bs = cfg_.block_size, full = upto / bs;
  uint64_t h = s.hashes.empty() ? prefix_root_ : s.hashes.back();
  for (auto j = static_cast<int64_t>(s.hashes.size()); j < full; ++j) {
    h = BlockAllocator::chain_hash(h, std::span<const TokenId>(s.tokens.data() + j * bs, static_cast<size_t>(bs)));
    blocks_.publish(s.blocks[static_cast<size_t>(j)], h);
    s.hashes.push_back(h);
  }
}

Engine::Reservation Engine::reservation(const Seq& s, int64_t n) const {
  const int64_t bs = cfg_.block_size;
  const auto need = static_cast<size_t>((s.computed + n + bs - 1) / bs);
  Reservation r;
  r.add = std::max<int64_t>(0, static_cast<int64_t>(need) - static_cast<int64_t>(s.blocks.size()));
  r.first = static_cast<size_t>(s.computed / bs);  // the block the first write goes to
  r.cow = r.first < s.blocks.size() && blocks_.ref_count(s.blocks[r.first]) > 1;
  return r;
}

bool Engine::reserve(Seq& s, int64_t n) {
  const auto r = reservation(s, n);
  if (blocks_.num_free() < r.blocks()) return false;
  if (r.cow) {
    const BlockId copy = *blocks_.allocate();
    copies_.emplace_back(s.blocks[r.first], copy);
    routing_.copy(s.blocks[r.first], copy);
    blocks_.release(s.blocks[r.first]);
    s.blocks[r.first] = copy;
    ++stats_.cow_copies;
  }
  for (int64_t i = 0; i < r.add; ++i) s.blocks.push_back(*blocks_.allocate());
  return true;
}

void Engine::schedule() {
  plan_.clear();
  copies_.clear();
  int64_t budget = cfg_.max_batch_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Seq* s = running_[i];
    const int64_t n = std::min(static_cast<int64_t>(s->tokens.size()) - s->computed, budget);
    RLX_ASSERT(n > 0, "running sequence with nothing to compute");
    bool fits = true;
    while (!reserve(*s, n)) {
      // Out of blocks: the most recently admitted sequence gives its blocks back.
      Seq* victim = running_.back();
      preempt(*victim);
      if (victim == s) {
        fits = false;
        break;
      }
    }
    if (!fits) break;
    plan_.push_back({s, n});
    publish_full_blocks(*s, s->computed + n);
    budget -= n;
  }
  // New work only when the running batch has room. While old weights drain, only
  // sequences already in flight (preempted ones) start.
  const bool draining = update_ && update_->policy == UpdatePolicy::finish_old;
  while (budget > 0 && !waiting_.empty()) {
    Seq* s = waiting_.front();
    if (draining && !in_flight(*s)) break;
    const auto group = static_cast<int64_t>(1 + s->followers.size());
    if (!running_.empty() && static_cast<int64_t>(running_.size()) + group > cfg_.max_running) break;
    // A request for its prompt's log-probs computes the prompt whole.
    if (cfg_.prefix_caching && s->computed == 0 && s->req->req.params.prompt_logprobs < 0) match_prefix(*s);
    const int64_t n = std::min(static_cast<int64_t>(s->tokens.size()) - s->computed, budget);
    if (!reserve(*s, n)) {
      release_blocks(*s);
      break;
    }
    waiting_.pop_front();
    s->running = true;
    running_.push_back(s);
    plan_.push_back({s, n});
    publish_full_blocks(*s, s->computed + n);
    budget -= n;
  }
}

void Engine::forward_and_sample() {
  std::vector<PagedKVCache::Entry> entries;
  std::vector<int64_t> packed, last_rows;
  std::vector<Seq*> completing;  // sequences whose known tokens are all computed after this step
  std::vector<RoutedSpan> spans;
  for (const auto& [s, n] : plan_) {
    entries.push_back({s->blocks, s->computed, n});
    spans.push_back({s, s->computed, n});
    packed.insert(packed.end(), s->tokens.begin() + s->computed, s->tokens.begin() + s->computed + n);
    if (s->computed + n == static_cast<int64_t>(s->tokens.size())) {
      last_rows.push_back(static_cast<int64_t>(packed.size()) - 1);
      completing.push_back(s);
    }
    const bool decode = n == 1 && s->generated() > 0 && s->computed + 1 == static_cast<int64_t>(s->tokens.size());
    if (!decode) stats_.prefill_tokens += n;
  }
  const auto device = model_->device();
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  c10::NoGradGuard no_grad;
  cache_.copy_blocks(copies_);
  cache_.plan(entries);
  auto tokens = at::tensor(packed, long_opts).to(device).view({1, static_cast<int64_t>(packed.size())});
  RoutingTrace trace;
  const auto hidden = forgetting_on_error([&] {
    auto h = model_->forward_hidden({.tokens = tokens, .trace = routing_.enabled() ? &trace : nullptr}, &cache_);
    store_routing(trace, spans);
    return h;
  });
  stats_.forward_tokens += static_cast<int64_t>(packed.size());
  record_prompt_logprobs(hidden.select(0, 0));  // before `computed` moves: the chunks' positions
  for (const auto& [s, n] : plan_) s->computed += n;
  if (completing.empty()) return;

  // Followers fork here: they share every block of their leader's computed prompt and
  // sample their first token from the same logits row.
  std::vector<Seq*> samplers;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < completing.size(); ++i) {
    Seq* s = completing[i];
    samplers.push_back(s);
    rows.push_back(static_cast<int64_t>(i));
    for (Seq* f : s->followers) {
      f->blocks = s->blocks;
      for (BlockId b : f->blocks) blocks_.retain(b);
      f->hashes = s->hashes;
      f->computed = s->computed;
      f->running = true;
      running_.push_back(f);
      samplers.push_back(f);
      rows.push_back(static_cast<int64_t>(i));
      stats_.shared_prefill_tokens += s->computed;
    }
    s->followers.clear();
  }
  auto logits = model_->logits(hidden.select(0, 0).index_select(0, at::tensor(last_rows, long_opts).to(device)));
  if (samplers.size() != completing.size()) logits = logits.index_select(0, at::tensor(rows, long_opts).to(device));
  auto sampled = sample(logits, sampling_batch(samplers));
  const auto toks = sampled.tokens.to(at::kCPU).contiguous(), lps = sampled.logprobs.to(at::kCPU).contiguous();
  append_sampled(samplers, toks.data_ptr<int64_t>(), lps.data_ptr<float>(),
                 alternatives(logits, samplers, toks.data_ptr<int64_t>(), lps.data_ptr<float>()));
}

SamplingBatch Engine::sampling_batch(const std::vector<Seq*>& seqs, int64_t ahead) const {
  SamplingBatch batch;
  for (const Seq* s : seqs) {
    const auto& r = s->req->req;
    const std::string& key = r.sampling_key.empty() ? r.id : r.sampling_key;
    batch.add(r.params, sampling_uniform(r.seed, key, s->sample, static_cast<int64_t>(s->tokens.size()) + ahead));
  }
  return batch;
}

void Engine::append_sampled(const std::vector<Seq*>& seqs, const int64_t* tokens, const float* logprobs,
                            std::vector<std::vector<TokenLogprob>> top) {
  for (size_t i = 0; i < seqs.size(); ++i)
    append_token(*seqs[i], static_cast<TokenId>(tokens[i]), logprobs[i],
                 top.empty() ? std::vector<TokenLogprob>{} : std::move(top[i]));
  std::erase_if(running_, [](const Seq* s) { return s->done; });
}

void Engine::append_token(Seq& s, TokenId token, float logprob, std::vector<TokenLogprob> top) {
  const auto& params = s.req->req.params;
  s.tokens.push_back(token);
  s.out.tokens.push_back(token);
  s.out.logprobs.push_back(logprob);
  s.out.versions.push_back(version_);
  ++stats_.generated_tokens;
  if (s.req->req.on_token) s.req->req.on_token(s.sample, token, logprob, top);
  if (params.logprobs > 0) s.out.top_logprobs.push_back(std::move(top));
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) != params.stop_token_ids.end())
    return finish(s, FinishReason::stop);
  if (!params.ignore_eos) {
    const int64_t eos = tokenizer_ && tokenizer_->eos_id ? *tokenizer_->eos_id : model_->config().eos_token_id;
    if (eos >= 0 && token == eos) return finish(s, FinishReason::stop);
  }
  if (!params.stop_strings.empty()) {
    // A new occurrence ends inside the last token's bytes, so a window of as many tokens
    // as the longest stop string has bytes covers it (every token has at least one byte).
    size_t longest = 0;
    for (const auto& stop : params.stop_strings) longest = std::max(longest, stop.size());
    const size_t w = std::min(s.out.tokens.size(), longest + 1);
    std::vector<TokenId> window;
    for (size_t i = s.out.tokens.size() - w; i < s.out.tokens.size(); ++i)
      if (s.out.tokens[i] < tokenizer_->vocab_size()) window.push_back(s.out.tokens[i]);  // padded vocab rows decode to nothing
    const std::string text = tokenizer_->decode(window);
    const size_t before = window.empty() || window.back() != token
                              ? text.size()
                              : tokenizer_->decode(std::span<const TokenId>(window).first(window.size() - 1)).size();
    for (const auto& stop : params.stop_strings) {
      const size_t from = before >= stop.size() ? before - stop.size() + 1 : 0;
      if (text.find(stop, from) != std::string::npos) return finish(s, FinishReason::stop, stop);
    }
  }
  if (s.generated() >= params.max_new_tokens || static_cast<int64_t>(s.tokens.size()) >= max_model_len_)
    finish(s, FinishReason::length);
}

void Engine::store_routing(const int16_t* rows, const std::vector<RoutedSpan>& spans) {
  int64_t at = 0;
  for (const auto& [s, from, n] : spans) {
    if (s != nullptr && !s->done) routing_.write(s->blocks, from, n, rows + at * routing_.per_token());
    at += n;
  }
}

void Engine::store_routing(const RoutingTrace& trace, const std::vector<RoutedSpan>& spans) {
  if (!routing_.enabled()) return;
  const auto rows = trace.routing().reshape({-1, routing_.per_token()}).to(at::kCPU, at::kShort).contiguous();
  store_routing(rows.data_ptr<int16_t>(), spans);
}

void Engine::take_routing(Seq& s) {
  if (!routing_.enabled()) return;
  const auto len = static_cast<int64_t>(s.tokens.size()), prompt = len - s.generated();
  const auto width = static_cast<size_t>(routing_.per_token());
  // Every token but the last sampled one was forwarded, as far as this sequence's keys go.
  std::vector<int16_t> rows;
  routing_.read(s.blocks, 0, std::max<int64_t>(0, std::min(s.computed, len - 1)), rows);
  rows.resize(static_cast<size_t>(len) * width, -1);
  auto& shared = s.req->prompt_routing;  // the samples' prompt, filled from whichever computed it
  for (size_t i = 0; i < shared.size(); ++i)
    if (shared[i] < 0) shared[i] = rows[i];
  s.out.routing.assign(rows.begin() + static_cast<int64_t>(static_cast<size_t>(prompt) * width), rows.end());
}

void Engine::finish(Seq& s, FinishReason reason, std::string stop) {
  RLX_ASSERT(!s.done, "sequence finished twice");
  s.done = true;
  s.running = false;
  s.out.finish = reason;
  s.out.stop_string = std::move(stop);
  take_routing(s);
  release_blocks(s);
  --s.req->remaining;
}

void Engine::abort_request(RequestState& r) {
  for (auto& s : r.seqs) {
    if (s->done) continue;
    s->followers.clear();
    finish(*s, FinishReason::abort);
  }
  std::erase_if(running_, [](const Seq* s) { return s->done; });
  std::erase_if(waiting_, [](const Seq* s) { return s->done; });
}

void Engine::collect(std::vector<GenerationResult>& finished) {
  std::vector<std::string> ids;
  for (auto it = requests_.begin(); it != requests_.end();) {
    auto& r = *it->second;
    if (r.remaining > 0) {
      ++it;
      continue;
    }
    // A decode step still in flight may hold rows of this request: they are discarded.
    for (auto& f : inflight_)
      for (auto& s : f.seqs)
        if (s != nullptr && s->req == &r) s = nullptr;
    GenerationResult out{r.req.id, std::move(r.req.prompt), {}, std::move(r.prompt_logprobs), std::move(r.prompt_top)};
    if (routing_.enabled()) {
      out.prompt_routing = std::move(r.prompt_routing);
      out.routing_layers = static_cast<uint16_t>(routing_.layers());
      out.routing_top_k = static_cast<uint16_t>(routing_.top_k());
    }
    for (auto& s : r.seqs) out.samples.push_back(std::move(s->out));
    ids.push_back(out.id);
    finished.push_back(std::move(out));
    it = requests_.erase(it);
  }
  if (ids.empty()) return;
  std::lock_guard lock(inbox_mu_);
  for (const auto& id : ids) live_ids_.erase(id);
}

}  // namespace rlx
