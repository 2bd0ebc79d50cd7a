// The engine's facade: the public calls, on any thread, go to the inbox (requests, aborts,
// staged weights, pause) and the stepping calls to the core (src/rollout/engine_core.hpp:
// a Scheduler that plans each step, a ModelRunner that carries the plan out).
#include "rlx/rollout/engine.hpp"

#include <algorithm>
#include <limits>

#include "rlx/core/error.hpp"
#include "rollout/engine_core.hpp"

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

Engine::Engine(std::shared_ptr<Transformer> model, EngineConfig cfg, std::shared_ptr<const Tokenizer> tokenizer,
               int64_t weight_version)
    : inbox_(std::make_unique<EngineInbox>(cfg.max_queued, weight_version)),
      core_(std::make_unique<EngineCore>(std::move(model), cfg, std::move(tokenizer), weight_version, *inbox_)) {}

Engine::~Engine() = default;

void Engine::add(GenerationRequest r) {
  RLX_CHECK(!r.id.empty() && r.id.size() <= 256, "request id must be 1 to 256 bytes, got {} bytes", r.id.size());
  const std::string who = fmt::format("request '{}'", r.id);
  core_->check_request(r, who);
  inbox_->add(std::move(r), who);
}

bool Engine::abort(const std::string& id) { return inbox_->abort(id); }
bool Engine::has_work() const { return inbox_->has_work(); }
void Engine::pause() { inbox_->pause(true); }
void Engine::resume() { inbox_->pause(false); }
bool Engine::paused() const { return inbox_->paused(); }
int64_t Engine::weight_version() const { return inbox_->version(); }

void Engine::update_weights(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            std::optional<UpdatePolicy> policy) {
  const std::string who = fmt::format("update_weights(version {})", version);
  inbox_->check_newer(who, version);
  inbox_->stage(who, {version, core_->staged_weights(who, tensors), policy.value_or(core_->config().update_policy)});
}

int64_t Engine::load_weights(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const std::string who = fmt::format("load_weights(version {})", version);
  inbox_->check_newer(who, version, /*idle=*/true);
  const int64_t bytes = core_->load_weights(version, tensors, who);
  inbox_->loaded(version);
  return bytes;
}

void Engine::sleep() {
  if (core_->asleep()) return;
  RLX_CHECK(!has_work(), "engine: sleep() with requests in flight");
  core_->sleep();
}

void Engine::wake() { core_->wake(); }
bool Engine::asleep() const { return core_->asleep(); }

int64_t Engine::kv_pool_bytes() const { return core_->runner().pool_bytes(core_->blocks().num_blocks()); }
EngineStats Engine::stats() const { return core_->stats(); }
const EngineConfig& Engine::config() const { return core_->config(); }
int64_t Engine::max_model_len() const { return core_->max_model_len(); }
const BlockAllocator& Engine::blocks() const { return core_->blocks(); }
const BlockRouting& Engine::routing() const { return core_->routing(); }
const ModelConfig& Engine::model_config() const { return core_->runner().model().config(); }

std::vector<GenerationResult> Engine::step() { return core_->step(); }

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
      if (std::find(ids.begin(), ids.end(), r.id) != ids.end())
        done.emplace(r.id, std::move(r));
      else
        others.push_back(std::move(r));
    }
  }
  // Requests other callers added are handed out by the next step().
  core_->hand_back(std::move(others));
  std::vector<GenerationResult> out;
  for (const auto& id : ids) out.push_back(std::move(done.at(id)));
  return out;
}

}  // namespace rlx
