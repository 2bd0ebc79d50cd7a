#include "env/math_text.hpp"

#include <algorithm>
#include <cctype>
#include <set>

namespace rlx::env::math {

namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) s.replace(pos, from.size(), to);
  return s;
}

// "√12" -> "\sqrt{12}" (a bare \sqrt takes one digit), "√x" -> "\sqrt x".
std::string unicode_roots(std::string s) {
  static constexpr std::string_view root = "\u221a";
  for (size_t pos = 0; (pos = s.find(root, pos)) != std::string::npos;) {
    size_t end = pos + root.size();
    while (end < s.size() && (is_digit(s[end]) || s[end] == '.')) ++end;
    const std::string digits = s.substr(pos + root.size(), end - pos - root.size());
    const std::string with = digits.empty() ? "\\sqrt " : "\\sqrt{" + digits + "}";
    s.replace(pos, end - pos, with);
    pos += with.size();
  }
  return s;
}

// Unicode that answers are written with, as the ASCII or LaTeX the reader knows.
std::string ascii_math(std::string s) {
  s = unicode_roots(std::move(s));
  static const std::pair<std::string_view, std::string_view> table[] = {
      {"\u2212", "-"},      {"\u2013", "-"},      {"\u00d7", "*"},       {"\u22c5", "*"},    {"\u00b7", "*"},
      {"\u00f7", "/"},      {"\u03c0", "\\pi "},  {"\u221e", "\\infty "},
      {"\u00b0", ""},       {"\u00b2", "^2"},     {"\u00b3", "^3"},      {"\u00a0", " "},    {"\u2264", "\\le "},
      {"\u2265", "\\ge "},  {"\u222a", "\\cup "}, {"\u00bd", "(1/2)"},   {"\u2009", " "},    {"\u202f", ""}};
  for (const auto& [from, to] : table) s = replace_all(std::move(s), from, to);
  return s;
}

// `\text{ cm}` -> ` cm`, and the same for the other wrappers whose content is the answer.
std::string unwrap(std::string s, std::string_view command) {
  const std::string open = std::string(command) + "{";
  for (size_t pos = 0; (pos = s.find(open, pos)) != std::string::npos;) {
    const auto close = matching_brace(s, pos + command.size());
    if (!close) break;
    const std::string inner = s.substr(pos + open.size(), *close - pos - open.size());
    s.replace(pos, *close + 1 - pos, " " + inner);
  }
  return s;
}

std::string drop_latex_noise(std::string s) {
  for (std::string_view w : {"\\boxed", "\\fbox", "\\text", "\\textbf", "\\textit", "\\textrm", "\\mbox", "\\mathrm",
                             "\\mathbf", "\\mathit", "\\operatorname", "\\hbox"})
    s = unwrap(std::move(s), w);
  static const std::pair<std::string_view, std::string_view> literal[] = {
      {"\\\\", " "},   {"\\left.", ""}, {"\\right.", ""}, {"^{\\circ}", ""}, {"^\\circ", ""}, {"\\!", ""},   {"\\,", ""},
      {"\\;", " "},    {"\\:", " "},     {"\\ ", " "},      {"\\%", "%"},    {"\\$", ""},   {"$", ""},
      {"{,}", ""},     {"~", " "}};
  for (const auto& [from, to] : literal) s = replace_all(std::move(s), from, to);
  static const std::pair<std::string_view, std::string_view> commands[] = {
      {"\\left", ""},       {"\\right", ""},    {"\\bigl", ""},     {"\\bigr", ""},      {"\\Bigl", ""},
      {"\\Bigr", ""},       {"\\big", ""},      {"\\Big", ""},      {"\\displaystyle", ""}, {"\\textstyle", ""},
      {"\\quad", " "},      {"\\qquad", " "},   {"\\circ", ""},     {"\\degree", ""},    {"\\dfrac", "\\frac"},
      {"\\tfrac", "\\frac"}, {"\\cfrac", "\\frac"}, {"\\cdot", "*"}, {"\\times", "*"},   {"\\ast", "*"},
      {"\\div", "/"},       {"\\leq", "\\le"},  {"\\geq", "\\ge"},  {"\\emptyset", "\\{\\}"}, {"\\varnothing", "\\{\\}"}};
  for (const auto& [from, to] : commands) s = replace_command(std::move(s), from, to);
  return s;
}

// Whitespace runs as one space, none at the ends.
std::string squeeze(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (is_space(c)) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  return trim(out);
}

bool known_unit(std::string word) {
  static const std::set<std::string> short_units = {"m",  "cm", "mm", "km", "in", "ft", "yd", "mi", "g", "kg",
                                                    "mg", "lb", "oz", "l",  "ml", "s",  "h",  "hr", "sq"};
  std::transform(word.begin(), word.end(), word.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
  return short_units.count(word) > 0;
}

bool function_word(std::string_view w) {
  for (std::string_view f : {"sin", "cos", "tan", "sec", "csc", "cot", "log", "exp", "sqrt", "arcsin", "arccos",
                             "arctan", "abs", "pi"})
    if (w == f) return true;
  return false;
}

// A word that is a unit: letters (or letters/letters, km/h) with an optional ^2 or ^3.
bool unit_token(std::string_view t) {
  if (const auto caret = t.find('^'); caret != std::string_view::npos) {
    const auto power = t.substr(caret + 1);
    if (power != "2" && power != "3" && power != "{2}" && power != "{3}") return false;
    t = t.substr(0, caret);
  }
  if (t.empty() || !std::all_of(t.begin(), t.end(), [](char c) { return is_letter(c) || c == '/'; })) return false;
  if (t.front() == '/' || t.back() == '/') return false;
  if (function_word(t)) return false;
  return t.size() >= 3 || known_unit(std::string(t));
}

// Words inside a unit phrase ("of the cake", "miles per hour"), never its last word.
bool connector(std::string_view w) {
  for (std::string_view c : {"of", "per", "a", "an", "to", "for", "each", "at", "on", "by"})
    if (w == c) return true;
  return false;
}

// Digits with a sign, a point or separators, nothing else: "12", "-3.5", "1,000".
bool plain_number(std::string_view s) {
  return !s.empty() && is_digit(s.back()) &&
         std::all_of(s.begin(), s.end(), [](char c) { return is_digit(c) || c == '.' || c == ',' || c == '-' || c == '+'; });
}

// "12 square feet" -> "12", "5cm" -> "5": trailing unit words after a number-like end. A unit
// of one or two letters (m, h, cm) follows only a plain number: in "\pi r^2 h", h is a variable.
std::string strip_units(std::string s) {
  size_t cut = s.size();
  bool short_unit = false;
  for (;;) {
    size_t start = cut;
    while (start > 0 && s[start - 1] != ' ') --start;
    const std::string_view token(s.data() + start, cut - start);
    const bool last = cut == s.size();
    const bool joins = !last && connector(token);
    if (start == 0 || token.empty() || !(joins || unit_token(token))) break;
    short_unit = short_unit || (!joins && token.substr(0, token.find('^')).size() <= 2);
    cut = start - 1;
  }
  std::string before = trim(std::string_view(s).substr(0, cut));
  const bool number_end = !before.empty() && (is_digit(before.back()) || before.back() == '}' || before.back() == ')');
  if (cut < s.size() && number_end && (!short_unit || plain_number(before))) return before;
  // A unit glued to the number: 5cm, 3.5kg.
  size_t i = s.size();
  while (i > 0 && is_letter(s[i - 1])) --i;
  if (i < s.size() && s.size() - i >= 2 && plain_number(s.substr(0, i)) && known_unit(s.substr(i))) return s.substr(0, i);
  return s;
}

// "1,234,567.5" -> "1234567.5"; anything else unchanged.
std::string drop_thousands(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  size_t run = 0, groups = 0;
  for (; i < s.size() && s[i] != '.'; ++i) {
    if (is_digit(s[i])) {
      ++run;
    } else if (s[i] == ',' && run >= 1 && (groups > 0 ? run == 3 : run <= 3)) {
      run = 0;
      ++groups;
    } else {
      return s;
    }
  }
  if (groups == 0 || run != 3) return s;
  for (size_t j = i + (i < s.size()); j < s.size(); ++j)
    if (!is_digit(s[j])) return s;
  std::string out;
  for (char c : s)
    if (c != ',') out += c;
  return out;
}

// "1.5 million" -> "1.5*10^6": a scale word after a number multiplies it.
std::string scale_words(std::string s) {
  static const std::pair<std::string_view, std::string_view> words[] = {
      {" thousand", "*10^3"}, {" million", "*10^6"}, {" billion", "*10^9"}, {" trillion", "*10^12"}};
  for (const auto& [word, power] : words) {
    for (size_t pos = 0; (pos = s.find(word, pos)) != std::string::npos;) {
      const size_t end = pos + word.size();
      if (pos > 0 && is_digit(s[pos - 1]) && (end == s.size() || !is_letter(s[end]))) {
        s.replace(pos, word.size(), power);
        pos += power.size();
      } else {
        pos = end;
      }
    }
  }
  return s;
}

}  // namespace

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return std::string(s.substr(a, b - a));
}

std::string replace_command(std::string s, std::string_view name, std::string_view with) {
  for (size_t pos = 0; (pos = s.find(name, pos)) != std::string::npos;) {
    const size_t end = pos + name.size();
    if (end < s.size() && is_letter(s[end])) {
      pos = end;
      continue;
    }
    // A space keeps a command that follows from running into what was before: 2\cdot\pi.
    const bool pad = !with.empty() && with.front() == '\\';
    s.replace(pos, name.size(), pad ? std::string(with) + " " : std::string(with));
    pos += with.size();
  }
  return s;
}

std::optional<size_t> matching_brace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;  // \{ and \} are text
      continue;
    }
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return i;
  }
  return std::nullopt;
}

std::vector<std::string> split_top_level(std::string_view s, std::string_view sep) {
  std::vector<std::string> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    // A command separator (\\cup, \\pm) does not match a longer command (\\cupdot).
    const bool whole = sep.front() != '\\' || i + sep.size() >= s.size() || !is_letter(s[i + sep.size()]);
    if (depth == 0 && s.compare(i, sep.size(), sep) == 0 && whole) {
      parts.push_back(trim(s.substr(start, i - start)));
      start = i + sep.size();
      i = start - 1;
    }
  }
  parts.push_back(trim(s.substr(start)));
  return parts;
}

Normalized normalize_answer(std::string_view answer) {
  std::string s = drop_latex_noise(ascii_math(std::string(answer)));
  s = scale_words(replace_all(replace_all(squeeze(s), " and ", ", "), " or ", ", "));
  Normalized out;
  for (int pass = 0; pass < 3; ++pass) {  // "50 %.", "5 cm." : the steps uncover each other
    while (!s.empty() && (s.back() == '.' || s.back() == ',' || s.back() == ';')) s.pop_back();
    s = trim(s);
    if (!s.empty() && s.back() == '%' && split_top_level(s, ",").size() == 1 && split_top_level(s, ";").size() == 1) {
      out.percent = true;
      s = trim(std::string_view(s).substr(0, s.size() - 1));
    }
    s = strip_units(s);
  }
  if (s.size() == 3 && s.front() == '(' && s.back() == ')' && is_letter(s[1])) s = s.substr(1, 1);  // a choice: (B)
  out.text = drop_thousands(s);
  return out;
}

}  // namespace rlx::env::math
