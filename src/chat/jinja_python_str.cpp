// The Jinja engine's str values as Python has them: strip, split, replace and case by code point
// where Python counts code points, HTML escaping, and the methods a template calls on a string
// (s.split(), s.startswith(), ...). Their work is charged to the render's budget: a step per
// kBytesPerStep bytes scanned, and what they build checked before it is built.
#include <algorithm>
#include <cctype>
#include <map>

#include "chat/jinja_eval.hpp"
#include "chat/jinja_text.hpp"

namespace rlx::chat::jinja::detail {

std::string lower(const std::string& s) { return py_lower(s); }
std::string upper(const std::string& s) { return py_upper(s); }
bool py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

// str.strip/lstrip/rstrip: whitespace, or any of the code points of `chars`.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<std::string_view> set;  // sorted: a lookup per code point stripped
  bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) {
    if (!chars.is_string()) fail(fmt::format("strip arg must be None or str, not {}", chars.type_name()));
    const std::string& c = chars.string();
    auto cps = code_points(c);
    for (size_t i = 0; i + 1 < cps.size(); ++i) set.emplace_back(c.data() + cps[i], cps[i + 1] - cps[i]);
    std::sort(set.begin(), set.end());
  }
  auto cps = code_points(s);
  size_t b = 0, e = cps.size() - 1;
  auto strippable = [&](size_t i) {
    std::string_view c(s.data() + cps[i], cps[i + 1] - cps[i]);
    if (ws) return c.size() == 1 && py_space(c[0]);
    return std::binary_search(set.begin(), set.end(), c);
  };
  if (left)
    while (b < e && strippable(b)) ++b;
  if (right)
    while (e > b && strippable(e - 1)) --e;
  return s.substr(cps[b], cps[e] - cps[b]);
}

Value py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  Value::List out;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace separate; leading and trailing whitespace give no empty strings.
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < s.size();) {
      while (i < s.size() && py_space(s[i])) ++i;
      if (i >= s.size()) break;
      size_t j = i;
      while (j < s.size() && !py_space(s[j])) ++j;
      check_items(words.size() + 1, "the list str.split() makes");
      words.emplace_back(i, j);
      i = j;
    }
    charge_scan(s.size());
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        auto rest = py_strip(s.substr(words[static_cast<size_t>(maxsplit)].first), Value::none(), false, true);
        words.resize(static_cast<size_t>(maxsplit));
        for (auto [a, b] : words) out.emplace_back(s.substr(a, b - a));
        out.emplace_back(rest);
      } else {
        size_t keep = words.size() - static_cast<size_t>(maxsplit);
        out.emplace_back(py_strip(s.substr(0, words[keep - 1].second), Value::none(), true, false));
        for (size_t k = keep; k < words.size(); ++k)
          out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      }
      return Value(std::move(out));
    }
    for (auto [a, b] : words) out.emplace_back(s.substr(a, b - a));
    return Value(std::move(out));
  }
  if (!sep.is_string()) fail(fmt::format("must be str or None, not {}", sep.type_name()));
  const std::string& d = sep.string();
  if (d.empty()) fail("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      size_t at = find_text(s, d, start);
      if (at == std::string::npos) break;
      check_items(parts.size() + 2, "the list str.split() makes");
      parts.push_back(s.substr(start, at - start));
      start = at + d.size();
    }
    parts.push_back(s.substr(start));
  } else {
    // The last separator before `end` is the first of the reversed separator in the reversed
    // string after its mirror: found in linear time, as rfind would not be.
    std::string rs(s.rbegin(), s.rend()), rd(d.rbegin(), d.rend());
    charge_allocation(rs.size() + rd.size());
    size_t done = 0;  // bytes of rs (the end of s) split off
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      size_t at = find_text(rs, rd, done);
      if (at == std::string::npos) break;
      check_items(parts.size() + 2, "the list str.rsplit() makes");
      parts.push_back(s.substr(s.size() - at, at - done));
      done = at + d.size();
    }
    parts.push_back(s.substr(0, s.size() - done));
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value(std::move(out));
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between characters (and at both ends).
    auto cps = code_points(s);
    int64_t n = 0;
    for (size_t i = 0; i + 1 < cps.size(); ++i) {
      if (count < 0 || n < count) {
        check_size(out.size() + to.size(), "a string made by replace()");
        out += to;
        ++n;
      }
      out.append(s, cps[i], cps[i + 1] - cps[i]);
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t start = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    size_t at = find_text(s, from, start);
    if (at == std::string::npos) break;
    check_size(out.size() + (at - start) + to.size(), "a string made by replace()");
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
  }
  check_size(out.size() + (s.size() - start), "a string made by replace()");
  out.append(s, start);
  return out;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  return upper(s.substr(0, 1)) + lower(s.substr(1));
}

// Python's str.title(): a letter after a non-letter is upper-cased, other letters lower-cased.
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_letter = false;
  for (char& c : out) {
    bool letter = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (letter)
      c = static_cast<char>(prev_letter ? std::tolower(static_cast<unsigned char>(c))
                                        : std::toupper(static_cast<unsigned char>(c)));
    prev_letter = letter || (static_cast<unsigned char>(c) >= 0x80 && prev_letter);
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((i & 0xFFFF) == 0) check_size(out.size(), "an escaped string");
    char c = s[i];
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// ---- string methods
namespace {

using StrMethodTable = std::map<std::string, MethodFn, std::less<>>;

// str methods that look for a substring: at either end, where it first is, how often.
void add_search_methods(StrMethodTable& table) {
  table.insert({
      {"startswith",
       [](const Value& s, Arguments& a) -> Value {
         a.check(1, {});
         Value p = a.get(0, "prefix");
         auto test = [&](const Value& x) { return s.string().rfind(need_string(x, "startswith"), 0) == 0; };
         if (p.is_list()) return Value(std::any_of(p.list().begin(), p.list().end(), test));
         return Value(test(p));
       }},
      {"endswith",
       [](const Value& s, Arguments& a) -> Value {
         a.check(1, {});
         Value p = a.get(0, "suffix");
         auto test = [&](const Value& x) {
           const std::string& suf = need_string(x, "endswith");
           return s.string().size() >= suf.size() &&
                  s.string().compare(s.string().size() - suf.size(), suf.size(), suf) == 0;
         };
         if (p.is_list()) return Value(std::any_of(p.list().begin(), p.list().end(), test));
         return Value(test(p));
       }},
      {"find",
       [](const Value& s, Arguments& a) -> Value {
         a.check(1, {});
         const std::string sub = need_string(a.get(0, "sub"), "find");  // a copy: get() returns a temporary
         auto at = find_text(s.string(), sub);
         if (at == std::string::npos) return Value(-1);
         return Value(static_cast<int64_t>(count_code_points(std::string_view(s.string()).substr(0, at))));
       }},
      {"count",
       [](const Value& s, Arguments& a) -> Value {
         a.check(1, {});
         const std::string sub = need_string(a.get(0, "sub"), "count");  // a copy: get() returns a temporary
         if (sub.empty()) return Value(py_len(s) + 1);
         int64_t n = 0;
         for (size_t at = find_text(s.string(), sub); at != std::string::npos;
              at = find_text(s.string(), sub, at + sub.size()))
           ++n;
         return Value(n);
       }},
  });
}

// str methods that split a string into a list, or join a list into a string.
void add_split_methods(StrMethodTable& table) {
  table.insert({
      {"split",
       [](const Value& s, Arguments& a) -> Value {
         a.check(2, {"sep", "maxsplit"});
         return py_split(s.string(), a.get(0, "sep", Value::none()),
                         as_int(a.get(1, "maxsplit", Value(-1)), "maxsplit"), false);
       }},
      {"rsplit",
       [](const Value& s, Arguments& a) -> Value {
         a.check(2, {"sep", "maxsplit"});
         return py_split(s.string(), a.get(0, "sep", Value::none()),
                         as_int(a.get(1, "maxsplit", Value(-1)), "maxsplit"), true);
       }},
      {"splitlines",
       [](const Value& s, Arguments& a) -> Value {
         a.check(1, {"keepends"});
         bool keep = a.get(0, "keepends", Value(false)).truthy();
         Value::List out;
         const std::string& t = s.string();
         size_t start = 0;
         for (size_t i = 0; i < t.size(); ++i) {
           if (t[i] != '\n' && t[i] != '\r') continue;
           size_t end = i;
           if (t[i] == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
           check_items(out.size() + 2, "the list str.splitlines() makes");
           out.emplace_back(t.substr(start, (keep ? i + 1 : end) - start));
           start = i + 1;
         }
         if (start < t.size()) out.emplace_back(t.substr(start));
         return Value(std::move(out));
       }},
      {"join",
       [](const Value& s, Arguments& a) -> Value {
         a.check(1, {});
         std::string out;
         bool first = true;
         for (const auto& v : iterate(a.get(0, "iterable"))) {
           const std::string& piece = need_string(v, "str.join");
           check_size(out.size() + s.string().size() + piece.size(), "a string made by str.join()");
           if (!first) out += s.string();
           out += piece;
           first = false;
         }
         return Value(std::move(out));
       }},
  });
}

// str methods that make a new string: stripped, in another case, with a substring replaced.
void add_edit_methods(StrMethodTable& table) {
  table.insert({
      // One short method a line.
      // clang-format off
      {"strip", [](const Value& s, Arguments& a) -> Value { a.check(1, {}); return Value(py_strip(s.string(), a.get(0, "chars", Value::none()), true, true)); }},
      {"lstrip", [](const Value& s, Arguments& a) -> Value { a.check(1, {}); return Value(py_strip(s.string(), a.get(0, "chars", Value::none()), true, false)); }},
      {"rstrip", [](const Value& s, Arguments& a) -> Value { a.check(1, {}); return Value(py_strip(s.string(), a.get(0, "chars", Value::none()), false, true)); }},
      {"upper", [](const Value& s, Arguments& a) -> Value { a.check(0, {}); return Value(upper(s.string())); }},
      {"lower", [](const Value& s, Arguments& a) -> Value { a.check(0, {}); return Value(lower(s.string())); }},
      {"title", [](const Value& s, Arguments& a) -> Value { a.check(0, {}); return Value(py_title(s.string())); }},
      {"capitalize", [](const Value& s, Arguments& a) -> Value { a.check(0, {}); return Value(capitalize(s.string())); }},
      // clang-format on
      {"replace",
       [](const Value& s, Arguments& a) -> Value {
         a.check(3, {});
         return Value(py_replace(s.string(), need_string(a.get(0, "old"), "replace"),
                                 need_string(a.get(1, "new"), "replace"),
                                 as_int(a.get(2, "count", Value(-1)), "count")));
       }},
  });
}

// str methods that test the class of every character.
void add_char_class_methods(StrMethodTable& table) {
  table.insert({
      {"isdigit",
       [](const Value& s, Arguments&) -> Value {
         return Value(!s.string().empty() &&
                      std::all_of(s.string().begin(), s.string().end(), [](char c) { return c >= '0' && c <= '9'; }));
       }},
      {"isspace",
       [](const Value& s, Arguments&) -> Value {
         return Value(!s.string().empty() && std::all_of(s.string().begin(), s.string().end(), py_space));
       }},
      {"isalpha",
       [](const Value& s, Arguments&) -> Value {
         return Value(!s.string().empty() && std::all_of(s.string().begin(), s.string().end(), [](char c) {
           return std::isalpha(static_cast<unsigned char>(c)) != 0;
         }));
       }},
  });
}

}  // namespace

Value string_method(const Value& self, const std::string& name) {
  // Every str method by name, gathered from the families once, on first use. No two families
  // name the same method (insert() would keep the first).
  static const StrMethodTable kMethods = [] {
    StrMethodTable table;
    for (auto add : {add_search_methods, add_split_methods, add_edit_methods, add_char_class_methods}) add(table);
    return table;
  }();
  auto it = kMethods.find(name);
  if (it == kMethods.end()) return Value::undefined(name);
  return bound_method(self, name, it->second);
}

}  // namespace rlx::chat::jinja::detail
