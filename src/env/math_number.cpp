#include "env/math_number.hpp"
#include "env/math_text.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>

namespace rlx::env::math {

namespace {


size_t skip_spaces(std::string_view s, size_t p) {
  while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
  return p;
}

double to_double(std::string_view digits) {
  double v = 0;
  const auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  return res.ec == std::errc() ? v : std::numeric_limits<double>::infinity();
}

// A command's argument of digits: {12} or one digit (`\overline 3`, `\frac12`); `p` moves past it.
std::optional<std::string_view> digit_arg(std::string_view s, size_t& p) {
  size_t q = skip_spaces(s, p);
  const bool braced = q < s.size() && s[q] == '{';
  if (braced) q = skip_spaces(s, q + 1);
  const size_t a = q;
  while (q < s.size() && is_digit(s[q]) && (braced || q == a)) ++q;
  if (q == a) return std::nullopt;
  const auto digits = s.substr(a, q - a);
  if (braced) {
    q = skip_spaces(s, q);
    if (q >= s.size() || s[q] != '}') return std::nullopt;
    ++q;
  }
  p = q;
  return digits;
}

// `0.1\overline{6}` is 0.1666...: the digits under the bar repeat after `literal`.
std::optional<Scanned> repeating(std::string_view s, std::string_view literal, size_t pos) {
  size_t p = skip_spaces(s, pos);
  if (!command_at(s, p, "overline")) return std::nullopt;
  p += 1 + std::string_view("overline").size();
  const auto period = digit_arg(s, p);
  const size_t k = literal.size() - literal.find('.') - 1;
  if (!period || period->size() > 15 || k > 15) return std::nullopt;
  const double scale = (std::pow(10.0, static_cast<double>(period->size())) - 1) * std::pow(10.0, static_cast<double>(k));
  return Scanned{to_double(literal) + to_double(*period) / scale, p, false};
}

}  // namespace

bool command_at(std::string_view s, size_t pos, std::string_view name) {
  if (pos >= s.size() || s[pos] != '\\' || s.compare(pos + 1, name.size(), name) != 0) return false;
  const size_t end = pos + 1 + name.size();
  return end >= s.size() || !std::isalpha(static_cast<unsigned char>(s[end]));
}

std::optional<Scanned> read_number(std::string_view s, size_t pos) {
  size_t p = pos;
  while (p < s.size() && is_digit(s[p])) ++p;
  bool whole = true;
  if (p < s.size() && s[p] == '.') {
    whole = false;
    ++p;
    while (p < s.size() && is_digit(s[p])) ++p;
    if (p == pos + 1) return std::nullopt;  // a lone '.'
    if (auto r = repeating(s, s.substr(pos, p - pos), p)) return r;
  }
  if (p < s.size() && (s[p] == 'e' || s[p] == 'E')) {  // scientific notation only with digits after: 2e3, not 2e
    size_t q = p + 1;
    if (q < s.size() && (s[q] == '+' || s[q] == '-')) ++q;
    if (q < s.size() && is_digit(s[q])) {
      p = q;
      while (p < s.size() && is_digit(s[p])) ++p;
      whole = false;
    }
  }
  return Scanned{to_double(s.substr(pos, p - pos)), p, whole};
}

std::optional<Scanned> read_whole_fraction(std::string_view s, size_t pos) {
  size_t p = skip_spaces(s, pos);
  for (std::string_view name : {"frac", "dfrac", "tfrac"}) {
    if (!command_at(s, p, name)) continue;
    p += 1 + name.size();
    const auto a = digit_arg(s, p);
    if (!a) return std::nullopt;
    const auto b = digit_arg(s, p);
    if (!b) return std::nullopt;
    return Scanned{to_double(*a) / to_double(*b), p, false};
  }
  return std::nullopt;
}

}  // namespace rlx::env::math
