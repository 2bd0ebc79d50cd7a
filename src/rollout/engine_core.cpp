#include "rollout/engine_core.hpp"

#include <algorithm>
#include <limits>

#include "rlx/core/error.hpp"

namespace rlx {

namespace {
int64_t blocks_for(const ModelConfig& mc, const EngineConfig& c, at::ScalarType dtype) {
  if (c.kv_cache_blocks > 0) return c.kv_cache_blocks;
  const int64_t n =
      static_cast<int64_t>(c.kv_cache_mb * 1024 * 1024) / PagedKVCache::block_bytes(mc, c.block_size, dtype);
  RLX_CHECK(n >= 1, "engine: kv_cache_mb = {} holds no block of {} tokens ({} bytes each)", c.kv_cache_mb, c.block_size,
            PagedKVCache::block_bytes(mc, c.block_size, dtype));
  RLX_CHECK(n <= std::numeric_limits<int32_t>::max(), "engine: kv_cache_mb = {} is too many blocks", c.kv_cache_mb);
  return n;
}
// Mixture-of-experts models that record routing: a row per KV slot; otherwise none.
BlockRouting block_routing(const ModelConfig& mc, const EngineConfig& c, const BlockAllocator& blocks) {
  if (!c.record_routing || mc.num_experts == 0) return {};
  return BlockRouting(blocks.num_blocks(), c.block_size, static_cast<int32_t>(mc.sparse_layers().size()),
                      static_cast<int32_t>(mc.num_experts_per_tok));
}
SchedulerConfig scheduler_config(const EngineConfig& c) {
  return {.block_size = c.block_size,
          .max_batch_tokens = c.max_batch_tokens,
          .max_running = c.max_running,
          .prefix_caching = c.prefix_caching};
}
int64_t eos_of(const Tokenizer* tokenizer, const ModelConfig& mc) {
  return tokenizer && tokenizer->eos_id ? *tokenizer->eos_id : mc.eos_token_id;
}
}  // namespace

EngineCore::EngineCore(std::shared_ptr<Transformer> model, EngineConfig cfg, std::shared_ptr<const Tokenizer> tokenizer,
                       int64_t weight_version, EngineInbox& inbox)
    : cfg_((config::check_bounds(cfg, "engine config"), cfg)),
      max_model_len_(cfg_.max_model_len > 0 ? cfg_.max_model_len : model->config().max_position_embeddings),
      inbox_(inbox),
      tokenizer_(std::move(tokenizer)),
      scheduler_(scheduler_config(cfg_), static_cast<int32_t>(blocks_for(model->config(), cfg_, model->dtype())),
                 weight_version),
      routing_(block_routing(model->config(), cfg_, scheduler_.blocks())),
      runner_(std::move(model), cfg_, max_model_len_, scheduler_.blocks(), routing_.per_token()),
      requests_(scheduler_, routing_, tokenizer_, eos_of(tokenizer_.get(), runner_.model().config()), max_model_len_),
      version_(weight_version) {}

EngineCore::~EngineCore() {
  try {
    land_all();  // the device finishes what it was given
  } catch (...) {
  }
}

void EngineCore::check_request(const GenerationRequest& r, const std::string& who) const {
  RLX_CHECK(!r.prompt.empty(), "{}: prompt is empty", who);
  const int64_t vocab = runner_.model().config().vocab_size;
  for (size_t i = 0; i < r.prompt.size(); ++i)
    RLX_CHECK(r.prompt[i] >= 0 && r.prompt[i] < vocab, "{}: prompt[{}] = {} is outside the vocabulary [0, {})", who, i,
              r.prompt[i], vocab);
  const int64_t len = static_cast<int64_t>(r.prompt.size());
  RLX_CHECK(len < max_model_len_,
            "{}: prompt has {} tokens; the context (max_model_len) is {}, leaving no room to generate", who, len,
            max_model_len_);
  r.params.validate(who, vocab, tokenizer_ != nullptr);
  const int64_t longest = std::min(len + r.params.max_new_tokens, max_model_len_);
  const int64_t need = (longest + cfg_.block_size - 1) / cfg_.block_size;
  const int32_t blocks = scheduler_.blocks().num_blocks();
  RLX_CHECK(need <= blocks, "{}: up to {} tokens need {} KV blocks; the cache has {} (raise kv_cache_mb)", who, longest,
            need, blocks);
}

ModelRunner::Tensors EngineCore::staged_weights(const std::string& who, const Tensors& tensors) const {
  runner_.check_weights(who, tensors);
  return runner_.staged(tensors);
}

int64_t EngineCore::load_weights(int64_t version, const Tensors& tensors, const std::string& who) {
  runner_.check_weights(who, tensors);
  land_all();  // a last chained step of rows that had all stopped
  const int64_t bytes = install_weights(version, tensors);
  update_.reset();
  return bytes;
}

void EngineCore::sleep() {
  if (asleep_) return;
  land_all();
  RLX_ASSERT(scheduler_.running().empty() && scheduler_.waiting().empty(), "engine: idle, yet sequences hold blocks");
  scheduler_.forget_prefixes();  // the cached prefixes' keys and values go with the pool
  runner_.sleep();
  asleep_ = true;
}

void EngineCore::wake() {
  if (!asleep_) return;
  runner_.wake();
  asleep_ = false;
}

EngineStats EngineCore::stats() const {
  EngineStats s = stats_;
  const auto& sched = scheduler_.stats();
  s.preemptions = sched.preemptions;
  s.prefix_hit_tokens = sched.prefix_hit_tokens;
  s.shared_prefill_tokens = sched.shared_prefill_tokens;
  s.cow_copies = sched.cow_copies;
  s.generated_tokens = requests_.generated_tokens();
  s.running = static_cast<int64_t>(scheduler_.running().size());
  s.waiting = static_cast<int64_t>(scheduler_.waiting().size());
  s.free_blocks = scheduler_.blocks().num_free();
  s.total_blocks = scheduler_.blocks().num_blocks();
  s.queued = static_cast<int64_t>(inbox_.in_flight());
  s.weight_version = inbox_.version();
  return s;
}

// --- stepping --------------------------------------------------------------------------

std::vector<GenerationResult> EngineCore::step() {
  RLX_CHECK(!asleep_, "engine: step() while asleep (its KV pool is released; wake() first)");
  std::vector<GenerationResult> finished = std::move(unclaimed_);
  unclaimed_.clear();
  take_inbox();
  const bool paused = inbox_.paused();
  // While paused nothing runs; a decode step in flight keeps its tokens until resume.
  if (!paused && runner_.in_flight() > 0 && try_chain()) {
    // Overlap: the same rows' next decode step goes to the device before this one's tokens
    // are read back.
    launch_decode(/*chained=*/true);
    land_decode();
    ++stats_.steps;
  } else if (!paused) {
    land_all();  // the chain ends: this step schedules afresh
    maybe_apply_update();
    // While old weights drain, only sequences already in flight start.
    plan_ = scheduler_.schedule(/*draining=*/update_ && update_->policy == UpdatePolicy::finish_old);
    for (const auto& [src, dst] : plan_.copies) routing_.copy(src, dst);
    if (plain_decode()) {
      launch_decode(/*chained=*/false);
      if (!cfg_.overlap) land_decode();
    } else if (!plan_.empty()) {
      forward_and_sample();
    }
    ++stats_.steps;
  }
  const auto ids = requests_.collect(finished, [&](const RequestState& r) {
    // A decode step still in flight may hold rows of this request: they are discarded.
    runner_.drop_rows([&](const Sequence& s) { return as_seq(s).req == &r; });
  });
  inbox_.retire(ids);
  return finished;
}

void EngineCore::hand_back(std::vector<GenerationResult> results) {
  for (auto& r : results) unclaimed_.push_back(std::move(r));
}

void EngineCore::take_inbox() {
  auto taken = inbox_.take();
  if (taken.update) update_ = std::move(taken.update);
  for (auto& r : taken.requests) requests_.add(std::move(r));
  // An abort ends a request with every token computed so far: a decode step in flight lands first.
  if (!taken.aborts.empty()) land_all();
  for (const auto& id : taken.aborts)
    if (RequestState* r = requests_.find(id)) requests_.abort(*r);
}

bool EngineCore::maybe_apply_update() {
  if (!update_) return false;
  switch (update_->policy) {
    case UpdatePolicy::finish_old:
      if (!scheduler_.running().empty()) return false;
      for (const Sequence* s : scheduler_.waiting())
        if (s->in_flight()) return false;
      break;
    case UpdatePolicy::abort:
      requests_.abort_started();
      break;
    case UpdatePolicy::continue_:
      // Their cached keys/values come from the old weights: recompute them with the new.
      scheduler_.preempt_all();
      break;
  }
  install_weights(update_->version, update_->tensors);
  update_.reset();
  return true;
}

int64_t EngineCore::install_weights(int64_t version, const Tensors& tensors) {
  const int64_t bytes = runner_.install_weights(tensors);
  scheduler_.set_weight_version(version);  // cached prefixes hold the old weights' keys and values
  version_ = version;
  inbox_.set_version(version);
  return bytes;
}

void EngineCore::forward_and_sample() {
  std::vector<int64_t> last_rows;
  std::vector<Sequence*> completing;  // sequences whose known tokens are all computed after this step
  std::vector<RoutedSpan> spans;
  int64_t packed = 0;
  for (const auto& [s, n] : plan_.chunks) {
    spans.push_back({s, s->computed, n});
    packed += n;
    if (s->computed + n == static_cast<int64_t>(s->tokens.size())) {
      last_rows.push_back(packed - 1);
      completing.push_back(s);
    }
    const bool decode = n == 1 && s->generated() > 0 && s->computed + 1 == static_cast<int64_t>(s->tokens.size());
    if (!decode) stats_.prefill_tokens += n;
  }
  const auto fwd = forgetting_on_error([&] {
    auto f = runner_.forward(plan_);
    store_routing(f.routing, spans);
    return f;
  });
  stats_.forward_tokens += packed;
  record_prompt_logprobs(fwd.hidden);  // before `computed` moves: the chunks' positions
  for (const auto& [s, n] : plan_.chunks) s->computed += n;
  if (!completing.empty()) sample_completing(fwd.hidden, completing, last_rows);
}

void EngineCore::sample_completing(const at::Tensor& hidden, const std::vector<Sequence*>& completing,
                                   const std::vector<int64_t>& last_rows) {
  // Followers fork here: they share every block of their leader's computed prompt and
  // sample their first token from the same logits row.
  std::vector<Sequence*> samplers;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < completing.size(); ++i) {
    samplers.push_back(completing[i]);
    rows.push_back(static_cast<int64_t>(i));
    for (Sequence* f : scheduler_.fork(*completing[i])) {
      samplers.push_back(f);
      rows.push_back(static_cast<int64_t>(i));
    }
  }
  const auto logits =
      runner_.logits(hidden, last_rows, samplers.size() != completing.size() ? rows : std::vector<int64_t>{});
  auto out = runner_.sample(logits, sampling_batch(samplers), alternatives(samplers));
  append_rows(samplers, out.tokens, out.logprobs, out.top);
}

void EngineCore::append_rows(const std::vector<Sequence*>& rows, const std::vector<int64_t>& tokens,
                             const std::vector<float>& logprobs, std::vector<std::vector<TokenLogprob>>& top) {
  for (size_t i = 0; i < rows.size(); ++i) {
    Sequence* s = rows[i];
    if (s == nullptr || s->done) {
      ++stats_.discarded_rows;
      continue;
    }
    requests_.append(as_seq(*s), static_cast<TokenId>(tokens[i]), logprobs[i],
                     top.empty() ? std::vector<TokenLogprob>{} : std::move(top[i]), version_);
  }
  scheduler_.drop_finished();
}

SamplingBatch EngineCore::sampling_batch(const std::vector<Sequence*>& seqs, int64_t ahead) const {
  SamplingBatch batch;
  for (const Sequence* s : seqs) {
    const Seq& q = as_seq(*s);
    const auto& r = q.req->req;
    const std::string& key = r.sampling_key.empty() ? r.id : r.sampling_key;
    batch.add(r.params, sampling_uniform(r.seed, key, q.sample, static_cast<int64_t>(q.tokens.size()) + ahead));
  }
  return batch;
}

void EngineCore::store_routing(const std::vector<int16_t>& rows, const std::vector<RoutedSpan>& spans) {
  if (!routing_.enabled()) return;
  int64_t at = 0;
  for (const auto& [s, from, n] : spans) {
    if (s != nullptr && !s->done) routing_.write(s->blocks, from, n, rows.data() + at * routing_.per_token());
    at += n;
  }
}

}  // namespace rlx
