// The Jinja engine's Python semantics: truth-independent helpers (len, iteration, ordering,
// `in`), str methods as Python has them (by code point where Python counts code points), the
// methods of str, dict and list values, and attribute and item lookup as Jinja2 does them.
// Their work is charged to the render's budget: a step per item visited, a step per
// kBytesPerStep bytes scanned, and what they build checked before it is built.
#include <algorithm>
#include <map>

#include "chat/jinja_eval.hpp"
#include "chat/jinja_text.hpp"

namespace rlx::chat::jinja {

Value Arguments::get(size_t index, std::string_view name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keywords)
    if (k == name) return v;
  return fallback;
}

void Arguments::check(size_t max_positional, std::initializer_list<std::string_view> known) const {
  if (positional.size() > max_positional)
    throw TemplateError(fmt::format("{}() takes at most {} positional arguments, got {}", callee, max_positional, positional.size()));
  for (const auto& [k, v] : keywords)
    if (std::find(known.begin(), known.end(), k) == known.end())
      throw TemplateError(fmt::format("{}() got an unexpected keyword argument '{}'", callee, k));
}

namespace detail {

// ---- small Python helpers
std::string undefined_message(const Value& v) {
  return v.name().empty() ? std::string("a value is undefined") : fmt::format("'{}' is undefined", v.name());
}
void require_defined(const Value& v) {
  if (v.is_undefined()) fail(undefined_message(v));
}

int64_t as_int(const Value& v, const char* what) {
  if (v.kind() == Value::Kind::integer || v.kind() == Value::Kind::boolean) return v.integer();
  require_defined(v);
  fail(fmt::format("{} must be an integer, got {}", what, v.type_name()));
}

std::vector<Value> chars_of(const std::string& s) {
  check_items(count_code_points(s), "the characters of a string");
  auto cps = code_points(s);
  charge_steps(static_cast<int64_t>(cps.size()));
  std::vector<Value> out;
  out.reserve(cps.size() - 1);
  for (size_t i = 0; i + 1 < cps.size(); ++i) out.emplace_back(s.substr(cps[i], cps[i + 1] - cps[i]));
  return out;
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return 0;
    case Value::Kind::string: return static_cast<int64_t>(count_code_points(v.string()));
    case Value::Kind::list: return static_cast<int64_t>(v.list().size());
    case Value::Kind::dict: return static_cast<int64_t>(v.dict().items.size());
    default: fail(fmt::format("object of type '{}' has no len()", v.type_name()));
  }
}

// What `for` iterates: list items, dict keys, string characters; nothing for undefined.
std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: charge_steps(static_cast<int64_t>(v.list().size())); return v.list();
    case Value::Kind::string: return chars_of(v.string());
    case Value::Kind::dict: {
      charge_steps(static_cast<int64_t>(v.dict().items.size()));
      std::vector<Value> keys;
      for (const auto& [k, x] : v.dict().items) keys.emplace_back(k);
      return keys;
    }
    default: fail(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

// Python's ordering for sort, min, max and < <= > >=.
int compare(const Value& a, const Value& b) {
  charge_steps(1);
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::floating && b.kind() != Value::Kind::floating)
      return a.integer() < b.integer() ? -1 : a.integer() > b.integer() ? 1 : 0;
    return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    charge_scan(std::min(a.string().size(), b.string().size()));
    int c = a.string().compare(b.string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i].equals(y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  require_defined(a);
  require_defined(b);
  fail(fmt::format("'<' is not supported between instances of '{}' and '{}'", a.type_name(), b.type_name()));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::undefined: return false;
    case Value::Kind::string:
      if (!item.is_string()) fail(fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      return find_text(container.string(), item.string()) != std::string::npos;
    case Value::Kind::list:
      return std::any_of(container.list().begin(), container.list().end(), [&](const Value& v) { return v.equals(item); });
    case Value::Kind::dict: return item.is_string() && container.dict().find(item.string()) != nullptr;
    default: fail(fmt::format("argument of type '{}' is not iterable", container.type_name()));
  }
}

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
        for (size_t k = keep; k < words.size(); ++k) out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
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
    if (letter) c = static_cast<char>(prev_letter ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c)));
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
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

const std::string& need_string(const Value& v, const char* what) {
  if (!v.is_string()) {
    require_defined(v);
    fail(fmt::format("{} expects a string, got {}", what, v.type_name()));
  }
  return v.string();
}

// Python slicing of `n` items: the indices selected, in order.
std::vector<int64_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto given = [](const Value& v) { return !v.is_none() && !v.is_undefined(); };
  int64_t step = given(step_v) ? as_int(step_v, "a slice step") : 1;
  if (step == 0) fail("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (!given(v)) return dflt;
    int64_t i = as_int(v, "a slice index");
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t start = clamp(start_v, step > 0 ? 0 : n - 1);
  int64_t stop = clamp(stop_v, step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  charge_steps(static_cast<int64_t>(out.size()));
  return out;
}


namespace {

Value method(Value self, std::string name, Value (*fn)(const Value&, Arguments&)) {
  std::string full = fmt::format("{}.{}", self.type_name(), name);
  return Value(Function([self = std::move(self), fn](Arguments& a) { return fn(self, a); }), full);
}

Value dict_method(const Value& self, const std::string& name) {
  if (name == "items")
    return method(self, name, [](const Value& d, Arguments& a) -> Value {
      a.check(0, {});
      Value::List out;
      for (const auto& [k, v] : d.dict().items) out.push_back(Value::tuple({Value(k), v}));
      return Value(std::move(out));
    });
  if (name == "keys")
    return method(self, name, [](const Value& d, Arguments& a) -> Value {
      a.check(0, {});
      return Value(iterate(d));
    });
  if (name == "values")
    return method(self, name, [](const Value& d, Arguments& a) -> Value {
      a.check(0, {});
      Value::List out;
      for (const auto& [k, v] : d.dict().items) out.push_back(v);
      return Value(std::move(out));
    });
  if (name == "get")
    return method(self, name, [](const Value& d, Arguments& a) -> Value {
      a.check(2, {});
      Value key = a.get(0, "key");
      const Value* v = key.is_string() ? d.dict().find(key.string()) : nullptr;
      return v ? *v : a.get(1, "default", Value::none());
    });
  static const char* const kMutators[] = {"pop", "popitem", "update", "clear", "setdefault"};
  for (const char* m : kMutators)
    if (name == m)
      return method(self, name, [](const Value&, Arguments& a) -> Value {
        fail(fmt::format("{}(): chat templates render in HF's immutable sandbox; it cannot modify a dict", a.callee));
      });
  return Value::undefined(name);
}

Value list_method(const Value& self, const std::string& name) {
  static const char* const kMutators[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  for (const char* m : kMutators)
    if (name == m)
      return method(self, name, [](const Value&, Arguments& a) -> Value {
        fail(fmt::format("{}(): chat templates render in HF's immutable sandbox; it cannot modify a list", a.callee));
      });
  if (name == "index")
    return method(self, name, [](const Value& l, Arguments& a) -> Value {
      a.check(1, {});
      Value x = a.get(0, "value");
      for (size_t i = 0; i < l.list().size(); ++i)
        if (l.list()[i].equals(x)) return Value(static_cast<int64_t>(i));
      fail(fmt::format("{} is not in list", x.repr()));
    });
  return Value::undefined(name);
}


}  // namespace

// ---- string methods
Value string_method(const Value& self, const std::string& name) {
  using M = Value (*)(const Value&, Arguments&);
  static const std::map<std::string, M, std::less<>> kMethods = {
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
           return s.string().size() >= suf.size() && s.string().compare(s.string().size() - suf.size(), suf.size(), suf) == 0;
         };
         if (p.is_list()) return Value(std::any_of(p.list().begin(), p.list().end(), test));
         return Value(test(p));
       }},
      {"split",
       [](const Value& s, Arguments& a) -> Value {
         a.check(2, {"sep", "maxsplit"});
         return py_split(s.string(), a.get(0, "sep", Value::none()), as_int(a.get(1, "maxsplit", Value(-1)), "maxsplit"), false);
       }},
      {"rsplit",
       [](const Value& s, Arguments& a) -> Value {
         a.check(2, {"sep", "maxsplit"});
         return py_split(s.string(), a.get(0, "sep", Value::none()), as_int(a.get(1, "maxsplit", Value(-1)), "maxsplit"), true);
       }},
      {"strip", [](const Value& s, Arguments& a) -> Value { a.check(1, {}); return Value(py_strip(s.string(), a.get(0, "chars", Value::none()), true, true)); }},
      {"lstrip", [](const Value& s, Arguments& a) -> Value { a.check(1, {}); return Value(py_strip(s.string(), a.get(0, "chars", Value::none()), true, false)); }},
      {"rstrip", [](const Value& s, Arguments& a) -> Value { a.check(1, {}); return Value(py_strip(s.string(), a.get(0, "chars", Value::none()), false, true)); }},
      {"upper", [](const Value& s, Arguments& a) -> Value { a.check(0, {}); return Value(upper(s.string())); }},
      {"lower", [](const Value& s, Arguments& a) -> Value { a.check(0, {}); return Value(lower(s.string())); }},
      {"title", [](const Value& s, Arguments& a) -> Value { a.check(0, {}); return Value(py_title(s.string())); }},
      {"capitalize", [](const Value& s, Arguments& a) -> Value { a.check(0, {}); return Value(capitalize(s.string())); }},
      {"replace",
       [](const Value& s, Arguments& a) -> Value {
         a.check(3, {});
         return Value(py_replace(s.string(), need_string(a.get(0, "old"), "replace"), need_string(a.get(1, "new"), "replace"),
                                 as_int(a.get(2, "count", Value(-1)), "count")));
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
         for (size_t at = find_text(s.string(), sub); at != std::string::npos; at = find_text(s.string(), sub, at + sub.size())) ++n;
         return Value(n);
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
      {"isdigit",
       [](const Value& s, Arguments&) -> Value {
         return Value(!s.string().empty() && std::all_of(s.string().begin(), s.string().end(), [](char c) { return c >= '0' && c <= '9'; }));
       }},
      {"isspace",
       [](const Value& s, Arguments&) -> Value {
         return Value(!s.string().empty() && std::all_of(s.string().begin(), s.string().end(), py_space));
       }},
      {"isalpha",
       [](const Value& s, Arguments&) -> Value {
         return Value(!s.string().empty() && std::all_of(s.string().begin(), s.string().end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }));
       }},
  };
  auto it = kMethods.find(name);
  if (it == kMethods.end()) return Value::undefined(name);
  return method(self, name, it->second);
}


Value Renderer::get_attr(const Value& obj, const std::string& attr) {
  switch (obj.kind()) {
    case Value::Kind::undefined: fail(fmt::format("{} (looking up '.{}')", undefined_message(obj), attr));
    case Value::Kind::string: return string_method(obj, attr);
    case Value::Kind::list: return list_method(obj, attr);
    case Value::Kind::dict: {
      if (!obj.dict().is_namespace) {
        // Jinja tries the Python attribute first: a dict's methods shadow its keys.
        Value m = dict_method(obj, attr);
        if (!m.is_undefined()) return m;
      }
      const Value* v = obj.dict().find(attr);
      return v ? *v : Value::undefined(attr);
    }
    default: return Value::undefined(attr);
  }
}

Value Renderer::get_item(const Value& obj, const Value& index) {
  switch (obj.kind()) {
    case Value::Kind::undefined: fail(fmt::format("{} (looking up [{}])", undefined_message(obj), index.repr()));
    case Value::Kind::dict: {
      if (index.is_string()) {
        const Value* v = obj.dict().find(index.string());
        if (v) return *v;
        if (obj.dict().is_namespace) return Value::undefined(index.string());
        return get_attr(obj, index.string());
      }
      return Value::undefined(index.repr());
    }
    case Value::Kind::list:
    case Value::Kind::string: {
      if (index.is_string()) return get_attr(obj, index.string());
      if (index.kind() != Value::Kind::integer && index.kind() != Value::Kind::boolean) {
        require_defined(index);
        fail(fmt::format("{} indices must be integers, not {}", obj.type_name(), index.type_name()));
      }
      int64_t i = index.integer();
      if (obj.is_list()) {
        auto n = static_cast<int64_t>(obj.list().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(fmt::format("[{}]", index.integer()));
        return obj.list()[static_cast<size_t>(i)];
      }
      const std::string& str = obj.string();
      auto n = static_cast<int64_t>(count_code_points(str));
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(fmt::format("[{}]", index.integer()));
      size_t at = 0;
      for (int64_t k = 0; k < i; ++k) at += code_point_length(str, at);
      return Value(str.substr(at, code_point_length(str, at)));
    }
    default: return Value::undefined(index.repr());
  }
}


}  // namespace detail
}  // namespace rlx::chat::jinja
