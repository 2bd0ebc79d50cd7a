#include "rollout/engine_requests.hpp"

#include <algorithm>

namespace rlx {

void RequestTable::add(GenerationRequest r) {
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
    s->prompt_len = static_cast<int64_t>(r.prompt.size());
    s->whole_prompt = r.params.prompt_logprobs >= 0;  // its prompt's log-probs: computed whole
    state->seqs.push_back(std::move(s));
  }
  Seq* leader = state->seqs.front().get();
  for (size_t i = 1; i < state->seqs.size(); ++i) leader->followers.push_back(state->seqs[i].get());
  scheduler_.add(*leader);
  state->req = std::move(r);
  requests_.emplace(state->req.id, std::move(state));
}

RequestState* RequestTable::find(const std::string& id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void RequestTable::append(Seq& s, TokenId token, float logprob, std::vector<TokenLogprob> top, int64_t version) {
  const auto& params = s.req->req.params;
  s.tokens.push_back(token);
  s.out.tokens.push_back(token);
  s.out.logprobs.push_back(logprob);
  s.out.versions.push_back(version);
  ++generated_tokens_;
  if (s.req->req.on_token) s.req->req.on_token(s.sample, token, logprob, top);
  if (params.logprobs > 0) s.out.top_logprobs.push_back(std::move(top));
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) != params.stop_token_ids.end())
    return finish(s, FinishReason::stop);
  if (!params.ignore_eos && eos_ >= 0 && token == eos_) return finish(s, FinishReason::stop);
  if (const std::string* stop = stop_string(s, token)) return finish(s, FinishReason::stop, *stop);
  if (s.generated() >= params.max_new_tokens || static_cast<int64_t>(s.tokens.size()) >= max_model_len_)
    finish(s, FinishReason::length);
}

const std::string* RequestTable::stop_string(const Seq& s, TokenId token) const {
  const auto& stops = s.req->req.params.stop_strings;
  if (stops.empty()) return nullptr;
  // A new occurrence ends inside the last token's bytes, so a window of as many tokens
  // as the longest stop string has bytes covers it (every token has at least one byte).
  size_t longest = 0;
  for (const auto& stop : stops) longest = std::max(longest, stop.size());
  const size_t w = std::min(s.out.tokens.size(), longest + 1);
  std::vector<TokenId> window;
  for (size_t i = s.out.tokens.size() - w; i < s.out.tokens.size(); ++i)
    if (s.out.tokens[i] < tokenizer_->vocab_size())
      window.push_back(s.out.tokens[i]);  // padded vocab rows decode to nothing
  const std::string text = tokenizer_->decode(window);
  const size_t before = window.empty() || window.back() != token
                            ? text.size()
                            : tokenizer_->decode(std::span<const TokenId>(window).first(window.size() - 1)).size();
  for (const auto& stop : stops) {
    const size_t from = before >= stop.size() ? before - stop.size() + 1 : 0;
    if (text.find(stop, from) != std::string::npos) return &stop;
  }
  return nullptr;
}

void RequestTable::take_routing(Seq& s) {
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

void RequestTable::finish(Seq& s, FinishReason reason, std::string stop) {
  s.out.finish = reason;
  s.out.stop_string = std::move(stop);
  take_routing(s);
  scheduler_.finish(s);
  --s.req->remaining;
}

void RequestTable::abort(RequestState& r) {
  for (auto& s : r.seqs) {
    if (s->done) continue;
    s->followers.clear();
    finish(*s, FinishReason::abort);
  }
  scheduler_.drop_finished();
}

void RequestTable::abort_started() {
  for (auto& [id, r] : requests_) {
    bool started = false;
    for (const auto& s : r->seqs) started |= !s->done && s->in_flight();
    if (started) abort(*r);
  }
}

std::vector<std::string> RequestTable::collect(std::vector<GenerationResult>& finished,
                                               const std::function<void(const RequestState&)>& retiring) {
  std::vector<std::string> ids;
  for (auto it = requests_.begin(); it != requests_.end();) {
    auto& r = *it->second;
    if (r.remaining > 0) {
      ++it;
      continue;
    }
    retiring(r);
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
  return ids;
}

}  // namespace rlx
