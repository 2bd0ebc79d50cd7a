// The Jinja engine's Python semantics: truth-independent helpers (len, iteration, ordering,
// `in`, slicing), the methods of dict and list values, and attribute and item lookup as Jinja2
// does them (str and its methods are jinja_python_str.cpp's). Their work is charged to the
// render's budget: a step per item visited, a step per kBytesPerStep bytes scanned, and what
// they build checked before it is built.
#include <algorithm>

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

Value bound_method(Value self, std::string name, MethodFn fn) {
  std::string full = fmt::format("{}.{}", self.type_name(), name);
  return Value(Function([self = std::move(self), fn](Arguments& a) { return fn(self, a); }), full);
}

namespace {

Value dict_method(const Value& self, const std::string& name) {
  if (name == "items")
    return bound_method(self, name, [](const Value& d, Arguments& a) -> Value {
      a.check(0, {});
      Value::List out;
      for (const auto& [k, v] : d.dict().items) out.push_back(Value::tuple({Value(k), v}));
      return Value(std::move(out));
    });
  if (name == "keys")
    return bound_method(self, name, [](const Value& d, Arguments& a) -> Value {
      a.check(0, {});
      return Value(iterate(d));
    });
  if (name == "values")
    return bound_method(self, name, [](const Value& d, Arguments& a) -> Value {
      a.check(0, {});
      Value::List out;
      for (const auto& [k, v] : d.dict().items) out.push_back(v);
      return Value(std::move(out));
    });
  if (name == "get")
    return bound_method(self, name, [](const Value& d, Arguments& a) -> Value {
      a.check(2, {});
      Value key = a.get(0, "key");
      const Value* v = key.is_string() ? d.dict().find(key.string()) : nullptr;
      return v ? *v : a.get(1, "default", Value::none());
    });
  static const char* const kMutators[] = {"pop", "popitem", "update", "clear", "setdefault"};
  for (const char* m : kMutators)
    if (name == m)
      return bound_method(self, name, [](const Value&, Arguments& a) -> Value {
        fail(fmt::format("{}(): chat templates render in HF's immutable sandbox; it cannot modify a dict", a.callee));
      });
  return Value::undefined(name);
}

Value list_method(const Value& self, const std::string& name) {
  static const char* const kMutators[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  for (const char* m : kMutators)
    if (name == m)
      return bound_method(self, name, [](const Value&, Arguments& a) -> Value {
        fail(fmt::format("{}(): chat templates render in HF's immutable sandbox; it cannot modify a list", a.callee));
      });
  if (name == "index")
    return bound_method(self, name, [](const Value& l, Arguments& a) -> Value {
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
