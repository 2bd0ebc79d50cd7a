#include "rlx/serve/openai.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "rlx/core/files.hpp"
#include "test_paths.hpp"

using namespace rlx::serve;
using json = nlohmann::ordered_json;

namespace {
const std::filesystem::path kQwen3 = std::filesystem::path(rlx::test_paths::kFixtureDir) / "chat" / "qwen3";

ServedModel qwen3_model() {
  if (!std::filesystem::exists(kQwen3 / "tokenizer.json"))
    FAIL("missing " << kQwen3 << ": run scripts/make_chat_template_fixtures.sh (scripts/test.sh does this)");
  ServedModel m;
  m.name = "tiny";
  m.tokenizer = rlx::load_tokenizer(kQwen3 / "tokenizer.json");
  m.chat_template = rlx::chat::ChatTemplate::load(kQwen3);
  m.end_of_turn = {*m.tokenizer->token_to_id("<|im_end|>")};
  m.max_model_len = 256;
  return m;
}

ApiError error_of(const json& body, Endpoint e = Endpoint::chat) {
  static const ServedModel model = qwen3_model();
  try {
    parse_request(body, e, model, {}, 1);
  } catch (const ApiError& err) {
    return err;
  }
  return ApiError(0, "(no error)");
}

json chat(json extra = json::object()) {
  json b = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}
}  // namespace

TEST_CASE("openai: a chat request becomes the template's tokens and the engine's parameters", "[serve]") {
  ServedModel model = qwen3_model();
  auto req = parse_request(chat({{"n", 3}, {"temperature", 0.5}, {"stop", "x"}, {"seed", 42}, {"max_tokens", 10}}), Endpoint::chat,
                           model, {}, 7);
  std::string text = model.chat_template->render(json::parse(R"([{"role": "user", "content": "Hi"}])"));
  CHECK(req.generation.prompt == model.tokenizer->encode(text));
  CHECK(req.generation.params.n == 3);
  CHECK(req.generation.params.temperature == 0.5);
  CHECK(req.generation.params.stop_strings == std::vector<std::string>{"x"});
  CHECK(req.generation.params.stop_token_ids == model.end_of_turn);
  CHECK(req.generation.params.max_new_tokens == 10);
  CHECK(req.generation.seed == 42);
  // Without max_tokens a chat request may use the rest of the context.
  auto open = parse_request(chat(), Endpoint::chat, model, {}, 7);
  CHECK(open.generation.params.max_new_tokens == model.max_model_len - static_cast<int64_t>(open.generation.prompt.size()));
  CHECK(open.generation.seed == 7);
  CHECK(parse_request(chat({{"ignore_eos", true}}), Endpoint::chat, model, {}, 7).generation.params.stop_token_ids.empty());
}

TEST_CASE("openai: bad requests are 4xx errors naming the field", "[serve]") {
  auto e = error_of(chat({{"model", "gpt-4o"}}));
  CHECK(e.status == 404);
  CHECK(e.code == "model_not_found");
  CHECK(error_of(chat({{"n", 0}})).param == "n");
  CHECK(error_of(chat({{"n", "two"}})).param == "n");
  CHECK(error_of(chat({{"temperature", 3}})).param == "temperature");
  for (double t : {1e-39, 1e-300, 0.005}) {  // fp32 cannot sample at these: 400, never the engine's failure
    auto tiny = error_of(chat({{"temperature", t}}));
    CHECK(tiny.status == 400);
    CHECK(tiny.param == "temperature");
    CHECK_THAT(tiny.what(), Catch::Contains("0.01"));
  }
  CHECK(error_of(chat({{"temperature", 0.01}})).status == 0);
  CHECK(error_of(chat({{"stop", {"a", "b", "c", "d", "e"}}})).param == "stop");
  CHECK(error_of(chat({{"top_logprobs", 3}})).param == "top_logprobs");  // without logprobs: true
  CHECK(error_of(chat({{"logprobs", true}, {"top_logprobs", 21}})).param == "top_logprobs");
  CHECK(error_of(json{{"model", "tiny"}, {"prompt", "x"}, {"logprobs", 6}}, Endpoint::completion).param == "logprobs");
  CHECK(error_of(json{{"model", "tiny"}, {"prompt", "x"}, {"logprobs", 1}, {"echo", true}, {"stream", true}},
                 Endpoint::completion).param == "echo");
  CHECK(error_of(chat({{"presence_penalty", 0.5}})).param == "presence_penalty");
  CHECK(error_of(chat({{"messages", json::array()}})).param == "messages");
  auto no_role = error_of(chat({{"messages", {{{"content", "x"}}}}}));
  CHECK(no_role.param == "messages");
  CHECK_THAT(no_role.what(), Catch::Contains("messages[0]"));
  auto long_ask = error_of(chat({{"max_tokens", 100000}}));
  CHECK(long_ask.code == "context_length_exceeded");
  CHECK(error_of(json::array()).status == 400);
  json completion = {{"model", "tiny"}, {"prompt", {1, 2, 999999999}}};
  CHECK(error_of(completion, Endpoint::completion).param == "prompt");
  CHECK(error_of(json{{"model", "tiny"}}, Endpoint::completion).param == "prompt");
  // The error object is OpenAI's.
  json body = error_of(chat({{"n", 0}})).body();
  CHECK(body["error"]["type"] == "invalid_request_error");
  CHECK(body["error"]["param"] == "n");
}

TEST_CASE("openai: responses carry the text cut at the stop string, usage and token ids", "[serve]") {
  ServedModel model = qwen3_model();
  auto req = parse_request(chat({{"return_token_ids", true}, {"logprobs", true}}), Endpoint::chat, model, {}, 1);
  rlx::GenerationResult r;
  r.id = "x";
  r.prompt = req.generation.prompt;
  rlx::SampleOutput s;
  s.tokens = model.tokenizer->encode("Hello world<|im_end|>");
  s.logprobs.assign(s.tokens.size(), -0.5f);
  s.versions.assign(s.tokens.size(), 3);
  s.finish = rlx::FinishReason::stop;
  r.samples = {s};
  json out = response(req, r, model, "chatcmpl-1", 100);
  CHECK(out["object"] == "chat.completion");
  CHECK(out["choices"][0]["message"]["content"] == "Hello world");  // the special token is not text
  CHECK(out["choices"][0]["logprobs"]["content"].size() == s.tokens.size());
  CHECK(out["choices"][0]["token_ids"] == json(s.tokens));
  CHECK(out["choices"][0]["weight_versions"][0] == 3);
  CHECK(out["usage"]["completion_tokens"] == s.tokens.size());
  CHECK(out["prompt_token_ids"] == json(r.prompt));
  // A stop string ends the text before it; a stream's text so far ends on a whole character.
  rlx::SampleOutput stopped;
  stopped.tokens = model.tokenizer->encode("one, two");
  stopped.stop_string = ",";
  CHECK(sample_text(*model.tokenizer, stopped) == "one");
  rlx::SampleOutput partial;
  partial.tokens = model.tokenizer->encode("ok\xC3");  // ends inside a character
  CHECK(sample_text(*model.tokenizer, partial) == "ok\xC3");
  CHECK(sample_text(*model.tokenizer, partial, /*complete_only=*/true) == "ok");
}

TEST_CASE("openai: with tools, Hermes tool-call blocks come back as tool_calls", "[serve]") {
  ServedModel model = qwen3_model();
  json tools = json::parse(R"([{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}])");
  auto req = parse_request(chat({{"tools", tools}}), Endpoint::chat, model, {}, 1);
  CHECK(req.tools);
  rlx::GenerationResult r;
  r.prompt = req.generation.prompt;
  rlx::SampleOutput call, plain, bad;
  call.tokens = model.tokenizer->encode("Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2*3\"}}\n</tool_call><|im_end|>");
  call.finish = rlx::FinishReason::stop;
  plain.tokens = model.tokenizer->encode("It is 6.<|im_end|>");
  plain.finish = rlx::FinishReason::stop;
  bad.tokens = model.tokenizer->encode("<tool_call>not json</tool_call><|im_end|>");
  bad.finish = rlx::FinishReason::stop;
  for (auto* s : {&call, &plain, &bad}) s->logprobs.assign(s->tokens.size(), -1.f), s->versions.assign(s->tokens.size(), 0);
  r.samples = {call, plain, bad};
  json out = response(req, r, model, "chatcmpl-7", 0);
  const json& m0 = out["choices"][0]["message"];
  CHECK(m0["content"] == "Let me compute.");
  REQUIRE(m0["tool_calls"].size() == 1);
  CHECK(m0["tool_calls"][0]["type"] == "function");
  CHECK(m0["tool_calls"][0]["function"]["name"] == "calculator");
  CHECK(json::parse(m0["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"expression", "2*3"}});
  CHECK(out["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(out["choices"][1]["message"]["content"] == "It is 6.");
  CHECK_FALSE(out["choices"][1]["message"].contains("tool_calls"));
  CHECK(out["choices"][1]["finish_reason"] == "stop");
  CHECK(out["choices"][2]["message"]["content"] == "<tool_call>not json</tool_call>");  // kept as the model wrote it
  CHECK(out["choices"][2]["finish_reason"] == "stop");

  // A call nested 100,000 deep (a model can be asked to write one) stays text: parsing it as
  // a call would copy and print it recursively, past the end of the stack.
  rlx::SampleOutput deep;
  const std::string args = std::string(100000, '[') + std::string(100000, ']');
  const std::string deep_text = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"x\": " + args + "}}\n</tool_call>";
  deep.tokens = model.tokenizer->encode(deep_text);
  deep.finish = rlx::FinishReason::stop;
  deep.logprobs.assign(deep.tokens.size(), -1.f), deep.versions.assign(deep.tokens.size(), 0);
  r.samples = {deep};
  json kept = response(req, r, model, "chatcmpl-8", 0)["choices"][0];
  CHECK(kept["message"]["content"] == deep_text);
  CHECK_FALSE(kept["message"].contains("tool_calls"));
}

TEST_CASE("openai: log-prob alternatives, and echo's prompt log-probs as lm-evaluation-harness reads them", "[serve]") {
  ServedModel model = qwen3_model();
  const auto& tok = *model.tokenizer;
  auto chat_req = parse_request(chat({{"logprobs", true}, {"top_logprobs", 2}}), Endpoint::chat, model, {}, 1);
  CHECK(chat_req.generation.params.logprobs == 2);
  CHECK(chat_req.generation.params.prompt_logprobs == -1);
  rlx::GenerationResult r;
  r.prompt = chat_req.generation.prompt;
  rlx::SampleOutput s;
  s.tokens = tok.encode("Hi there");
  s.logprobs = {-0.1f, -0.2f};
  s.versions = {0, 0};
  s.top_logprobs = {{{s.tokens[0], -0.1f}, {7, -2.5f}}, {{s.tokens[1], -0.2f}, {8, -1.5f}}};
  s.finish = rlx::FinishReason::length;
  r.samples = {s};
  json out = response(chat_req, r, model, "chatcmpl-2", 0);
  const json& content = out["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == 2);
  REQUIRE(content[1]["top_logprobs"].size() == 2);
  CHECK(content[1]["top_logprobs"][0]["token"] == " there");
  CHECK(content[1]["top_logprobs"][1]["logprob"] == -1.5f);
  CHECK(content[1]["top_logprobs"][1]["bytes"].size() == tok.decode(std::vector<rlx::TokenId>{8}).size());

  // lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens 1.
  const std::vector<rlx::TokenId> prompt = {9707, 11, 1879};
  json body = {{"model", "tiny"}, {"prompt", {prompt}}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 1}, {"temperature", 0}};
  auto req = parse_request(body, Endpoint::completion, model, {}, 1);
  CHECK(req.generation.params.logprobs == 1);
  CHECK(req.generation.params.prompt_logprobs == 1);
  rlx::GenerationResult e;
  e.prompt = prompt;
  e.prompt_logprobs = {-3.0f, -4.0f};
  e.prompt_top_logprobs = {{{5, -1.0f}}, {{1879, -4.0f}}};
  rlx::SampleOutput g;
  g.tokens = {13};
  g.logprobs = {-0.5f};
  g.versions = {0};
  g.top_logprobs = {{{13, -0.5f}}};
  e.samples = {g};
  json lp = response(req, e, model, "cmpl-1", 0)["choices"][0]["logprobs"];
  REQUIRE(lp["tokens"].size() == 4);
  CHECK(lp["token_logprobs"] == json::parse("[null, -3.0, -4.0, -0.5]"));
  CHECK(lp["top_logprobs"][0].is_null());
  CHECK(lp["top_logprobs"][2][tok.decode(std::vector<rlx::TokenId>{1879})] == -4.0f);  // greedy: the token is the top one
  CHECK(lp["top_logprobs"][3].size() == 1);
  CHECK(lp["text_offset"][0] == 0);
  CHECK(lp["text_offset"][3] == req.prompt_text.size());  // the generated text starts after the echoed prompt
  // Without alternatives, top_logprobs is null, as OpenAI's.
  body["logprobs"] = 0;
  auto req0 = parse_request(body, Endpoint::completion, model, {}, 1);
  CHECK(req0.generation.params.prompt_logprobs == 0);
  CHECK(response(req0, e, model, "cmpl-2", 0)["choices"][0]["logprobs"]["top_logprobs"].is_null());
}

// Issue 50, item 6: the chat template renders under the request's deadline. A template that
// loops without end (within every other limit) ends its own request with 504, not the server.
TEST_CASE("openai: the chat template renders under the request's deadline", "[serve]") {
  namespace fs = std::filesystem;
  ServedModel model = qwen3_model();
  const fs::path dir = fs::temp_directory_path() / fmt::format("rlx-slow-template-{}", ::getpid());
  fs::create_directories(dir);
  json config = {{"chat_template", "{% for i in range(100000) %}{% for j in range(100000) %}{% if j < 0 %}x{% endif %}{% endfor %}{% endfor %}"}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  model.chat_template = rlx::chat::ChatTemplate::load(dir);
  ServeLimits limits;
  limits.request_timeout_s = 0.05;
  const auto start = std::chrono::steady_clock::now();
  try {
    parse_request(chat(), Endpoint::chat, model, limits, 1);
    FAIL("the render was not stopped");
  } catch (const ApiError& e) {
    CHECK(e.status == 504);
    CHECK_THAT(e.what(), Catch::Contains("chat template"));
  }
  // Stopped by the deadline, long before the loop's other limits (10 million iterations).
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  rlx::remove_tree(dir);
}
