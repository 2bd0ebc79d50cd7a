// The Jinja engine's evaluator: scopes as Jinja2 has them (a frame per loop iteration and
// per macro call; `set` writes the innermost frame; `namespace` objects carry values out),
// Python's operators, and the built-in functions, methods, filters and tests.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <unordered_map>

#include "chat/jinja_ast.hpp"
#include "chat/jinja_text.hpp"

namespace rlx::jinja {

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
namespace {

constexpr size_t kMaxOutputBytes = 64u << 20;  // a rendered conversation past this is a runaway template
constexpr int64_t kMaxIterations = 10'000'000;  // loop iterations in one render
constexpr int kMaxCallDepth = 64;               // nested macro calls
constexpr int64_t kMaxRange = 100'000;          // Jinja2's sandbox limit

// An error already prefixed with its template and line: outer statements pass it through.
class LocatedError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

[[noreturn]] void fail(const std::string& what) { throw TemplateError(what); }

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};

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
  auto cps = code_points(s);
  std::vector<Value> out;
  out.reserve(cps.size() - 1);
  for (size_t i = 0; i + 1 < cps.size(); ++i) out.emplace_back(s.substr(cps[i], cps[i + 1] - cps[i]));
  return out;
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return 0;
    case Value::Kind::string: return static_cast<int64_t>(code_points(v.string()).size() - 1);
    case Value::Kind::list: return static_cast<int64_t>(v.list().size());
    case Value::Kind::dict: return static_cast<int64_t>(v.dict().items.size());
    default: fail(fmt::format("object of type '{}' has no len()", v.type_name()));
  }
}

// What `for` iterates: list items, dict keys, string characters; nothing for undefined.
std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return v.list();
    case Value::Kind::string: return chars_of(v.string());
    case Value::Kind::dict: {
      std::vector<Value> keys;
      for (const auto& [k, x] : v.dict().items) keys.emplace_back(k);
      return keys;
    }
    default: fail(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

// Python's ordering for sort, min, max and < <= > >=.
int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::floating && b.kind() != Value::Kind::floating)
      return a.integer() < b.integer() ? -1 : a.integer() > b.integer() ? 1 : 0;
    return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
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
      return container.string().find(item.string()) != std::string::npos;
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
  std::vector<std::string> set;
  bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) {
    if (!chars.is_string()) fail(fmt::format("strip arg must be None or str, not {}", chars.type_name()));
    for (const auto& c : chars_of(chars.string())) set.push_back(c.string());
  }
  auto cps = code_points(s);
  size_t b = 0, e = cps.size() - 1;
  auto strippable = [&](size_t i) {
    std::string_view c(s.data() + cps[i], cps[i + 1] - cps[i]);
    if (ws) return c.size() == 1 && py_space(c[0]);
    return std::find(set.begin(), set.end(), c) != set.end();
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
      words.emplace_back(i, j);
      i = j;
    }
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
      size_t at = s.find(d, start);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(start, at - start));
      start = at + d.size();
    }
    parts.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      if (end < d.size()) break;
      size_t at = s.rfind(d, end - d.size());
      if (at == std::string::npos) break;
      parts.push_back(s.substr(at + d.size(), end - at - d.size()));
      end = at;
    }
    parts.push_back(s.substr(0, end));
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
    size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
  }
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
  for (char c : s) {
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
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
class Renderer {
 public:
  Renderer(std::string name, std::shared_ptr<Frame> root) : name(std::move(name)), frame(std::move(root)) {}

  std::string name;
  std::shared_ptr<Frame> frame;
  enum class Flow { normal, brk, cont } flow = Flow::normal;
  int depth = 0;
  int64_t iterations = 0;

  Value lookup(const std::string& n) const {
    for (const Frame* f = frame.get(); f; f = f->parent.get()) {
      auto it = f->vars.find(n);
      if (it != f->vars.end()) return it->second;
    }
    return Value::undefined(n);
  }
  void assign(const std::string& n, Value v) { frame->vars[n] = std::move(v); }

  [[noreturn]] void located(int line, const std::exception& e) const {
    if (dynamic_cast<const LocatedError*>(&e)) throw;
    throw LocatedError(fmt::format("{}:{}: {}", name, line, e.what()));
  }

  void count_iteration() {
    if (++iterations > kMaxIterations) fail(fmt::format("more than {} loop iterations in one render", kMaxIterations));
  }

  Value get_attr(const Value& obj, const std::string& attr);
  Value get_item(const Value& obj, const Value& index);
  Value call_filter(const std::string& filter, const Value& operand, Arguments& args);
  bool call_test(const std::string& test, const Value& operand, Arguments& args);
};

namespace {

using FilterFn = Value (*)(Renderer&, const Value&, Arguments&);
using TestFn = bool (*)(Renderer&, const Value&, Arguments&);

Value method(Value self, std::string name, Value (*fn)(const Value&, Arguments&)) {
  std::string full = fmt::format("{}.{}", self.type_name(), name);
  return Value(Function([self = std::move(self), fn](Arguments& a) { return fn(self, a); }), full);
}

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
         auto at = s.string().find(need_string(a.get(0, "sub"), "find"));
         if (at == std::string::npos) return Value(-1);
         auto cps = code_points(s.string());
         return Value(static_cast<int64_t>(std::lower_bound(cps.begin(), cps.end(), at) - cps.begin()));
       }},
      {"count",
       [](const Value& s, Arguments& a) -> Value {
         a.check(1, {});
         const std::string& sub = need_string(a.get(0, "sub"), "count");
         if (sub.empty()) return Value(py_len(s) + 1);
         int64_t n = 0;
         for (size_t at = s.string().find(sub); at != std::string::npos; at = s.string().find(sub, at + sub.size())) ++n;
         return Value(n);
       }},
      {"join",
       [](const Value& s, Arguments& a) -> Value {
         a.check(1, {});
         std::string out;
         bool first = true;
         for (const auto& v : iterate(a.get(0, "iterable"))) {
           if (!first) out += s.string();
           out += need_string(v, "str.join");
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
      auto cps = code_points(obj.string());
      auto n = static_cast<int64_t>(cps.size()) - 1;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(fmt::format("[{}]", index.integer()));
      auto k = static_cast<size_t>(i);
      return Value(obj.string().substr(cps[k], cps[k + 1] - cps[k]));
    }
    default: return Value::undefined(index.repr());
  }
}

namespace {

Arguments evaluate(Renderer& r, const CallArgs& args, std::string callee) {
  Arguments a;
  a.callee = std::move(callee);
  for (const auto& e : args.positional) a.positional.push_back(e->eval(r));
  for (const auto& [k, e] : args.keywords) a.keywords.emplace_back(k, e->eval(r));
  return a;
}

// An item's attribute by a dotted path ("function.name", "0"), as filters' `attribute=` takes it.
Value attribute_path(Renderer& r, const Value& item, const Value& path) {
  if (path.kind() == Value::Kind::integer) return r.get_item(item, path);
  Value v = item;
  Value parts = py_split(need_string(path, "attribute"), Value("."), -1, false);
  for (const auto& part : parts.list()) {
    const std::string& p = part.string();
    bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = r.get_item(v, digits ? Value(static_cast<int64_t>(std::stoll(p))) : part);
    if (v.is_undefined()) return v;
  }
  return v;
}

// select/reject/selectattr/rejectattr: a test by name after the arguments the filter itself uses.
std::vector<Value> select_items(Renderer& r, const Value& seq, Arguments& a, bool by_attr, bool keep) {
  size_t next = 0;
  Value attr;
  if (by_attr) attr = a.get(next++, "attribute");
  std::vector<Value> out;
  Value test = a.positional.size() > next ? a.positional[next] : Value();
  Arguments targs;
  targs.callee = test.is_string() ? test.string() : "";
  for (size_t i = next + 1; i < a.positional.size(); ++i) targs.positional.push_back(a.positional[i]);
  if (test.is_string() && !has_test(test.string())) fail(fmt::format("no test named '{}'", test.string()));
  for (const auto& item : iterate(seq)) {
    Value v = by_attr ? attribute_path(r, item, attr) : item;
    bool pass = test.is_string() ? r.call_test(test.string(), v, targs) : v.truthy();
    if (pass == keep) out.push_back(item);
  }
  return out;
}

std::vector<Value> sorted_copy(Renderer& r, std::vector<Value> items, bool reverse, bool case_sensitive, const Value& attr) {
  auto key = [&](const Value& v) {
    Value k = attr.is_undefined() || attr.is_none() ? v : attribute_path(r, v, attr);
    if (!case_sensitive && k.is_string()) return Value(lower(k.string()));
    return k;
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) keyed.emplace_back(key(v), v);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    int c = compare(a.first, b.first);
    return reverse ? c > 0 : c < 0;
  });
  std::vector<Value> out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> kFilters = {
      {"abs", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         if (v.kind() == Value::Kind::floating) return Value(std::fabs(v.number()));
         return Value(static_cast<int64_t>(std::llabs(as_int(v, "abs"))));
       }},
      {"attr", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(1, {});
         return r.get_attr(v, need_string(a.get(0, "name"), "attr"));
       }},
      {"capitalize", [](Renderer&, const Value& v, Arguments& a) -> Value { a.check(0, {}); return Value(capitalize(v.str())); }},
      {"default", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(2, {"default_value", "boolean"});
         bool boolean = a.get(1, "boolean", Value(false)).truthy();
         if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value(""));
         return v;
       }},
      {"dictsort", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(3, {"case_sensitive", "by", "reverse"});
         if (!v.is_dict()) fail(fmt::format("dictsort expects a dict, got {}", v.type_name()));
         bool by_value = a.get(1, "by", Value("key")).str() == "value";
         std::vector<Value> pairs;
         for (const auto& [k, x] : v.dict().items) pairs.push_back(Value::tuple({Value(k), x}));
         return Value(sorted_copy(r, std::move(pairs), a.get(2, "reverse", Value(false)).truthy(),
                                  a.get(0, "case_sensitive", Value(false)).truthy(), Value(by_value ? 1 : 0)));
       }},
      {"escape", [](Renderer&, const Value& v, Arguments& a) -> Value { a.check(0, {}); return Value(html_escape(v.str())); }},
      {"first", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         auto items = iterate(v);
         return items.empty() ? Value::undefined("first") : items.front();
       }},
      {"float", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(1, {"default"});
         if (v.is_number()) return Value(v.number());
         if (v.is_string()) {
           try {
             size_t used = 0;
             double d = std::stod(v.string(), &used);
             if (py_strip(v.string().substr(used), Value::none(), true, true).empty()) return Value(d);
           } catch (const std::exception&) {
           }
         }
         return a.get(0, "default", Value(0.0));
       }},
      {"int", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(2, {"default", "base"});
         if (v.kind() == Value::Kind::floating) return Value(static_cast<int64_t>(std::trunc(v.number())));
         if (v.is_number()) return Value(v.integer());
         if (v.is_string()) {
           std::string s = py_strip(v.string(), Value::none(), true, true);
           try {
             size_t used = 0;
             int64_t i = std::stoll(s, &used, static_cast<int>(as_int(a.get(1, "base", Value(10)), "base")));
             if (used == s.size()) return Value(i);
             double d = std::stod(s, &used);
             if (used == s.size()) return Value(static_cast<int64_t>(std::trunc(d)));
           } catch (const std::exception&) {
           }
         }
         return a.get(0, "default", Value(0));
       }},
      {"items", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         if (v.is_undefined()) return Value(Value::List{});
         if (!v.is_dict()) fail(fmt::format("items expects a dict, got {}", v.type_name()));
         Value::List out;
         for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple({Value(k), x}));
         return Value(std::move(out));
       }},
      {"join", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"d", "attribute"});
         std::string sep = a.get(0, "d", Value("")).str();
         Value attr = a.get(1, "attribute");
         std::string out;
         bool first = true;
         for (const auto& item : iterate(v)) {
           if (!first) out += sep;
           out += (attr.is_undefined() ? item : attribute_path(r, item, attr)).str();
           first = false;
         }
         return Value(std::move(out));
       }},
      {"last", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         auto items = iterate(v);
         return items.empty() ? Value::undefined("last") : items.back();
       }},
      {"length", [](Renderer&, const Value& v, Arguments& a) -> Value { a.check(0, {}); return Value(py_len(v)); }},
      {"list", [](Renderer&, const Value& v, Arguments& a) -> Value { a.check(0, {}); return Value(iterate(v)); }},
      {"lower", [](Renderer&, const Value& v, Arguments& a) -> Value { a.check(0, {}); return Value(lower(v.str())); }},
      {"map", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         Value::List out;
         Value attr = a.get(99, "attribute");
         if (!attr.is_undefined()) {
           a.check(0, {"attribute", "default"});
           Value dflt = a.get(99, "default");
           for (const auto& item : iterate(v)) {
             Value x = attribute_path(r, item, attr);
             out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
           }
           return Value(std::move(out));
         }
         if (a.positional.empty()) fail("map() needs a filter name or attribute=");
         std::string name = need_string(a.positional[0], "map");
         if (!has_filter(name)) fail(fmt::format("no filter named '{}'", name));
         Arguments fargs;
         fargs.callee = name;
         fargs.positional.assign(a.positional.begin() + 1, a.positional.end());
         fargs.keywords = a.keywords;
         for (const auto& item : iterate(v)) out.push_back(r.call_filter(name, item, fargs));
         return Value(std::move(out));
       }},
      {"max", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"case_sensitive", "attribute"});
         auto s = sorted_copy(r, iterate(v), false, a.get(0, "case_sensitive", Value(false)).truthy(), a.get(1, "attribute"));
         return s.empty() ? Value::undefined("max") : s.back();
       }},
      {"min", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"case_sensitive", "attribute"});
         auto s = sorted_copy(r, iterate(v), false, a.get(0, "case_sensitive", Value(false)).truthy(), a.get(1, "attribute"));
         return s.empty() ? Value::undefined("min") : s.front();
       }},
      {"reject", [](Renderer& r, const Value& v, Arguments& a) -> Value { return Value(select_items(r, v, a, false, false)); }},
      {"rejectattr", [](Renderer& r, const Value& v, Arguments& a) -> Value { return Value(select_items(r, v, a, true, false)); }},
      {"replace", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(3, {"old", "new", "count"});
         Value count = a.get(2, "count", Value::none());
         return Value(py_replace(v.str(), a.get(0, "old").str(), a.get(1, "new").str(), count.is_none() ? -1 : as_int(count, "count")));
       }},
      {"reverse", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         auto items = iterate(v);
         std::reverse(items.begin(), items.end());
         if (v.is_string()) {
           std::string out;
           for (const auto& c : items) out += c.string();
           return Value(std::move(out));
         }
         return Value(std::move(items));
       }},
      {"round", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(2, {"precision", "method"});
         if (!v.is_number()) fail(fmt::format("round expects a number, got {}", v.type_name()));
         double scale = std::pow(10.0, static_cast<double>(as_int(a.get(0, "precision", Value(0)), "precision")));
         std::string m = a.get(1, "method", Value("common")).str();
         double x = v.number() * scale;
         double y = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::nearbyint(x);  // Python rounds half to even
         if (m != "common" && m != "ceil" && m != "floor") fail("round: method must be 'common', 'ceil' or 'floor'");
         return Value(y / scale);
       }},
      {"safe", [](Renderer&, const Value& v, Arguments& a) -> Value { a.check(0, {}); return v; }},
      {"select", [](Renderer& r, const Value& v, Arguments& a) -> Value { return Value(select_items(r, v, a, false, true)); }},
      {"selectattr", [](Renderer& r, const Value& v, Arguments& a) -> Value { return Value(select_items(r, v, a, true, true)); }},
      {"sort", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(3, {"reverse", "case_sensitive", "attribute"});
         return Value(sorted_copy(r, iterate(v), a.get(0, "reverse", Value(false)).truthy(),
                                  a.get(1, "case_sensitive", Value(false)).truthy(), a.get(2, "attribute")));
       }},
      {"string", [](Renderer&, const Value& v, Arguments& a) -> Value { a.check(0, {}); return Value(v.str()); }},
      {"sum", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"attribute", "start"});
         Value attr = a.get(0, "attribute");
         Value total = a.get(1, "start", Value(0));
         for (const auto& item : iterate(v)) {
           Value x = attr.is_undefined() ? item : attribute_path(r, item, attr);
           if (!x.is_number() || !total.is_number()) fail(fmt::format("sum: unsupported operand types {} and {}", total.type_name(), x.type_name()));
           if (x.kind() == Value::Kind::floating || total.kind() == Value::Kind::floating) total = Value(total.number() + x.number());
           else total = Value(total.integer() + x.integer());
         }
         return total;
       }},
      {"title", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         // Jinja's own title: words begin after '-', whitespace, '(', '{', '[' or '<'.
         std::string s = v.str(), out;
         bool start = true;
         for (char c : s) {
           bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
           out += static_cast<char>(sep ? c : start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
           start = sep;
         }
         return Value(std::move(out));
       }},
      {"tojson", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(1, {"indent", "ensure_ascii", "separators", "sort_keys"});
         JsonStyle style;
         Value indent = a.get(0, "indent", Value::none());
         if (!indent.is_none()) style.indent = static_cast<int>(std::clamp<int64_t>(as_int(indent, "indent"), 0, 64));
         style.ensure_ascii = a.get(9, "ensure_ascii", Value(false)).truthy();
         style.sort_keys = a.get(9, "sort_keys", Value(false)).truthy();
         Value seps = a.get(9, "separators", Value::none());
         if (!seps.is_none()) {
           if (!seps.is_list() || seps.list().size() != 2) fail("tojson: separators must be a pair of strings");
           style.item_separator = need_string(seps.list()[0], "separators");
           style.key_separator = need_string(seps.list()[1], "separators");
         }
         return Value(json_dumps(v, style));
       }},
      {"trim", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(1, {"chars"});
         return Value(py_strip(v.str(), a.get(0, "chars", Value::none()), true, true));
       }},
      {"unique", [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"case_sensitive", "attribute"});
         bool cs = a.get(0, "case_sensitive", Value(false)).truthy();
         Value attr = a.get(1, "attribute");
         Value::List out, seen;
         for (const auto& item : iterate(v)) {
           Value k = attr.is_undefined() ? item : attribute_path(r, item, attr);
           if (!cs && k.is_string()) k = Value(lower(k.string()));
           if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.equals(k); })) continue;
           seen.push_back(k);
           out.push_back(item);
         }
         return Value(std::move(out));
       }},
      {"upper", [](Renderer&, const Value& v, Arguments& a) -> Value { a.check(0, {}); return Value(upper(v.str())); }},
      {"indent", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(3, {"width", "first", "blank"});
         Value w = a.get(0, "width", Value(4));
         std::string ind = w.is_string() ? w.string() : std::string(static_cast<size_t>(std::clamp<int64_t>(as_int(w, "width"), 0, 1024)), ' ');
         bool first = a.get(1, "first", Value(false)).truthy(), blank = a.get(2, "blank", Value(false)).truthy();
         Value lines_v = string_method(Value(v.str() + "\n"), "splitlines");
         Arguments none;
         Value lines = lines_v.function()(none);
         std::string out;
         const auto& ls = lines.list();
         for (size_t i = 0; i < ls.size(); ++i) {
           if (i) out += "\n";
           const std::string& l = ls[i].string();
           out += (i > 0 && (blank || !l.empty())) ? ind + l : l;
         }
         if (first) out = ind + out;
         return Value(std::move(out));
       }},
      {"wordcount", [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         int64_t n = 0;
         bool in_word = false;
         for (char c : v.str()) {
           bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value(n);
       }},
  };
  return kFilters;
}

const std::map<std::string, std::string, std::less<>>& filter_aliases() {
  static const std::map<std::string, std::string, std::less<>> kAliases = {
      {"d", "default"}, {"e", "escape"}, {"count", "length"}, {"forceescape", "escape"}};
  return kAliases;
}

bool test_compare(const Value& v, Arguments& a, const char* op) {
  a.check(1, {});
  Value other = a.get(0, "other");
  std::string o = op;
  if (o == "==") return v.equals(other);
  if (o == "!=") return !v.equals(other);
  int c = compare(v, other);
  return o == "<" ? c < 0 : o == "<=" ? c <= 0 : o == ">" ? c > 0 : c >= 0;
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> kTests = {
      {"boolean", [](Renderer&, const Value& v, Arguments&) { return v.kind() == Value::Kind::boolean; }},
      {"callable", [](Renderer&, const Value& v, Arguments&) { return v.is_function(); }},
      {"defined", [](Renderer&, const Value& v, Arguments&) { return !v.is_undefined(); }},
      {"undefined", [](Renderer&, const Value& v, Arguments&) { return v.is_undefined(); }},
      {"none", [](Renderer&, const Value& v, Arguments&) { return v.is_none(); }},
      {"true", [](Renderer&, const Value& v, Arguments&) { return v.kind() == Value::Kind::boolean && v.boolean(); }},
      {"false", [](Renderer&, const Value& v, Arguments&) { return v.kind() == Value::Kind::boolean && !v.boolean(); }},
      {"integer", [](Renderer&, const Value& v, Arguments&) { return v.kind() == Value::Kind::integer; }},
      {"float", [](Renderer&, const Value& v, Arguments&) { return v.kind() == Value::Kind::floating; }},
      {"number", [](Renderer&, const Value& v, Arguments&) { return v.is_number(); }},
      {"string", [](Renderer&, const Value& v, Arguments&) { return v.is_string(); }},
      {"mapping", [](Renderer&, const Value& v, Arguments&) { return v.is_dict(); }},
      {"sequence", [](Renderer&, const Value& v, Arguments&) { return v.is_list() || v.is_string() || v.is_dict(); }},
      {"iterable", [](Renderer&, const Value& v, Arguments&) { return v.is_list() || v.is_string() || v.is_dict(); }},
      {"escaped", [](Renderer&, const Value&, Arguments&) { return false; }},
      {"even", [](Renderer&, const Value& v, Arguments&) { return as_int(v, "even") % 2 == 0; }},
      {"odd", [](Renderer&, const Value& v, Arguments&) { return as_int(v, "odd") % 2 != 0; }},
      {"divisibleby", [](Renderer&, const Value& v, Arguments& a) {
         int64_t n = as_int(a.get(0, "num"), "divisibleby");
         if (n == 0) fail("divisibleby(0)");
         return as_int(v, "divisibleby") % n == 0;
       }},
      {"eq", [](Renderer&, const Value& v, Arguments& a) { return test_compare(v, a, "=="); }},
      {"ne", [](Renderer&, const Value& v, Arguments& a) { return test_compare(v, a, "!="); }},
      {"lt", [](Renderer&, const Value& v, Arguments& a) { return test_compare(v, a, "<"); }},
      {"le", [](Renderer&, const Value& v, Arguments& a) { return test_compare(v, a, "<="); }},
      {"gt", [](Renderer&, const Value& v, Arguments& a) { return test_compare(v, a, ">"); }},
      {"ge", [](Renderer&, const Value& v, Arguments& a) { return test_compare(v, a, ">="); }},
      {"in", [](Renderer&, const Value& v, Arguments& a) { a.check(1, {}); return contains(a.get(0, "seq"), v); }},
      {"sameas", [](Renderer&, const Value& v, Arguments& a) {
         Value o = a.get(0, "other");
         if (v.is_dict() && o.is_dict()) return &v.dict() == &o.dict();
         if (v.is_list() && o.is_list()) return &v.list() == &o.list();
         return v.kind() == o.kind() && (v.is_none() || v.is_undefined() || (v.kind() == Value::Kind::boolean && v.boolean() == o.boolean()));
       }},
      {"lower", [](Renderer&, const Value& v, Arguments&) { return v.is_string() && lower(v.string()) == v.string(); }},
      {"upper", [](Renderer&, const Value& v, Arguments&) { return v.is_string() && upper(v.string()) == v.string(); }},
      {"filter", [](Renderer&, const Value& v, Arguments&) { return v.is_string() && has_filter(v.string()); }},
      {"test", [](Renderer&, const Value& v, Arguments&) { return v.is_string() && has_test(v.string()); }},
  };
  return kTests;
}

const std::map<std::string, std::string, std::less<>>& test_aliases() {
  static const std::map<std::string, std::string, std::less<>> kAliases = {
      {"equalto", "eq"}, {"==", "eq"}, {"!=", "ne"}, {"lessthan", "lt"}, {"<", "lt"}, {"<=", "le"},
      {"greaterthan", "gt"}, {">", "gt"}, {">=", "ge"}};
  return kAliases;
}

template <class Map>
auto find_named(const Map& table, const std::map<std::string, std::string, std::less<>>& aliases, const std::string& name) {
  auto it = table.find(name);
  if (it != table.end()) return it->second;
  auto alias = aliases.find(name);
  if (alias != aliases.end()) return table.at(alias->second);
  return static_cast<typename Map::mapped_type>(nullptr);
}

}  // namespace

bool has_filter(const std::string& name) { return find_named(filters(), filter_aliases(), name) != nullptr; }
bool has_test(const std::string& name) { return find_named(tests(), test_aliases(), name) != nullptr; }

Value Renderer::call_filter(const std::string& filter, const Value& operand, Arguments& args) {
  auto fn = find_named(filters(), filter_aliases(), filter);
  if (!fn) fail(fmt::format("no filter named '{}'", filter));
  args.callee = filter;
  return fn(*this, operand, args);
}

bool Renderer::call_test(const std::string& test, const Value& operand, Arguments& args) {
  auto fn = find_named(tests(), test_aliases(), test);
  if (!fn) fail(fmt::format("no test named '{}'", test));
  args.callee = test;
  return fn(*this, operand, args);
}

// ---------------------------------------------------------------------------------------
// Expressions
Value Literal::eval(Renderer&) const { return value; }
Value Name::eval(Renderer& r) const { return r.lookup(name); }

Value ListExpr::eval(Renderer& r) const {
  Value::List out;
  out.reserve(items.size());
  for (const auto& e : items) out.push_back(e->eval(r));
  return tuple ? Value::tuple(std::move(out)) : Value(std::move(out));
}

Value DictExpr::eval(Renderer& r) const {
  Value::Dict d;
  for (const auto& [k, v] : items) {
    Value key = k->eval(r);
    if (!key.is_string()) fail(fmt::format("dict keys must be strings here, got {}", key.type_name()));
    d.set(key.string(), v->eval(r));
  }
  return Value(std::move(d));
}

Value GetAttr::eval(Renderer& r) const { return r.get_attr(object->eval(r), attr); }
Value GetItem::eval(Renderer& r) const {
  Value obj = object->eval(r);
  return r.get_item(obj, index->eval(r));
}

Value Slice::eval(Renderer& r) const {
  Value obj = object->eval(r);
  auto opt = [&](const ExprPtr& e) { return e ? e->eval(r) : Value::none(); };
  Value a = opt(start), b = opt(stop), c = opt(step);
  if (obj.is_list()) {
    Value::List out;
    for (int64_t i : slice_indices(static_cast<int64_t>(obj.list().size()), a, b, c)) out.push_back(obj.list()[static_cast<size_t>(i)]);
    return Value(std::move(out));
  }
  if (obj.is_string()) {
    auto cps = code_points(obj.string());
    std::string out;
    for (int64_t i : slice_indices(static_cast<int64_t>(cps.size()) - 1, a, b, c)) {
      auto k = static_cast<size_t>(i);
      out.append(obj.string(), cps[k], cps[k + 1] - cps[k]);
    }
    return Value(std::move(out));
  }
  require_defined(obj);
  fail(fmt::format("'{}' object is not subscriptable", obj.type_name()));
}

Value Call::eval(Renderer& r) const {
  Value f = callee->eval(r);
  if (!f.is_function()) {
    require_defined(f);
    fail(fmt::format("'{}' object is not callable", f.type_name()));
  }
  Arguments a = evaluate(r, args, f.name());
  return f.function()(a);
}

Value FilterExpr::eval(Renderer& r) const {
  Value v = operand->eval(r);
  Arguments a = evaluate(r, args, filter);
  return r.call_filter(filter, v, a);
}

Value TestExpr::eval(Renderer& r) const {
  Value v = operand->eval(r);
  Arguments a = evaluate(r, args, test);
  return Value(r.call_test(test, v, a) != negated);
}

Value Unary::eval(Renderer& r) const {
  Value v = operand->eval(r);
  if (op == '!') return Value(!v.truthy());
  if (!v.is_number()) {
    require_defined(v);
    fail(fmt::format("bad operand type for unary {}: '{}'", op, v.type_name()));
  }
  if (op == '+') return v.kind() == Value::Kind::boolean ? Value(v.integer()) : v;
  if (v.kind() == Value::Kind::floating) return Value(-v.number());
  return Value(-v.integer());
}

namespace {
[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
}

Value repeat(const Value& seq, int64_t n) {
  n = std::max<int64_t>(n, 0);
  if (seq.is_string()) {
    if (static_cast<double>(seq.string().size()) * static_cast<double>(n) > static_cast<double>(kMaxOutputBytes))
      fail("a repeated string is over the output limit");
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.string();
    return Value(std::move(out));
  }
  if (static_cast<double>(seq.list().size()) * static_cast<double>(n) > 1e6) fail("a repeated list is over 1e6 items");
  Value::List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(out));
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value(a.str() + b.str());
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.string() + b.string());
    if (a.is_list() && b.is_list()) {
      Value::List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value(std::move(out));
    }
  }
  if (op == "*") {
    bool ai = a.kind() == Value::Kind::integer || a.kind() == Value::Kind::boolean;
    bool bi = b.kind() == Value::Kind::integer || b.kind() == Value::Kind::boolean;
    if ((a.is_string() || a.is_list()) && bi) return repeat(a, b.integer());
    if ((b.is_string() || b.is_list()) && ai) return repeat(b, a.integer());
  }
  if (!a.is_number() || !b.is_number()) bad_operands(op, a, b);
  bool floats = a.kind() == Value::Kind::floating || b.kind() == Value::Kind::floating;
  if (op == "/") {
    if (b.number() == 0) fail("division by zero");
    return Value(a.number() / b.number());
  }
  if (op == "**") {
    if (!floats && b.integer() >= 0) {
      int64_t out = 1;
      for (int64_t i = 0; i < b.integer() && i < 64; ++i) out *= a.integer();
      return Value(out);
    }
    return Value(std::pow(a.number(), b.number()));
  }
  if (floats) {
    double x = a.number(), y = b.number();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (y == 0) fail("float division by zero");
    if (op == "//") return Value(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(m);
  }
  int64_t x = a.integer(), y = b.integer();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (y == 0) fail("integer division or modulo by zero");
  int64_t q = x / y, m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) {
    --q;
    m += y;
  }
  return Value(op == "//" ? q : m);
}
}  // namespace

Value Binary::eval(Renderer& r) const {
  Value a = left->eval(r);
  if (op == "and") return a.truthy() ? right->eval(r) : a;
  if (op == "or") return a.truthy() ? a : right->eval(r);
  return arithmetic(op, a, right->eval(r));
}

Value Compare::eval(Renderer& r) const {
  Value a = first->eval(r);
  for (const auto& [op, e] : rest) {
    Value b = e->eval(r);
    bool ok;
    if (op == "==") ok = a.equals(b);
    else if (op == "!=") ok = !a.equals(b);
    else if (op == "in") ok = contains(b, a);
    else if (op == "notin") ok = !contains(b, a);
    else {
      int c = compare(a, b);
      ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!ok) return Value(false);
    a = std::move(b);
  }
  return Value(true);
}

Value Conditional::eval(Renderer& r) const {
  if (cond->eval(r).truthy()) return then->eval(r);
  return otherwise ? otherwise->eval(r) : Value::undefined();
}

// ---------------------------------------------------------------------------------------
// Statements
void Text::exec(Renderer&, std::string& out) const { out += text; }
void Output::exec(Renderer& r, std::string& out) const { out += expr->eval(r).str(); }

void Block::exec(Renderer& r, std::string& out) const {
  for (const auto& n : body) {
    try {
      n->exec(r, out);
    } catch (const TemplateError& e) {
      r.located(n->line, e);
    }
    if (out.size() > kMaxOutputBytes)
      throw LocatedError(fmt::format("{}:{}: the output is over {} MiB", r.name, n->line, kMaxOutputBytes >> 20));
    if (r.flow != Renderer::Flow::normal) return;
  }
}

void If::exec(Renderer& r, std::string& out) const {
  for (const auto& [cond, body] : branches) {
    bool taken;
    try {
      taken = cond->eval(r).truthy();
    } catch (const TemplateError& e) {
      r.located(cond->line, e);
    }
    if (taken) {
      body.exec(r, out);
      return;
    }
  }
  otherwise.exec(r, out);
}

namespace {
void bind_targets(Renderer& r, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    r.assign(targets[0], v);
    return;
  }
  if (!v.is_list()) fail(fmt::format("cannot unpack a {} into {} names", v.type_name(), targets.size()));
  if (v.list().size() != targets.size())
    fail(fmt::format("cannot unpack {} values into {} names", v.list().size(), targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) r.assign(targets[i], v.list()[i]);
}

// Swaps the renderer's frame for a new child (or another frame) for a scope's duration.
class ScopedFrame {
 public:
  ScopedFrame(Renderer& r, std::shared_ptr<Frame> parent) : r_(r), saved_(r.frame) {
    auto f = std::make_shared<Frame>();
    f->parent = std::move(parent);
    r_.frame = std::move(f);
  }
  ~ScopedFrame() { r_.frame = std::move(saved_); }
  ScopedFrame(const ScopedFrame&) = delete;
  ScopedFrame& operator=(const ScopedFrame&) = delete;

 private:
  Renderer& r_;
  std::shared_ptr<Frame> saved_;
};
}  // namespace

void For::exec(Renderer& r, std::string& out) const {
  std::vector<Value> items = iterate(iterable->eval(r));
  if (filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      ScopedFrame scope(r, r.frame);
      bind_targets(r, targets, item);
      if (filter->eval(r).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  auto n = static_cast<int64_t>(items.size());
  std::shared_ptr<Frame> outer = r.frame;
  for (int64_t i = 0; i < n; ++i) {
    r.count_iteration();
    ScopedFrame scope(r, outer);
    bind_targets(r, targets, items[static_cast<size_t>(i)]);
    Value::Dict loop;
    loop.set("index0", Value(i));
    loop.set("index", Value(i + 1));
    loop.set("revindex0", Value(n - i - 1));
    loop.set("revindex", Value(n - i));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == n - 1));
    loop.set("length", Value(n));
    loop.set("depth", Value(1));
    loop.set("depth0", Value(0));
    loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem"));
    loop.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem"));
    loop.set("cycle", Value(Function([i](Arguments& a) -> Value {
                              if (a.positional.empty()) fail("loop.cycle() needs at least one value");
                              return a.positional[static_cast<size_t>(i) % a.positional.size()];
                            }),
                            "loop.cycle"));
    r.assign("loop", Value(std::move(loop)));
    body.exec(r, out);
    if (r.flow == Renderer::Flow::brk) {
      r.flow = Renderer::Flow::normal;
      break;
    }
    r.flow = Renderer::Flow::normal;
  }
  if (n == 0) otherwise.exec(r, out);
}

void Set::exec(Renderer& r, std::string& out) const {
  (void)out;
  Value v = value->eval(r);
  if (!attr.empty()) {
    Value ns = r.lookup(targets[0]);
    if (!ns.is_dict() || !ns.dict().is_namespace) {
      require_defined(ns);
      fail(fmt::format("cannot assign attribute '{}' on '{}', a {} and not a namespace()", attr, targets[0], ns.type_name()));
    }
    ns.dict_mut().set(attr, std::move(v));
    return;
  }
  bind_targets(r, targets, v);
}

void SetBlock::exec(Renderer& r, std::string& out) const {
  (void)out;
  std::string captured;
  body.exec(r, captured);
  r.assign(target, Value(std::move(captured)));
}

void Macro::exec(Renderer& r, std::string& out) const {
  (void)out;
  std::weak_ptr<Frame> defined_in = r.frame;
  Renderer* renderer = &r;
  const Macro* self = this;
  r.assign(name, Value(Function([renderer, self, defined_in](Arguments& a) -> Value {
                         Renderer& rr = *renderer;
                         auto parent = defined_in.lock();
                         if (!parent) fail(fmt::format("macro '{}' is called outside the scope it was defined in", self->name));
                         if (a.positional.size() > self->params.size())
                           fail(fmt::format("macro '{}' takes {} arguments, got {}", self->name, self->params.size(), a.positional.size()));
                         if (rr.depth >= kMaxCallDepth) fail(fmt::format("macro calls nest deeper than {}", kMaxCallDepth));
                         ScopedFrame scope(rr, parent);
                         for (const auto& [k, v] : a.keywords) {
                           bool known = std::any_of(self->params.begin(), self->params.end(), [&](const auto& p) { return p.first == k; });
                           if (!known) fail(fmt::format("macro '{}' has no parameter '{}'", self->name, k));
                         }
                         for (size_t i = 0; i < self->params.size(); ++i) {
                           const auto& [pname, dflt] = self->params[i];
                           Value v = a.get(i, pname);
                           if (i >= a.positional.size()) {
                             bool given = std::any_of(a.keywords.begin(), a.keywords.end(), [&](const auto& kw) { return kw.first == pname; });
                             if (!given) v = dflt ? dflt->eval(rr) : Value::undefined(pname);
                           }
                           rr.assign(pname, std::move(v));
                         }
                         ++rr.depth;
                         std::string result;
                         try {
                           self->body.exec(rr, result);
                         } catch (...) {
                           --rr.depth;
                           throw;
                         }
                         --rr.depth;
                         return Value(std::move(result));
                       }),
                       name));
}

void FilterBlock::exec(Renderer& r, std::string& out) const {
  std::string captured;
  body.exec(r, captured);
  Value v(std::move(captured));
  for (const auto& f : chain) {
    Arguments a = evaluate(r, f->args, f->filter);
    v = r.call_filter(f->filter, v, a);
  }
  out += v.str();
}

void LoopControl::exec(Renderer& r, std::string& out) const {
  (void)out;
  r.flow = is_break ? Renderer::Flow::brk : Renderer::Flow::cont;
}

namespace {
// The global functions every template sees.
std::shared_ptr<Frame> builtins() {
  auto f = std::make_shared<Frame>();
  auto add = [&](const char* name, Function fn) { f->vars[name] = Value(std::move(fn), name); };
  add("range", [](Arguments& a) -> Value {
    a.check(3, {});
    if (a.positional.empty()) fail("range expected at least 1 argument");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = as_int(a.positional[0], "range()");
    } else {
      start = as_int(a.positional[0], "range()");
      stop = as_int(a.positional[1], "range()");
      if (a.positional.size() == 3) step = as_int(a.positional[2], "range()");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    Value::List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<int64_t>(out.size()) >= kMaxRange) fail(fmt::format("range() is over {} items", kMaxRange));
      out.emplace_back(i);
    }
    return Value(std::move(out));
  });
  // namespace(...) and dict(...): dicts' items, then keyword arguments.
  auto merged = [](Arguments& a, bool is_namespace) -> Value {
    Value::Dict d;
    d.is_namespace = is_namespace;
    for (const auto& p : a.positional) {
      if (!p.is_dict()) fail(fmt::format("{}() takes dicts and keyword arguments, got {}", a.callee, p.type_name()));
      for (const auto& [k, v] : p.dict().items) d.set(k, v);
    }
    for (const auto& [k, v] : a.keywords) d.set(k, v);
    return Value(std::move(d));
  };
  add("namespace", [merged](Arguments& a) { return merged(a, true); });
  add("dict", [merged](Arguments& a) { return merged(a, false); });
  add("raise_exception", [](Arguments& a) -> Value {
    fail(fmt::format("raise_exception: {}", a.get(0, "message", Value("")).str()));
  });
  add("strftime_now", [](Arguments& a) -> Value {
    a.check(1, {});
    std::string format = need_string(a.get(0, "format"), "strftime_now");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
    return Value(std::string(buf, n));
  });
  return f;
}
}  // namespace

}  // namespace detail

Template Template::parse(std::string_view source, std::string name) {
  Template t;
  t.name_ = std::move(name);
  t.body_ = detail::parse_template(source, t.name_);
  return t;
}

std::string Template::render(const Value& context) const {
  if (!context.is_dict() && !context.is_undefined())
    throw TemplateError(fmt::format("{}: the context must be a dict, got {}", name_, context.type_name()));
  auto globals = detail::builtins();
  if (context.is_dict())
    for (const auto& [k, v] : context.dict().items) globals->vars[k] = v;
  auto root = std::make_shared<detail::Frame>();
  root->parent = globals;
  detail::Renderer r(name_, root);
  std::string out;
  body_->exec(r, out);
  return out;
}

}  // namespace rlx::jinja
