#include "rlx/chat/tool_calls.hpp"

#include <fmt/format.h>

#include "rlx/core/json.hpp"

namespace rlx::chat {

nlohmann::ordered_json parse_assistant(std::string_view text, std::string_view call_id_prefix) {
  using json = nlohmann::ordered_json;
  static constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  json calls = json::array();
  std::string content;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t open = text.find(kOpen, pos);
    size_t close = open == std::string_view::npos ? open : text.find(kClose, open + kOpen.size());
    if (close == std::string_view::npos) {
      content.append(text.substr(pos));
      break;
    }
    std::string_view inner = text.substr(open + kOpen.size(), close - open - kOpen.size());
    json call;  // bounded: what the model wrote is input like any other
    try {
      call = parse_json<json>(inner, "a tool call");
    } catch (const JsonError&) {
      call = json();  // not JSON, or nested too deep: not a call
    }
    bool ok = call.is_object() && call.contains("name") && call["name"].is_string() &&
              (!call.contains("arguments") || call["arguments"].is_object() || call["arguments"].is_string());
    if (!ok) {  // not a call: the model's text, kept
      content.append(text.substr(pos, close + kClose.size() - pos));
      pos = close + kClose.size();
      continue;
    }
    content.append(text.substr(pos, open - pos));
    json args = call.contains("arguments") ? call["arguments"] : json::object();
    calls.push_back({{"id", fmt::format("{}{}", call_id_prefix, calls.size())},
                     {"type", "function"},
                     {"function", {{"name", call["name"]}, {"arguments", args.is_string() ? args.get<std::string>() : args.dump()}}}});
    pos = close + kClose.size();
  }
  // The template puts a newline between the content and each call; it is not content.
  if (!calls.empty())
    while (!content.empty() && (content.back() == '\n' || content.back() == ' ')) content.pop_back();
  json message = {{"role", "assistant"}};
  message["content"] = content;  // "" rather than null with calls: templates test `in message.content`
  if (!calls.empty()) message["tool_calls"] = calls;
  return message;
}

}  // namespace rlx::chat
