// OpenAI requests and responses over the rollout engine; see rlx/serve/openai.hpp.
#include "rlx/serve/openai.hpp"

#include "rlx/chat/tool_calls.hpp"
#include "rlx/core/json.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace rlx::serve {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

// A field of the body: absent and null read as `fallback`; a value of the wrong type is a 400.
template <class T>
T field(const json& body, const char* key, T fallback) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) bad(key, fmt::format("'{}' must be a boolean", key));
    return it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) bad(key, fmt::format("'{}' must be an integer", key));
    return it->get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) bad(key, fmt::format("'{}' must be a number", key));
    return it->get<T>();
  } else {
    if (!it->is_string()) bad(key, fmt::format("'{}' must be a string", key));
    return it->get<std::string>();
  }
}

void unsupported_if(const json& body, const char* key, bool set) {
  if (set) bad(key, fmt::format("'{}' is not supported by rlx serve", key));
  (void)body;
}

// Bytes of `text` up to its last complete UTF-8 character.
size_t complete_utf8_prefix(const std::string& text) {
  size_t n = text.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

std::string token_text(const Tokenizer& tok, TokenId t) {
  if (t < 0 || t >= tok.vocab_size()) return {};
  TokenId one[] = {t};
  return tok.decode(one);
}

json token_bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

using Alternatives = std::vector<std::vector<TokenLogprob>>;

// Chat's `logprobs.content`: per token, its text, log-prob, bytes and `top_logprobs` (the
// alternatives asked for; an empty list without).
json chat_logprobs(const Tokenizer& tok, const std::vector<TokenId>& tokens, const std::vector<float>& logprobs,
                   const Alternatives& top) {
  json content = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string text = token_text(tok, tokens[i]);
    json alternatives = json::array();
    if (i < top.size())
      for (const auto& a : top[i]) {
        std::string t = token_text(tok, a.token);
        alternatives.push_back({{"token", t}, {"logprob", a.logprob}, {"bytes", token_bytes(t)}});
      }
    content.push_back({{"token", text}, {"logprob", logprobs[i]}, {"bytes", token_bytes(text)}, {"top_logprobs", alternatives}});
  }
  return {{"content", content}};
}

// Completions' `logprobs`: tokens, token_logprobs, top_logprobs (a {text: log-prob} per
// token with `logprobs` > 0, else null) and text_offset; with `echo`, the prompt's tokens
// first (the first one without a log-prob, as OpenAI's).
class CompletionLogprobs {
 public:
  CompletionLogprobs(const Tokenizer& tok, bool with_top) : tok_(tok), with_top_(with_top) {}
  void add(TokenId token, json logprob, const std::vector<TokenLogprob>* top) {
    std::string text = token_text(tok_, token);
    tokens_.push_back(text);
    logprobs_.push_back(std::move(logprob));
    offsets_.push_back(offset_);
    offset_ += text.size();
    if (!with_top_) return;
    if (top == nullptr) return top_.push_back(nullptr);
    json alternatives = json::object();
    for (const auto& a : *top) alternatives[token_text(tok_, a.token)] = a.logprob;
    top_.push_back(std::move(alternatives));
  }
  void add_all(const std::vector<TokenId>& tokens, const std::vector<float>& logprobs, const Alternatives& top) {
    for (size_t i = 0; i < tokens.size(); ++i) add(tokens[i], logprobs[i], i < top.size() ? &top[i] : nullptr);
  }
  void move_to(size_t offset) { offset_ = offset; }
  json done() {
    return {{"tokens", tokens_}, {"token_logprobs", logprobs_}, {"top_logprobs", with_top_ ? top_ : json(nullptr)},
            {"text_offset", offsets_}};
  }

 private:
  const Tokenizer& tok_;
  bool with_top_;
  size_t offset_ = 0;
  json tokens_ = json::array(), logprobs_ = json::array(), top_ = json::array(), offsets_ = json::array();
};

const char* finish_name(FinishReason r) { return r == FinishReason::length ? "length" : r == FinishReason::stop ? "stop" : "abort"; }

json base_object(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created, bool chunk) {
  const char* object = req.endpoint == Endpoint::chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model.name}};
}

json usage_of(const GenerationResult& r) {
  int64_t completion = 0;
  for (const auto& s : r.samples) completion += static_cast<int64_t>(s.tokens.size());
  auto prompt = static_cast<int64_t>(r.prompt.size());
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

}  // namespace

json ApiError::body() const {
  const char* type = status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error";
  return {{"error",
           {{"message", what()}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

namespace {
// The chat request's prompt text: its messages, tools and template arguments through the
// model's chat template, under the request's deadline (a template that loops or grows without
// end fails this request alone; rlx's Jinja engine checks the deadline every 1,024 steps).
std::string render_chat(const json& body, const json& messages, const ServedModel& model, const ServeLimits& limits,
                        ParsedRequest& req) {
  chat::RenderOptions options;
  options.add_generation_prompt = field<bool>(body, "add_generation_prompt", true);
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) bad("tools", "'tools' must be a list");
    options.tools = *t;
    req.tools = !t->empty();
  }
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    options.kwargs = *k;
  }
  options.limits.deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                    std::chrono::duration<double>(limits.request_timeout_s));
  try {
    return model.chat_template->render(messages, options);
  } catch (const chat::jinja::LimitError& e) {
    if (e.limit() == "deadline")
      throw ApiError(504, fmt::format("rendering the chat template took longer than {} s: {}", limits.request_timeout_s, e.what()));
    bad("messages", e.what());
  } catch (const Error& e) {
    bad("messages", e.what());
  }
}

// The body names this server's model (a 404 names the one it serves).
void check_model(const json& body, const ServedModel& model) {
  auto model_it = body.find("model");
  if (model_it == body.end() || !model_it->is_string()) bad("model", "'model' is required and must be a string");
  if (model_it->get<std::string>() != model.name)
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", model_it->get<std::string>(), model.name),
                   "model", "model_not_found");
}

// n, temperature, top_p, top_k, min_p and ignore_eos into `p`; the OpenAI parameters rlx
// does not support are refused when set.
void parse_sampling(const json& body, const ServeLimits& limits, SamplingParams& p) {
  p.n = field<int64_t>(body, "n", 1);
  if (p.n < 1 || p.n > limits.max_n) bad("n", fmt::format("'n' must be in [1, {}], got {}", limits.max_n, p.n));
  p.temperature = field<double>(body, "temperature", 1.0);
  if (p.temperature < 0 || p.temperature > 2) bad("temperature", fmt::format("'temperature' must be in [0, 2], got {}", p.temperature));
  if (p.temperature > 0 && p.temperature < SamplingParams::kMinTemperature)  // fp32 sampling overflows below it
    bad("temperature", fmt::format("'temperature' must be 0 (greedy) or in [{}, 2], got {}", SamplingParams::kMinTemperature, p.temperature));
  p.top_p = field<double>(body, "top_p", 1.0);
  if (!(p.top_p > 0 && p.top_p <= 1)) bad("top_p", fmt::format("'top_p' must be in (0, 1], got {}", p.top_p));
  int64_t top_k = field<int64_t>(body, "top_k", 0);
  if (top_k < -1) bad("top_k", "'top_k' must be >= -1 (-1 or 0: off)");
  p.top_k = std::max<int64_t>(top_k, 0);
  p.min_p = field<double>(body, "min_p", 0.0);
  if (p.min_p < 0 || p.min_p >= 1) bad("min_p", "'min_p' must be in [0, 1)");
  p.ignore_eos = field<bool>(body, "ignore_eos", false);
  unsupported_if(body, "presence_penalty", field<double>(body, "presence_penalty", 0.0) != 0.0);
  unsupported_if(body, "frequency_penalty", field<double>(body, "frequency_penalty", 0.0) != 0.0);
  unsupported_if(body, "logit_bias", body.contains("logit_bias") && !body["logit_bias"].is_null() && !body["logit_bias"].empty());
  unsupported_if(body, "best_of", field<int64_t>(body, "best_of", p.n) != p.n);
  unsupported_if(body, "suffix", !field<std::string>(body, "suffix", "").empty());
}

// "stop": a string or a list of non-empty strings, at most limits.max_stop.
void parse_stop(const json& body, const ServeLimits& limits, SamplingParams& p) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return;
  if (it->is_string()) {
    p.stop_strings.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const auto& s : *it) {
      if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings");
      p.stop_strings.push_back(s.get<std::string>());
    }
  } else {
    bad("stop", "'stop' must be a string or a list of strings");
  }
  if (static_cast<int64_t>(p.stop_strings.size()) > limits.max_stop)
    bad("stop", fmt::format("at most {} stop strings", limits.max_stop));
  for (const auto& s : p.stop_strings)
    if (s.empty()) bad("stop", "a stop string must not be empty");
}

// seed, stream, stream_options and return_token_ids into `req`.
void parse_delivery(const json& body, uint64_t default_seed, ParsedRequest& req) {
  int64_t seed = field<int64_t>(body, "seed", static_cast<int64_t>(default_seed));
  req.generation.seed = static_cast<uint64_t>(seed);
  req.stream = field<bool>(body, "stream", false);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!req.stream) bad("stream_options", "'stream_options' is only allowed with 'stream': true");
    req.include_usage = field<bool>(*it, "include_usage", false);
  }
  req.return_token_ids = field<bool>(body, "return_token_ids", false);
}

// /v1/chat/completions: logprobs and top_logprobs, and the prompt from the messages through
// the model's chat template (its end-of-turn tokens stop unless ignore_eos).
void parse_chat_prompt(const json& body, const ServedModel& model, const ServeLimits& limits, ParsedRequest& req) {
  SamplingParams& p = req.generation.params;
  req.logprobs = field<bool>(body, "logprobs", false);
  p.logprobs = field<int64_t>(body, "top_logprobs", 0);
  if (p.logprobs < 0 || p.logprobs > SamplingParams::kMaxLogprobs)
    bad("top_logprobs",
        fmt::format("'top_logprobs' must be in [0, {}], got {}", SamplingParams::kMaxLogprobs, p.logprobs));
  if (p.logprobs > 0 && !req.logprobs) bad("top_logprobs", "'top_logprobs' requires 'logprobs': true");
  if (!model.chat_template)
    bad("messages", fmt::format("the model '{}' has no chat template; use /v1/completions", model.name));
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array() || messages->empty())
    bad("messages", "'messages' must be a non-empty list");
  if (static_cast<int64_t>(messages->size()) > limits.max_messages)
    bad("messages", fmt::format("at most {} messages", limits.max_messages));
  const std::string text = render_chat(body, *messages, model, limits, req);
  req.generation.prompt = model.tokenizer->encode(text, {.add_special_tokens = false, .parse_special = true});
  if (!p.ignore_eos)
    for (TokenId t : model.end_of_turn) p.stop_token_ids.push_back(t);
}

// /v1/completions: logprobs, echo, and the prompt as text or token ids (one prompt).
void parse_completion_prompt(const json& body, const ServedModel& model, ParsedRequest& req) {
  SamplingParams& p = req.generation.params;
  std::vector<TokenId>& prompt = req.generation.prompt;
  const Tokenizer& tok = *model.tokenizer;
  auto lp = body.find("logprobs");
  if (lp != body.end() && !lp->is_null()) {
    if (!lp->is_number_integer() || lp->get<int64_t>() < 0 || lp->get<int64_t>() > 5)
      bad("logprobs", "'logprobs' must be an integer in [0, 5]");
    p.logprobs = lp->get<int64_t>();  // the most likely alternatives per token
    req.logprobs = true;
  }
  req.echo = field<bool>(body, "echo", false);
  if (req.echo && req.logprobs) {
    // The prompt's tokens with their log-probs (and alternatives), as lm-evaluation-harness scores continuations.
    if (req.stream) bad("echo", "'echo' with 'logprobs' is not supported with 'stream': true");
    p.prompt_logprobs = p.logprobs;
  }
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad("prompt", "'prompt' is required");
  json pr = *it;
  if (pr.is_array() && pr.size() == 1 && (pr[0].is_string() || pr[0].is_array())) pr = pr[0];
  if (pr.is_string()) {
    req.prompt_text = pr.get<std::string>();
    prompt = tok.encode(req.prompt_text, {.add_special_tokens = true, .parse_special = true});
  } else if (pr.is_array() && std::all_of(pr.begin(), pr.end(), [](const json& x) { return x.is_number_integer(); })) {
    for (const auto& x : pr) {
      auto id = x.get<int64_t>();
      if (id < 0 || id >= tok.vocab_size())
        bad("prompt", fmt::format("token id {} is outside the vocabulary (size {})", id, tok.vocab_size()));
      prompt.push_back(static_cast<TokenId>(id));
    }
    req.prompt_text = tok.decode(prompt);
  } else {
    bad("prompt", "'prompt' must be a string or a list of token ids (one prompt per request)");
  }
}

// max_completion_tokens (or max_tokens) within the room the prompt leaves in the model's
// context (by default all of it for chat, 16 tokens for completions).
void parse_max_new_tokens(const json& body, Endpoint endpoint, const ServedModel& model, ParsedRequest& req) {
  SamplingParams& p = req.generation.params;
  const std::vector<TokenId>& prompt = req.generation.prompt;
  if (prompt.empty()) bad(endpoint == Endpoint::chat ? "messages" : "prompt", "the prompt is empty");
  auto prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len >= model.max_model_len)
    throw ApiError(400, fmt::format("This model's maximum context length is {} tokens; the prompt has {}", model.max_model_len, prompt_len),
                   endpoint == Endpoint::chat ? "messages" : "prompt", "context_length_exceeded");
  int64_t room = model.max_model_len - prompt_len;
  const char* max_key = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null() ? "max_completion_tokens" : "max_tokens";
  p.max_new_tokens = field<int64_t>(body, max_key, endpoint == Endpoint::chat ? room : std::min<int64_t>(16, room));
  if (p.max_new_tokens < 1) bad(max_key, fmt::format("'{}' must be >= 1", max_key));
  if (p.max_new_tokens > room)
    throw ApiError(400, fmt::format("This model's maximum context length is {} tokens; the prompt has {} and '{}' asks for {}",
                                    model.max_model_len, prompt_len, max_key, p.max_new_tokens),
                   max_key, "context_length_exceeded");
}
}  // namespace

ParsedRequest parse_request(const json& body, Endpoint endpoint, const ServedModel& model, const ServeLimits& limits,
                            uint64_t default_seed) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  ParsedRequest req;
  req.endpoint = endpoint;
  check_model(body, model);
  SamplingParams& p = req.generation.params;
  parse_sampling(body, limits, p);
  parse_stop(body, limits, p);
  parse_delivery(body, default_seed, req);
  if (endpoint == Endpoint::chat)
    parse_chat_prompt(body, model, limits, req);
  else
    parse_completion_prompt(body, model, req);
  parse_max_new_tokens(body, endpoint, model, req);
  try {
    p.validate("request", model.tokenizer->vocab_size(), true);
  } catch (const Error& e) {
    bad("", e.what());
  }
  return req;
}

std::string sample_text(const Tokenizer& tok, const SampleOutput& s, bool complete_only) {
  std::vector<TokenId> known;
  for (TokenId t : s.tokens)
    if (t >= 0 && t < tok.vocab_size()) known.push_back(t);
  std::string text = tok.decode(known, /*skip_special=*/true);
  if (!s.stop_string.empty()) {
    auto at = text.find(s.stop_string);
    if (at != std::string::npos) text.erase(at);
  }
  if (complete_only) text.erase(complete_utf8_prefix(text));  // erase: never grows (resize trips -Wstringop-overflow)
  return text;
}

json response(const ParsedRequest& req, const GenerationResult& result, const ServedModel& model, const std::string& id,
              int64_t created) {
  json out = base_object(req, model, id, created, false);
  json choices = json::array();
  const Tokenizer& tok = *model.tokenizer;
  for (size_t i = 0; i < result.samples.size(); ++i) {
    const SampleOutput& s = result.samples[i];
    std::string text = sample_text(tok, s);
    json choice = {{"index", i}};
    const char* finish = finish_name(s.finish);
    if (req.endpoint == Endpoint::chat) {
      // A tool call nested deeper than JSON from a client may be stays text (parse_assistant
      // reads calls with parse_json's depth bound).
      if (req.tools) {
        // The model's tool calls, in the format Qwen's templates prompt for, as OpenAI's.
        choice["message"] = chat::parse_assistant(text, fmt::format("call_{}_{}_", id, i));
        if (choice["message"].contains("tool_calls") && s.finish == FinishReason::stop) finish = "tool_calls";
      } else {
        choice["message"] = {{"role", "assistant"}, {"content", text}};
      }
      choice["logprobs"] = req.logprobs ? chat_logprobs(tok, s.tokens, s.logprobs, s.top_logprobs) : json(nullptr);
    } else {
      std::string prefix = req.echo ? req.prompt_text : "";
      choice["text"] = prefix + text;
      if (req.logprobs) {
        CompletionLogprobs lps(tok, req.generation.params.logprobs > 0);
        if (req.echo && !result.prompt.empty()) {
          const auto& plp = result.prompt_logprobs;
          const auto& ptop = result.prompt_top_logprobs;
          lps.add(result.prompt[0], nullptr, nullptr);
          for (size_t j = 1; j < result.prompt.size(); ++j)
            lps.add(result.prompt[j], j - 1 < plp.size() ? json(plp[j - 1]) : json(nullptr), j - 1 < ptop.size() ? &ptop[j - 1] : nullptr);
        }
        lps.move_to(prefix.size());  // the generated text starts after the prompt's
        lps.add_all(s.tokens, s.logprobs, s.top_logprobs);
        choice["logprobs"] = lps.done();
      } else {
        choice["logprobs"] = nullptr;
      }
    }
    choice["finish_reason"] = finish;
    if (req.return_token_ids) {
      choice["token_ids"] = s.tokens;
      choice["weight_versions"] = s.versions;
      if (!req.logprobs) choice["token_logprobs"] = s.logprobs;
    }
    choices.push_back(std::move(choice));
  }
  out["choices"] = std::move(choices);
  out["usage"] = usage_of(result);
  if (req.return_token_ids) out["prompt_token_ids"] = result.prompt;
  return out;
}

json chunk_open(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created, int64_t index) {
  json out = base_object(req, model, id, created, true);
  json choice = {{"index", index}};
  if (req.endpoint == Endpoint::chat) choice["delta"] = {{"role", "assistant"}, {"content", ""}};
  else choice["text"] = req.echo ? req.prompt_text : "";
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  out["choices"] = json::array({choice});
  return out;
}

json chunk_delta(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created, int64_t index,
                 const std::string& text, const std::vector<TokenId>& tokens, const std::vector<float>& logprobs,
                 const std::vector<std::vector<TokenLogprob>>& top) {
  json out = base_object(req, model, id, created, true);
  json choice = {{"index", index}};
  const Tokenizer& tok = *model.tokenizer;
  if (req.endpoint == Endpoint::chat) {
    choice["delta"] = {{"content", text}};
    choice["logprobs"] = req.logprobs ? chat_logprobs(tok, tokens, logprobs, top) : json(nullptr);
  } else {
    choice["text"] = text;
    if (req.logprobs) {
      CompletionLogprobs lps(tok, req.generation.params.logprobs > 0);
      lps.add_all(tokens, logprobs, top);
      choice["logprobs"] = lps.done();
    } else {
      choice["logprobs"] = nullptr;
    }
  }
  choice["finish_reason"] = nullptr;
  if (req.return_token_ids) choice["token_ids"] = tokens;
  out["choices"] = json::array({choice});
  return out;
}

json chunk_finish(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created, int64_t index,
                  const SampleOutput& sample) {
  json out = base_object(req, model, id, created, true);
  json choice = {{"index", index}};
  if (req.endpoint == Endpoint::chat) choice["delta"] = json::object();
  else choice["text"] = "";
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_name(sample.finish);
  if (req.return_token_ids) {
    choice["weight_versions"] = sample.versions;
  }
  out["choices"] = json::array({choice});
  return out;
}

json chunk_usage(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created,
                 const GenerationResult& result) {
  json out = base_object(req, model, id, created, true);
  out["choices"] = json::array();
  out["usage"] = usage_of(result);
  return out;
}

}  // namespace rlx::serve
