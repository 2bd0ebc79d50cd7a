// A model's chat template, rendered as Hugging Face `transformers`' apply_chat_template
// renders it: the Jinja `chat_template` of a tokenizer directory (chat_template.jinja, or
// tokenizer_config.json's "chat_template": a string, or named templates where "tool_use" is
// picked when tools are given), with `messages`, `tools`, `documents`,
// `add_generation_prompt`, the special tokens of tokenizer_config.json and any extra
// variables (e.g. `enable_thinking`).
//
//   auto tpl = rlx::chat::ChatTemplate::load("Qwen3-0.6B");
//   std::string text = tpl.render(R"([{"role": "user", "content": "Hi"}])"_json);
//   // "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
//
// Multi-turn episodes never re-render what was sampled: `TurnDelta` gives the text that
// follows an assistant turn's sampled tokens when new messages (tool results, a user turn)
// arrive, so that a conversation's tokens are the exact sampled tokens with each new turn's
// tokens appended (see docs/CHAT.md for what the learner trains on).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "rlx/chat/jinja.hpp"

namespace rlx::chat {

struct RenderOptions {
  bool add_generation_prompt = true;
  nlohmann::ordered_json tools;   // null: no tools (the template sees `tools` = none)
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra variables
  // Bounds on the render (a model's template is untrusted); a server sets `limits.deadline`
  // to its request's deadline: past it the render throws jinja::LimitError whose limit() is
  // "deadline".
  jinja::RenderLimits limits;
};

class ChatTemplate {
 public:
  // Reads DIR/chat_template.jinja if present, else DIR/tokenizer_config.json. Throws
  // rlx::Error naming the file when there is no template or it does not parse.
  static ChatTemplate load(const std::filesystem::path& tokenizer_dir);
  // `config`: a tokenizer_config.json's content; `source`: names it in errors.
  static ChatTemplate from_config(const nlohmann::ordered_json& config, const std::string& source);
  static ChatTemplate from_source(const std::string& template_source, const nlohmann::ordered_json& config,
                                 const std::string& source);

  // Checks `messages` (see check_messages) and renders. Errors name the message or the
  // template line; messages, tools or kwargs nested deeper than jinja::Value::kMaxDepth are
  // errors, as is a bound of options.limits reached (jinja::LimitError).
  std::string render(const nlohmann::ordered_json& messages, const RenderOptions& options = {}) const;

  // The special tokens the template sees (bos_token, eos_token, ...), by name.
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  std::optional<jinja::Template> default_, tool_use_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

// An OpenAI-style message list: an array of objects, each with a string "role"; "content" a
// string, null or an array of parts; "tool_calls" an array of objects with a "function"
// holding a string "name". Throws rlx::Error naming the message index and field.
void check_messages(const nlohmann::ordered_json& messages);

// The text a template puts after an assistant turn's content and before the next turn, split
// around the end-of-turn text the model samples (e.g. "<|im_end|>" + "\n").
struct TurnDelta {
  // `new_messages` (tool results, a user turn) rendered after a finished assistant turn, with
  // the generation prompt for the next assistant turn: what to append after the sampled
  // tokens. `sampled_end` is the text the sampled tokens ended with (the stop token's text,
  // or "" when generation stopped for length); the part of the assistant turn's closing
  // text that was not sampled comes first.
  static std::string after_assistant(const ChatTemplate& tpl, const nlohmann::ordered_json& new_messages,
                                     const std::string& sampled_end, const RenderOptions& options = {});
};

}  // namespace rlx::chat
