#include "rlx/env/math_answer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

#include "env/math_text.hpp"
#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"

namespace rlx::env::math {

namespace {

bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// The content of the last \boxed{...} / \fbox{...} that is closed; `\boxed 5` takes one token.
std::optional<std::string> last_boxed(std::string_view s) {
  std::vector<std::pair<size_t, size_t>> at;  // position, command length
  for (std::string_view cmd : {"\\boxed", "\\fbox"})
    for (size_t p = s.find(cmd); p != std::string_view::npos; p = s.find(cmd, p + 1)) at.emplace_back(p, cmd.size());
  std::sort(at.rbegin(), at.rend());
  for (const auto& [pos, len] : at) {
    size_t i = pos + len;
    if (i < s.size() && s[i] == '{') {
      if (auto close = matching_brace(s, i)) return std::string(s.substr(i + 1, *close - i - 1));
      continue;  // cut off before its '}' (a truncated response): an earlier one may be whole
    }
    if (i >= s.size() || s[i] != ' ') continue;  // \boxedfoo is another command
    while (i < s.size() && s[i] == ' ') ++i;
    size_t end = i;
    while (end < s.size() && !std::isspace(static_cast<unsigned char>(s[end])) && s[end] != '$') ++end;
    if (end > i) return std::string(s.substr(i, end - i));
  }
  return std::nullopt;
}

std::optional<std::string> after_hashes(std::string_view s) {
  const auto pos = s.rfind("####");
  if (pos == std::string_view::npos) return std::nullopt;
  auto rest = s.substr(pos + 4);
  std::string line = trim(rest.substr(0, rest.find('\n')));
  if (line.empty()) return std::nullopt;
  return line;
}

// "The answer is $\frac{1}{2}$." / "**Answer:** 42" -> the answer's text.
std::optional<std::string> answer_is(std::string_view s) {
  std::string lower(s);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
  size_t best = std::string::npos, len = 0;
  for (std::string_view phrase : {"answer is", "answer:"}) {
    const auto p = lower.rfind(phrase);
    if (p != std::string::npos && (best == std::string::npos || p > best)) best = p, len = phrase.size();
  }
  if (best == std::string::npos) return std::nullopt;
  std::string_view rest = s.substr(best + len);
  rest = rest.substr(0, rest.find('\n'));
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == ':' || rest.front() == '*')) rest.remove_prefix(1);
  if (!rest.empty() && rest.front() == '$') {  // inline math: up to the closing dollar
    const size_t skip = rest.rfind("$$", 0) == 0 ? 2 : 1;
    const auto close = rest.find('$', skip);
    if (close != std::string_view::npos) rest = rest.substr(skip, close - skip);
  }
  for (size_t i = 0; i + 1 < rest.size(); ++i)  // the sentence ends at ". " (not at 3.5)
    if (rest[i] == '.' && rest[i + 1] == ' ') rest = rest.substr(0, i);
  std::string out = trim(rest);
  while (!out.empty() && (out.back() == '*' || out.back() == '.')) out.pop_back();
  if (out.empty() || out.size() > 300) return std::nullopt;
  return out;
}

// The last number: -3, 1,234.5, .5, 3/4 (a '-' counts after a space or a bracket, not in 5-3).
std::optional<std::string> last_number(std::string_view s) {
  std::optional<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const bool starts = is_digit(s[i]) || (s[i] == '.' && i + 1 < s.size() && is_digit(s[i + 1]));
    if (!starts) {
      ++i;
      continue;
    }
    size_t start = i;
    if (start > 0 && s[start - 1] == '-' && (start < 2 || (!is_alnum(s[start - 2]) && s[start - 2] != ')'))) --start;
    size_t j = i;
    auto digits = [&] {
      while (j < s.size() && is_digit(s[j])) ++j;
    };
    digits();
    auto thousands = [&] {  // 1,234,567: a comma, then exactly three digits
      return j + 4 <= s.size() && s[j] == ',' && is_digit(s[j + 1]) && is_digit(s[j + 2]) && is_digit(s[j + 3]) &&
             (j + 4 == s.size() || !is_digit(s[j + 4]));
    };
    while (thousands()) j += 4;
    if (j + 1 < s.size() && s[j] == '.' && is_digit(s[j + 1])) ++j, digits();
    if (j + 1 < s.size() && s[j] == '/' && is_digit(s[j + 1])) ++j, digits();
    out = std::string(s.substr(start, j - start));
    i = j;
  }
  return out;
}

template <class T>
T number_option(const nlohmann::json& o, const char* key, T fallback, double lo, double hi, bool lo_open) {
  if (!o.contains(key)) return fallback;
  const auto& v = o.at(key);
  RLX_CHECK(v.is_number(), "math option '{}': expected a number, got {}", key, v.dump());
  const double x = v.get<double>();
  RLX_CHECK((lo_open ? x > lo : x >= lo) && x <= hi, "math option '{}': {} is outside {}{}, {}]", key, x,
            lo_open ? "(" : "[", lo, hi);
  return static_cast<T>(x);
}

std::vector<Extractor> extractors(const nlohmann::json& v) {
  std::vector<std::string> names;
  if (v.is_string()) {
    for (const auto& n : split_top_level(v.get<std::string>(), ","))
      if (!n.empty()) names.push_back(n);
  } else {
    RLX_CHECK(v.is_array(), "math option 'extract': expected a list of extractor names, got {}", v.dump());
    for (const auto& n : v) {
      RLX_CHECK(n.is_string(), "math option 'extract': expected names, got {}", n.dump());
      names.push_back(n.get<std::string>());
    }
  }
  std::vector<Extractor> out;
  for (const auto& n : names) {
    const auto e = config::enum_from_string<Extractor>(n);
    RLX_CHECK(e, "math option 'extract': unknown extractor '{}' (known: {})", n,
              fmt::join(config::enum_name_list<Extractor>(), ", "));
    out.push_back(*e);
  }
  RLX_CHECK(!out.empty(), "math option 'extract': no extractor named");
  return out;
}

}  // namespace

std::optional<Extracted> extract_answer(std::string_view response, std::span<const Extractor> order) {
  for (const Extractor e : order) {
    std::optional<std::string> found;
    switch (e) {
      case Extractor::boxed: found = last_boxed(response); break;
      case Extractor::hash: found = after_hashes(response); break;
      case Extractor::answer_is: found = answer_is(response); break;
      case Extractor::last_number: found = last_number(response); break;
    }
    if (found && !trim(*found).empty()) return Extracted{std::move(*found), e};
  }
  return std::nullopt;
}

std::string reference_answer(std::string_view reference) {
  if (auto hashed = after_hashes(reference)) return *hashed;
  if (auto boxed = last_boxed(reference)) return *boxed;
  return trim(reference);
}

ScoreOptions ScoreOptions::from_json(const nlohmann::json& o) {
  ScoreOptions s;
  if (o.is_null()) return s;
  RLX_CHECK(o.is_object(), "math options: expected an object, got {}", o.dump());
  if (o.contains("extract")) s.extract = extractors(o.at("extract"));
  s.format_reward = number_option(o, "format_reward", s.format_reward, 0, 0.999999, false);
  s.verify.rel_tol = number_option(o, "rel_tol", s.verify.rel_tol, 0, 0.1, true);
  s.verify.time_limit_s = number_option(o, "time_limit_s", s.verify.time_limit_s, 0, 60, true);
  return s;
}

Score score_response(std::string_view response, std::string_view reference, const ScoreOptions& options) {
  Score s;
  s.extracted = extract_answer(response, options.extract);
  if (!s.extracted) return s;  // unextracted
  const Check c = check_equal(s.extracted->text, reference, options.verify);
  switch (c.verdict) {
    case Verdict::equal: s.outcome = Outcome::correct; break;
    case Verdict::different: s.outcome = Outcome::wrong; break;
    case Verdict::unparsed: s.outcome = Outcome::unparsed; break;
    case Verdict::limit: s.outcome = Outcome::limit; break;
  }
  s.detail = c.detail;
  const bool marked = s.extracted->by != Extractor::last_number;
  s.reward = s.outcome == Outcome::correct ? 1.0 : marked ? options.format_reward : 0.0;
  return s;
}

}  // namespace rlx::env::math
