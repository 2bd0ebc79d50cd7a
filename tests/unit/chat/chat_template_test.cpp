#include "rlx/chat/chat_template.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>

#include "rlx/model/tokenizer.hpp"
#include "test_paths.hpp"

using rlx::chat::ChatTemplate;
using rlx::chat::RenderOptions;
using rlx::chat::TurnDelta;
using json = nlohmann::ordered_json;

namespace {
const std::filesystem::path kChatFixtures = std::filesystem::path(rlx::test_paths::kFixtureDir) / "chat";
const char* const kModels[] = {"qwen3", "qwen2_5", "llama3_1", "deepseek_v3"};

json conversations() {
  std::ifstream in(std::filesystem::path(rlx::test_paths::kSourceDir) / "tests/data/chat_conversations.json");
  return json::parse(in);
}

void require_fixtures() {
  if (!std::filesystem::exists(kChatFixtures / ".complete"))
    FAIL("missing " << kChatFixtures << ": run scripts/make_chat_template_fixtures.sh " << kChatFixtures.string()
                    << " (scripts/test.sh does this)");
}

RenderOptions options_of(const json& all, const json& c) {
  RenderOptions o;
  o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  if (c.value("use_tools", false)) o.tools = all["tools"];
  if (c.contains("kwargs")) o.kwargs = c["kwargs"];
  return o;
}

std::string error_of(const ChatTemplate& t, const json& messages) {
  try {
    t.render(messages);
  } catch (const rlx::Error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

// The real templates of Qwen3, Qwen2.5, Llama 3.1 and DeepSeek-V3 over conversations with
// system prompts, several turns, tool calls and results, and reasoning: the text equals what
// transformers (jinja2) renders, and @huggingface/jinja where it renders the same; the
// token ids equal the reference tokenizer's.
TEST_CASE("chat template: parity with transformers and @huggingface/jinja on real templates", "[chat]") {
  require_fixtures();
  json all = conversations();
  std::map<std::string, ChatTemplate> templates;
  std::map<std::string, std::unique_ptr<rlx::Tokenizer>> tokenizers;
  for (const char* m : kModels) {
    templates.emplace(m, ChatTemplate::load(kChatFixtures / m));
    tokenizers.emplace(m, rlx::load_tokenizer(kChatFixtures / m / "tokenizer.json"));
  }
  std::ifstream in(kChatFixtures / "expected.jsonl");
  int texts = 0, hfjs_agree = 0, errors = 0;
  for (std::string line; std::getline(in, line);) {
    json r = json::parse(line);
    std::string model = r["template"];
    if (model == "features") continue;
    json c;
    for (const auto& x : all["cases"])
      if (x["name"] == r["case"]) c = x;
    INFO(model << " / " << r["case"].get<std::string>());
    const ChatTemplate& t = templates.at(model);
    if (r.contains("error")) {
      INFO("jinja2: " << r["error"]);
      CHECK_THROWS_AS(t.render(c["messages"], options_of(all, c)), rlx::Error);
      ++errors;
      continue;
    }
    std::string text = t.render(c["messages"], options_of(all, c));
    CHECK(text == r["text"].get<std::string>());
    if (r["hfjs"].contains("text") && r["hfjs"]["text"] == r["text"]) ++hfjs_agree;
    auto ids = tokenizers.at(model)->encode(text, {.add_special_tokens = false, .parse_special = true});
    CHECK(ids == r["ids"].get<std::vector<rlx::TokenId>>());
    ++texts;
  }
  CHECK(texts >= 35);        // 4 templates x 10 conversations, less the references' own errors
  CHECK(hfjs_agree >= 35);
  (void)errors;
}

TEST_CASE("chat template: bad messages and tools are errors that name the message", "[chat]") {
  require_fixtures();
  auto t = ChatTemplate::load(kChatFixtures / "qwen3");
  CHECK_THAT(error_of(t, json::object()), Catch::Contains("messages must be a JSON array"));
  CHECK_THAT(error_of(t, json::parse(R"([{"role": "user", "content": "a"}, {"content": "b"}])")),
             Catch::Contains("messages[1]") && Catch::Contains("role"));
  CHECK_THAT(error_of(t, json::parse(R"([{"role": "user", "content": 5}])")), Catch::Contains("messages[0]") && Catch::Contains("content"));
  CHECK_THAT(error_of(t, json::parse(R"([{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}])")),
             Catch::Contains("messages[0].tool_calls[0]"));
  RenderOptions bad_tools;
  bad_tools.tools = json::object();
  CHECK_THROWS_WITH(t.render(json::parse(R"([{"role": "user", "content": "a"}])"), bad_tools), Catch::Contains("tools must be a list"));
  // A template's own raise_exception names the template and line.
  json llama_cfg = {{"chat_template", "{% if messages[0].role != 'user' %}\n{{ raise_exception('first must be user') }}{% endif %}"}};
  auto strict = ChatTemplate::from_config(llama_cfg, "strict.json");
  CHECK_THAT(error_of(strict, json::parse(R"([{"role": "assistant", "content": "x"}])")),
             Catch::Contains("strict.json chat_template:2") && Catch::Contains("first must be user"));
  CHECK_THROWS_WITH(ChatTemplate::from_config(json::object(), "empty.json"), Catch::Contains("empty.json") && Catch::Contains("chat_template"));
  CHECK_THROWS_WITH(ChatTemplate::from_config({{"chat_template", "{% for %}"}}, "bad.json"), Catch::Contains("bad.json chat_template:1"));
}

// Multi-turn exactness: a conversation's tokens are the prompt's, then the sampled tokens as
// sampled, then each new turn's tokens. For templates that render earlier turns unchanged this
// equals rendering the whole conversation; for Qwen3's dropped reasoning it keeps what was
// sampled.
TEST_CASE("chat template: turns append to the sampled tokens", "[chat]") {
  require_fixtures();
  json sys_user = json::parse(R"([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}])");
  json next = json::parse(R"([{"role": "user", "content": "Another one?"}])");
  json tool_result = json::parse(R"([{"role": "tool", "content": "408"}])");
  for (const char* m : kModels) {
    INFO(m);
    auto t = ChatTemplate::load(kChatFixtures / m);
    auto tok = rlx::load_tokenizer(kChatFixtures / m / "tokenizer.json");
    auto encode = [&](const std::string& s) { return tok->encode(s, {.add_special_tokens = false, .parse_special = true}); };
    std::string eos = t.special_tokens()["eos_token"];
    std::string prompt = t.render(sys_user);
    std::string sampled = "7" + eos;  // what the engine sampled, ending with the stop token
    std::string delta = TurnDelta::after_assistant(t, next, eos);
    json whole = sys_user;
    whole.push_back({{"role", "assistant"}, {"content", "7"}});
    for (const auto& x : next) whole.push_back(x);
    auto appended = encode(prompt);
    for (auto part : {encode(sampled), encode(delta)}) appended.insert(appended.end(), part.begin(), part.end());
    CHECK(appended == encode(t.render(whole)));
    // A generation stopped for length: the turn's whole closing text is appended.
    std::string cut = TurnDelta::after_assistant(t, next, "");
    CHECK(cut == eos + delta);
  }
  // Qwen3 drops earlier reasoning when it renders a conversation; the appended tokens keep it.
  auto qwen3 = ChatTemplate::load(kChatFixtures / "qwen3");
  std::string reasoning = "<think>\n91 = 7 * 13.\n</think>\n\nNo.<|im_end|>";
  std::string kept = qwen3.render(sys_user) + reasoning + TurnDelta::after_assistant(qwen3, next, "<|im_end|>");
  CHECK(kept.find("91 = 7 * 13.") != std::string::npos);
  CHECK_THAT(kept, Catch::EndsWith("<|im_start|>user\nAnother one?<|im_end|>\n<|im_start|>assistant\n"));
  // Tool results open the user turn Qwen3 wraps them in.
  CHECK(TurnDelta::after_assistant(qwen3, tool_result, "<|im_end|>") ==
        "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
}

// Input JSON built anywhere (not only through rlx::parse_json) is converted with a depth
// bound, and the caller's RenderLimits reach the template.
TEST_CASE("chat template: deep input and the render's limits", "[chat]") {
  auto t = ChatTemplate::from_source("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}", json::object(), "tiny");
  json ok = json::parse(R"([{"role": "user", "content": "hi"}])");
  auto deep = [] {
    json root = json::array();
    json* at = &root;
    for (int i = 0; i < 100000; ++i) at = &at->emplace_back(json::array());
    return root;
  };
  json messages = ok;
  messages[0]["content"] = deep();
  CHECK_THROWS_WITH(t.render(messages), Catch::Contains("messages: ") && Catch::Contains("nests deeper than 256 levels"));
  RenderOptions deep_var;
  deep_var.kwargs["x"] = deep();
  CHECK_THROWS_WITH(t.render(ok, deep_var), Catch::Contains("template variable x"));
  RenderOptions deep_tools;
  deep_tools.tools = json::array();
  deep_tools.tools.push_back(deep());
  CHECK_THROWS_WITH(TurnDelta::after_assistant(t, ok, "", deep_tools), Catch::Contains("tools: nested deeper than 256 levels"));
  // A server's request deadline, already passed.
  RenderOptions late;
  late.limits.deadline = std::chrono::steady_clock::now() - std::chrono::milliseconds(1);
  try {
    t.render(ok, late);
    FAIL("rendered past the deadline");
  } catch (const rlx::chat::jinja::LimitError& e) {
    CHECK(e.limit() == "deadline");
    CHECK_THAT(e.what(), Catch::StartsWith("tiny: "));
  }
  CHECK(t.render(ok) == "user:hi;");
}
