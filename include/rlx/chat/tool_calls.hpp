// Tool calls in a sampled assistant text, in the Hermes format that Qwen's chat templates
// prompt for and render back:
//   <tool_call>
//   {"name": "calculator", "arguments": {"expression": "12 * 34"}}
//   </tool_call>
// parse_assistant() turns the text into an OpenAI assistant message: the text outside the
// blocks as "content" (a string, "" when there is none: templates such as Qwen3's test
// `'</think>' in message.content`), each well-formed block as a
// {"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}} entry.
// A block that is not such JSON stays in the content, as the model wrote it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace rlx::chat {

nlohmann::ordered_json parse_assistant(std::string_view text, std::string_view call_id_prefix);

}  // namespace rlx::chat
