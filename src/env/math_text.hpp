// Text steps of the math answer checker (math_verify.hpp): an answer's canonical text
// before it is read (LaTeX noise, Unicode, units, thousands separators, percent), and the
// bracket-aware helpers the extraction and the reader share.
//
//   math::Normalized n = math::normalize_answer("\\$1{,}250.00\\text{ dollars}");
//   // n.text == "1250.00", n.percent == false
//   math::normalize_answer("12.5\\%").percent;  // true, text "12.5"
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::env::math {

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

struct Normalized {
  std::string text;
  bool percent = false;  // the answer ended with a percent sign (removed from text)
};

Normalized normalize_answer(std::string_view answer);

// The index of the '}' that closes the '{' at `open` (braces after a backslash, `\{`, are
// text, not grouping), or nullopt when it is not closed.
std::optional<size_t> matching_brace(std::string_view s, size_t open);

// `s` split at each `sep` outside brackets ( ), [ ], { }; parts trimmed.
std::vector<std::string> split_top_level(std::string_view s, std::string_view sep);

std::string trim(std::string_view s);
// Replaces the LaTeX command `name` (with its backslash, e.g. "\\left") where no letter
// follows it, so that "\\le" does not match "\\left".
std::string replace_command(std::string s, std::string_view name, std::string_view with);

}  // namespace rlx::env::math
