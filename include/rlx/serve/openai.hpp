// The OpenAI API's requests and responses over the rollout engine, without sockets: a
// request body becomes a GenerationRequest (or an ApiError naming the field), and engine
// outputs become `chat.completion` / `text_completion` objects and their stream chunks.
// src/serve/server.cpp moves them over HTTP.
//
//   auto req = rlx::serve::parse_request(body, rlx::serve::Endpoint::chat, model);
//   engine.add(req.generation);  ... result ...
//   json out = rlx::serve::response(req, result, model);
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "rlx/chat/chat_template.hpp"
#include "rlx/core/error.hpp"
#include "rlx/model/tokenizer.hpp"
#include "rlx/rollout/engine.hpp"

namespace rlx::serve {

// An error the client caused or must wait out: its HTTP status and OpenAI's error object.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : Error(std::move(message)), status(status), param(std::move(param)), code(std::move(code)) {}
  nlohmann::ordered_json body() const;  // {"error": {"message", "type", "param", "code"}}
  int status;
  std::string param, code;
};

// What the server bounds; every request is checked against it before the engine sees it.
struct ServeLimits {
  int64_t max_body_bytes = 4 << 20;  // a request body past this is answered 413
  int64_t max_in_flight = 64;        // requests being served at once; past it, 429
  int64_t max_n = 16;                // choices per request
  int64_t max_messages = 1024;       // messages of a chat request
  int64_t max_stop = 4;              // stop strings (OpenAI's limit)
  double request_timeout_s = 600;    // a request still generating after this is aborted (504)
  // Connections (each has a thread): past the limit 503, past the limit per client address
  // 429. 0: 2 * max_in_flight + 64, and max_in_flight + 32 per address.
  int64_t max_connections = 0;
  int64_t max_connections_per_peer = 0;
  double request_read_timeout_s = 30;  // a request's line, headers and body must arrive within this (408)
};

// The model a server serves: its name in requests, tokenizer, chat template (if any) and the
// token ids that end an assistant turn.
struct ServedModel {
  std::string name;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<chat::ChatTemplate> chat_template;
  std::vector<TokenId> end_of_turn;  // stop tokens of chat completions (the template's eos_token)
  int64_t max_model_len = 0;
};

enum class Endpoint { chat, completion };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::chat;
  GenerationRequest generation;  // prompt, sampling parameters, seed (id set by the server)
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage
  bool logprobs = false;
  bool echo = false;             // completions: the prompt's text comes first
  bool return_token_ids = false; // rlx's extension: token ids and weight versions per choice
  bool tools = false;            // chat with `tools`: Hermes <tool_call> blocks become tool_calls
  std::string prompt_text;       // completions with a text prompt: for echo
};

// Checks and converts a request body. Throws ApiError (400 with the field as `param`, 404 for
// an unknown model) for anything a client got wrong.
ParsedRequest parse_request(const nlohmann::ordered_json& body, Endpoint endpoint, const ServedModel& model,
                            const ServeLimits& limits, uint64_t default_seed);

// The text of a sample as the API returns it: special tokens dropped, cut before the stop
// string that ended it. `complete_only` drops a trailing incomplete UTF-8 character (a
// stream's text so far).
std::string sample_text(const Tokenizer& tok, const SampleOutput& s, bool complete_only = false);

// The whole response of a finished request.
nlohmann::ordered_json response(const ParsedRequest& req, const GenerationResult& result, const ServedModel& model,
                                const std::string& id, int64_t created);

// Stream chunks: the opening chunk of choice `index` (chat: the assistant role), a text delta
// (with the log-probs of its tokens when asked), the closing chunk with the finish reason, and
// the usage chunk.
nlohmann::ordered_json chunk_open(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created,
                                  int64_t index);
nlohmann::ordered_json chunk_delta(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created,
                                   int64_t index, const std::string& text, const std::vector<TokenId>& tokens,
                                   const std::vector<float>& logprobs, const std::vector<std::vector<TokenLogprob>>& top);
nlohmann::ordered_json chunk_finish(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created,
                                    int64_t index, const SampleOutput& sample);
nlohmann::ordered_json chunk_usage(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created,
                                   const GenerationResult& result);

}  // namespace rlx::serve
