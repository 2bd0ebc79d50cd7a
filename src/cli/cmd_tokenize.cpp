// rlx tokenize --tokenizer FILE TEXT          token ids, space-separated, one line
// rlx tokenize --tokenizer FILE --decode IDS  the text of space- or comma-separated ids
#include <fmt/ranges.h>

#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "rlx/core/error.hpp"
#include "rlx/model/tokenizer.hpp"

namespace rlx::cli {

void add_tokenize_command(CLI::App& app, Action& action) {
  struct Args {
    std::string tokenizer;
    std::vector<std::string> text;
    bool decode = false, no_special = false, add_special = false, skip_special = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json or rlx char tokenizer file")->required();
  cmd->add_option("text", a->text, "text to encode (several arguments are joined by spaces), or ids with --decode")->required();
  cmd->add_flag("--decode", a->decode, "decode token ids instead");
  cmd->add_flag("--no-special", a->no_special, "treat special-token text as plain text");
  cmd->add_flag("--add-special", a->add_special, "apply the post-processor template (e.g. BOS)");
  cmd->add_flag("--skip-special", a->skip_special, "when decoding, drop special tokens");
  cmd->callback([a, &action] {
    action = [a] {
      auto tok = load_tokenizer(a->tokenizer);
      std::string joined;
      for (size_t i = 0; i < a->text.size(); ++i) joined += (i ? " " : "") + a->text[i];
      if (a->decode) {
        std::vector<TokenId> ids;
        std::string s = joined;
        for (char& c : s) if (c == ',') c = ' ';
        std::istringstream in(s);
        std::string word;
        while (in >> word) {
          size_t used = 0;
          long long v = 0;
          try {
            v = std::stoll(word, &used);
          } catch (const std::exception&) {
          }
          RLX_CHECK(used == word.size() && used > 0, "--decode: '{}' is not a token id", word);
          ids.push_back(static_cast<TokenId>(v));
        }
        std::cout << tok->decode(ids, a->skip_special) << "\n";
      } else {
        auto ids = tok->encode(joined, {.add_special_tokens = a->add_special, .parse_special = !a->no_special});
        std::cout << fmt::format("{}\n", fmt::join(ids, " "));
      }
      return 0;
    };
  });
}

}  // namespace rlx::cli
