// The Jinja engine's tokens and lexer, internal to src/chat: template text becomes text,
// tag delimiters and expression tokens, with the whitespace rules Hugging Face renders
// chat templates under (trim_blocks, lstrip_blocks, `-`/`+` markers, no kept trailing
// newline) applied to the text tokens.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rlx::chat::jinja::detail {

enum class Tok { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type;
  std::string text;
  int line;
  size_t pos = 0;  // byte offset of the token (of its tag for text and delimiters) in the source
};

// The tokens of `source`, ending with Tok::eof; throws TemplateError "NAME:LINE: ..." for an
// unclosed tag, comment or string, or a character no token starts with.
std::vector<Token> lex(std::string_view source, const std::string& name);

}  // namespace rlx::chat::jinja::detail
