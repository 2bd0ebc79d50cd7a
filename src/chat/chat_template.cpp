// Chat templates as transformers renders them; see rlx/chat/chat_template.hpp.
#include "rlx/chat/chat_template.hpp"

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "rlx/core/files.hpp"


namespace rlx::chat {
namespace {

using json = nlohmann::ordered_json;
constexpr uint64_t kMaxConfigBytes = 64ull << 20;  // tokenizer_config.json lists added tokens: MiBs at most


// transformers' special_tokens_map: the tokens that are set, an AddedToken's dict as its content.
json special_tokens_of(const json& config) {
  json out = json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_object() && it->contains("content")) out[key] = (*it)["content"];
    else if (it->is_string()) out[key] = *it;
  }
  auto extra = config.find("additional_special_tokens");
  if (extra != config.end() && extra->is_array() && !extra->empty()) {
    json list = json::array();
    for (const auto& t : *extra) list.push_back(t.is_object() ? json(t.value("content", std::string())) : t);
    out["additional_special_tokens"] = list;
  }
  return out;
}

// `j` as a template value; `what` names it in the error when it nests too deep.
jinja::Value value_of(const json& j, const std::string& what) {
  try {
    return jinja::Value::from_json(j);
  } catch (const jinja::TemplateError& e) {
    throw Error(fmt::format("{}: {}", what, e.what()));
  }
}

// Throws naming `what` when `j` nests deeper than jinja::Value::kMaxDepth: checked without
// recursion, before anything copies `j` (nlohmann's copy recurses once a level).
void check_depth(const json& j, const char* what) {
  std::vector<std::pair<const json*, int>> stack = {{&j, 0}};
  while (!stack.empty()) {
    auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    RLX_CHECK(depth < jinja::Value::kMaxDepth, "{}: nested deeper than {} levels", what, jinja::Value::kMaxDepth);
    for (const auto& child : *v) stack.emplace_back(&child, depth + 1);
  }
}

}  // namespace

ChatTemplate ChatTemplate::from_source(const std::string& template_source, const json& config, const std::string& source) {
  ChatTemplate t;
  t.default_ = jinja::Template::parse(template_source, source);
  t.special_tokens_ = special_tokens_of(config);
  return t;
}

ChatTemplate ChatTemplate::from_config(const json& config, const std::string& source) {
  RLX_CHECK(config.is_object(), "{}: a tokenizer config is a JSON object", source);
  auto it = config.find("chat_template");
  RLX_CHECK(it != config.end() && !it->is_null(), "{}: has no \"chat_template\"", source);
  ChatTemplate t;
  t.special_tokens_ = special_tokens_of(config);
  if (it->is_string()) {
    t.default_ = jinja::Template::parse(it->get<std::string>(), source + " chat_template");
    return t;
  }
  // Named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
  RLX_CHECK(it->is_array(), "{}: \"chat_template\" must be a string or a list of {{name, template}}", source);
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    RLX_CHECK(e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") && e["template"].is_string(),
              "{}: chat_template[{}] must be {{\"name\": string, \"template\": string}}", source, i);
    std::string name = e["name"].get<std::string>();
    auto parsed = jinja::Template::parse(e["template"].get<std::string>(), fmt::format("{} chat_template[{}]", source, name));
    if (name == "default") t.default_ = std::move(parsed);
    else if (name == "tool_use") t.tool_use_ = std::move(parsed);
    else if (!t.default_ && i == 0) t.default_ = std::move(parsed);
  }
  RLX_CHECK(t.default_ || t.tool_use_, "{}: \"chat_template\" names no 'default' template", source);
  return t;
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& tokenizer_dir) {
  auto config_file = tokenizer_dir / "tokenizer_config.json";
  auto jinja_file = tokenizer_dir / "chat_template.jinja";
  json config = json::object();
  if (std::filesystem::exists(config_file)) {
    try {
      config = json::parse(read_file(config_file, kMaxConfigBytes));
    } catch (const json::exception& e) {
      RLX_CHECK(false, "{}: not valid JSON: {}", config_file.string(), e.what());
    }
  }
  if (std::filesystem::exists(jinja_file)) return from_source(read_file(jinja_file, kMaxConfigBytes), config, jinja_file.string());
  RLX_CHECK(std::filesystem::exists(config_file), "{}: has neither chat_template.jinja nor tokenizer_config.json",
            tokenizer_dir.string());
  return from_config(config, config_file.string());
}

void check_messages(const json& messages) {
  RLX_CHECK(messages.is_array(), "messages must be a JSON array of message objects, got {}", messages.type_name());
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    RLX_CHECK(m.is_object(), "messages[{}] must be an object, got {}", i, m.type_name());
    RLX_CHECK(m.contains("role") && m["role"].is_string(), "messages[{}]: \"role\" must be a string", i);
    if (m.contains("content")) {
      const json& c = m["content"];
      RLX_CHECK(c.is_string() || c.is_null() || c.is_array(), "messages[{}] (role {}): \"content\" must be a string, null or a list of parts, got {}",
                i, m["role"].get<std::string>(), c.type_name());
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const json& calls = m["tool_calls"];
      RLX_CHECK(calls.is_array(), "messages[{}]: \"tool_calls\" must be a list", i);
      for (size_t k = 0; k < calls.size(); ++k) {
        const json& call = calls[k];
        RLX_CHECK(call.is_object() && call.contains("function") && call["function"].is_object(),
                  "messages[{}].tool_calls[{}]: needs a \"function\" object", i, k);
        RLX_CHECK(call["function"].contains("name") && call["function"]["name"].is_string(),
                  "messages[{}].tool_calls[{}].function: \"name\" must be a string", i, k);
      }
    }
  }
}

std::string ChatTemplate::render(const json& messages, const RenderOptions& options) const {
  check_messages(messages);
  bool with_tools = !options.tools.is_null();
  if (with_tools) RLX_CHECK(options.tools.is_array(), "tools must be a list of tool schemas, got {}", options.tools.type_name());
  RLX_CHECK(options.kwargs.is_object(), "template variables must be a JSON object");
  const jinja::Template& t = with_tools && tool_use_ ? *tool_use_ : default_ ? *default_ : *tool_use_;
  // The context's values straight from the caller's JSON: a copy of it would recurse
  // through it unbounded, from_json stops at jinja::Value::kMaxDepth.
  jinja::Value::Dict context;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) context.set(it.key(), value_of(it.value(), it.key()));
  context.set("messages", value_of(messages, "messages"));
  context.set("tools", value_of(options.tools, "tools"));
  context.set("documents", jinja::Value::none());
  context.set("add_generation_prompt", jinja::Value(options.add_generation_prompt));
  for (auto it = options.kwargs.begin(); it != options.kwargs.end(); ++it)
    context.set(it.key(), value_of(it.value(), "template variable " + it.key()));
  return t.render(jinja::Value(std::move(context)), options.limits);
}

std::string TurnDelta::after_assistant(const ChatTemplate& tpl, const json& new_messages, const std::string& sampled_end,
                                       const RenderOptions& options) {
  RLX_CHECK(new_messages.is_array() && !new_messages.empty(), "the messages after an assistant turn must be a non-empty list");
  check_depth(new_messages, "the messages after an assistant turn");
  check_depth(options.tools, "tools");
  check_depth(options.kwargs, "template variables");
  // A fixed conversation whose assistant turn is followed by the new messages: the text after
  // the assistant's content is the turn's closing text, the new turns and the generation
  // prompt, whatever the template does to earlier turns (e.g. Qwen3 dropping old reasoning).
  static const std::string kMarker = "\x01rlx-assistant-content\x01";
  json base = json::array({{{"role", "user"}, {"content", "\x01rlx-user\x01"}}, {{"role", "assistant"}, {"content", kMarker}}});
  for (const auto& m : new_messages) base.push_back(m);
  RenderOptions o = options;
  o.add_generation_prompt = true;
  std::string full = tpl.render(base, o);
  auto at = full.find(kMarker);
  RLX_CHECK(at != std::string::npos && full.find(kMarker, at + 1) == std::string::npos,
            "the chat template does not render an assistant message's content once, as is: turns cannot be appended");
  std::string delta = full.substr(at + kMarker.size());
  if (!sampled_end.empty() && delta.rfind(sampled_end, 0) == 0) delta.erase(0, sampled_end.size());
  return delta;
}

}  // namespace rlx::chat
