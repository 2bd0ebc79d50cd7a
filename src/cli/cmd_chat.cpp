// rlx chat render --tokenizer-dir DIR --messages FILE.json [--tools FILE.json] [--var K=JSON]...
//   The conversation rendered by the model's chat template, as transformers'
//   apply_chat_template renders it, then its token ids (the template's special tokens are
//   parsed, none is added). --json prints {"text": ..., "ids": [...]} instead.
#include <fmt/ranges.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "rlx/chat/chat_template.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/model/tokenizer.hpp"

namespace rlx::cli {
namespace {

nlohmann::ordered_json read_json_file(const std::string& file, const char* what) {
  const std::string text = read_file(file, 64ull << 20);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    RLX_CHECK(false, "{}: {} is not valid JSON: {}", what, file, e.what());
  }
  return nullptr;
}

}  // namespace

void add_chat_commands(CLI::App& app, Action& action) {
  struct Args {
    std::string dir, messages, tools;
    std::vector<std::string> vars;
    bool no_generation_prompt = false, as_json = false;
  };
  auto a = std::make_shared<Args>();
  auto* chat = app.add_subcommand("chat", "Chat templates");
  chat->require_subcommand(1);
  auto* render = chat->add_subcommand("render", "Render a conversation with a model's chat template; print the text and its token ids");
  render->add_option("--tokenizer-dir", a->dir, "directory with tokenizer.json and tokenizer_config.json (or chat_template.jinja)")->required();
  render->add_option("--messages", a->messages, "JSON file: a list of {role, content, ...} messages")->required();
  render->add_option("--tools", a->tools, "JSON file: a list of tool schemas");
  render->add_option("--var", a->vars, "an extra template variable, NAME=JSON (e.g. enable_thinking=false)");
  render->add_flag("--no-generation-prompt", a->no_generation_prompt, "do not open an assistant turn at the end");
  render->add_flag("--json", a->as_json, "print {\"text\": ..., \"ids\": [...]}");
  render->callback([a, &action] {
    action = [a] {
      auto tpl = chat::ChatTemplate::load(a->dir);
      chat::RenderOptions options;
      options.add_generation_prompt = !a->no_generation_prompt;
      if (!a->tools.empty()) options.tools = read_json_file(a->tools, "--tools");
      for (const auto& v : a->vars) {
        auto eq = v.find('=');
        RLX_CHECK(eq != std::string::npos && eq > 0, "--var {}: expected NAME=JSON", v);
        try {
          options.kwargs[v.substr(0, eq)] = nlohmann::ordered_json::parse(v.substr(eq + 1));
        } catch (const nlohmann::json::parse_error&) {
          options.kwargs[v.substr(0, eq)] = v.substr(eq + 1);  // a bare word is a string
        }
      }
      std::string text = tpl.render(read_json_file(a->messages, "--messages"), options);
      auto tok = load_tokenizer(std::filesystem::path(a->dir) / "tokenizer.json");
      auto ids = tok->encode(text, {.add_special_tokens = false, .parse_special = true});
      if (a->as_json) {
        nlohmann::ordered_json out = {{"text", text}, {"ids", ids}};
        std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      } else {
        std::cout << text << "\n--- " << ids.size() << " tokens\n" << fmt::format("{}\n", fmt::join(ids, " "));
      }
      return 0;
    };
  });
}

}  // namespace rlx::cli
