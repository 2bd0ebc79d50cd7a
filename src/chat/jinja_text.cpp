// Python's text rules (jinja_text.hpp): float and string repr, json.dumps as Hugging Face's
// `tojson` calls it, UTF-8 code points, str.find in linear time, and str.upper()/str.lower().
// Inside a render, their work is charged to the render's budget (jinja_budget.hpp), and what
// they build is checked against it as it grows.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "chat/jinja_budget.hpp"
#include "chat/jinja_text.hpp"
#include "rlx/chat/jinja.hpp"

namespace rlx::chat::jinja {

using detail::charge_scan;
using detail::charge_steps;
using detail::check_size;

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(r.ptr - buf));
  std::string sign;
  if (s.front() == '-') {
    sign = "-";
    s.remove_prefix(1);
  }
  auto e_pos = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e_pos))
    if (c != '.') digits += c;
  int exp = std::stoi(std::string(s.substr(e_pos + 1)));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    return fmt::format("{}{}e{}{:02d}", sign, m, exp < 0 ? '-' : '+', std::abs(exp));
  }
  if (exp >= 0) {
    auto int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
    return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
  }
  return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
}

namespace {
// For loops that append to `out` a piece per input byte: its size is checked once per 64 KiB.
void check_growing(const std::string& out, size_t i, const char* what) {
  if ((i & 0xFFFF) == 0) check_size(out.size(), what);
}
}  // namespace

void python_repr_to(std::string& out, std::string_view s) {
  charge_scan(s.size());
  char quote = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) quote = '"';
  out += quote;
  for (size_t i = 0; i < s.size(); ++i) {
    check_growing(out, i, "a printed string");
    char c = s[i];
    auto u = static_cast<unsigned char>(c);
    if (c == '\\')
      out += "\\\\";
    else if (c == quote)
      out += fmt::format("\\{}", c);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  out += quote;
}

std::string python_repr(std::string_view s) {
  std::string out;
  python_repr_to(out, s);
  return out;
}

size_t code_point_length(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

std::vector<size_t> code_points(std::string_view s) {
  detail::charge_allocation((s.size() + 1) * sizeof(size_t));
  std::vector<size_t> starts;
  starts.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); i += static_cast<unsigned char>(s[i]) < 0x80 ? 1 : code_point_length(s, i))
    starts.push_back(i);
  starts.push_back(s.size());
  return starts;
}

size_t count_code_points(std::string_view s) {
  charge_scan(s.size());
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += static_cast<unsigned char>(s[i]) < 0x80 ? 1 : code_point_length(s, i)) ++n;
  return n;
}

size_t find_text(std::string_view haystack, std::string_view needle, size_t from) {
  if (from > haystack.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  // glibc's memmem is linear in the worst case (Two-Way); std::string::find is not.
  const void* at = memmem(haystack.data() + from, haystack.size() - from, needle.data(), needle.size());
  size_t found = at ? static_cast<size_t>(static_cast<const char*>(at) - haystack.data()) : std::string_view::npos;
  charge_scan((at ? found + needle.size() : haystack.size()) - from);
  return found;
}

namespace {
// Simple case mappings of the Latin-1, Latin Extended-A, Greek and Cyrillic letters; other
// code points map to themselves.
uint32_t to_upper_cp(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
    bool odd_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_is_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 0x20;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  return c;
}
uint32_t to_lower_cp(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
    bool odd_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_is_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  return c;
}

std::string map_case(std::string_view s, uint32_t (*f)(uint32_t)) {
  std::string out;
  out.reserve(s.size());
  auto cps = code_points(s);
  for (size_t i = 0; i + 1 < cps.size(); ++i) {
    size_t len = cps[i + 1] - cps[i];
    auto u = static_cast<unsigned char>(s[cps[i]]);
    if (len == 1) {
      out += static_cast<char>(u < 0x80 ? f(u) : u);
      continue;
    }
    uint32_t cp = len == 2 ? (u & 0x1Fu) : len == 3 ? (u & 0x0Fu) : (u & 0x07u);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[cps[i] + k]) & 0x3Fu);
    uint32_t m = f(cp);
    if (m == cp || m < 0x80 || m >= 0x800) {
      out.append(s.substr(cps[i], len));
      continue;
    }
    out += static_cast<char>(0xC0 | (m >> 6));
    out += static_cast<char>(0x80 | (m & 0x3F));
  }
  return out;
}
}  // namespace

std::string py_upper(std::string_view s) { return map_case(s, to_upper_cp); }
std::string py_lower(std::string_view s) { return map_case(s, to_lower_cp); }

namespace {
void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  charge_scan(s.size());
  auto cps = ensure_ascii ? code_points(s) : std::vector<size_t>{};
  for (size_t i = 0; i < s.size(); ++i) {
    check_growing(out, i, "a JSON string");
    char c = s[i];
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        auto u = static_cast<unsigned char>(c);
        if (u < 0x20) {
          out += fmt::format("\\u{:04x}", u);
        } else if (u >= 0x80 && ensure_ascii) {
          auto it = std::upper_bound(cps.begin(), cps.end(), i);
          size_t end = *it, len = end - i;
          uint32_t cp = len == 2 ? (u & 0x1Fu) : len == 3 ? (u & 0x0Fu) : len == 4 ? (u & 0x07u) : u;
          for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
          if (cp >= 0x10000) {
            cp -= 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", cp);
          }
          i = end - 1;
        } else {
          out += c;
        }
      }
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  auto newline = [&](int d) {
    if (style.indent >= 0) out += "\n" + std::string(static_cast<size_t>(style.indent * d), ' ');
  };
  const std::string& item_sep = style.item_separator;
  switch (v.kind()) {
    case Value::Kind::none:
      out += "null";
      return;
    case Value::Kind::boolean:
      out += v.boolean() ? "true" : "false";
      return;
    case Value::Kind::integer:
      out += std::to_string(v.integer());
      return;
    case Value::Kind::floating: {
      double d = v.number();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d < 0 ? "-Infinity" : "Infinity";
      else
        out += python_float(d);
      return;
    }
    case Value::Kind::string:
      json_string(out, v.string(), style.ensure_ascii);
      return;
    case Value::Kind::list: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      charge_steps(static_cast<int64_t>(v.list().size()));
      out += "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_dump(out, v.list()[i], style, depth + 1);
        check_size(out.size(), "a JSON text");
      }
      newline(depth);
      out += "]";
      return;
    }
    case Value::Kind::dict: {
      const auto& items = v.dict().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      charge_steps(static_cast<int64_t>(items.size()));
      std::vector<size_t> order(items.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      if (style.sort_keys)
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return items[a].first < items[b].first; });
      out += "{";
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_string(out, items[order[i]].first, style.ensure_ascii);
        out += style.key_separator;
        json_dump(out, items[order[i]].second, style, depth + 1);
        check_size(out.size(), "a JSON text");
      }
      newline(depth);
      out += "}";
      return;
    }
    case Value::Kind::undefined:
      throw TemplateError(fmt::format("tojson: '{}' is undefined", v.name()));
    case Value::Kind::function:
      throw TemplateError(fmt::format("tojson: a function ({}) is not JSON serializable", v.name()));
  }
}
}  // namespace

std::string json_dumps(const Value& v, const JsonStyle& style) {
  JsonStyle s = style;
  if (s.item_separator.empty()) s.item_separator = s.indent >= 0 ? "," : ", ";
  if (s.key_separator.empty()) s.key_separator = ": ";
  std::string out;
  json_dump(out, v, s, 0);
  return out;
}

}  // namespace rlx::chat::jinja
