// Values of the Jinja engine with Python's semantics: construction (from C++ and from JSON),
// truth, equality, str(), repr() and the JSON a value converts to. Inside a render, every value
// created, printed or compared is charged to the render's budget (jinja_budget.hpp), and lists
// and dicts nest at most Value::kMaxDepth deep. The text rules they print with (float and string
// repr, json.dumps) are jinja_text.cpp's.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "chat/jinja_budget.hpp"
#include "chat/jinja_text.hpp"
#include "rlx/chat/jinja.hpp"

namespace rlx::chat::jinja {

using detail::charge_scan;
using detail::charge_steps;
using detail::check_size;

namespace {
// A dict lookup is a linear search: charged a step per key tried and the bytes compared.
template <class Items>
auto find_item(Items& items, std::string_view key) -> decltype(&items[0]) {
  size_t tried = 0, compared = 0;
  decltype(&items[0]) found = nullptr;
  for (auto& item : items) {
    ++tried;
    if (item.first.size() != key.size()) continue;
    compared += key.size();
    if (item.first == key) {
      found = &item;
      break;
    }
  }
  charge_steps(static_cast<int64_t>(tried + compared / detail::kBytesPerStep));
  return found;
}
}  // namespace

const Value* Value::Dict::find(std::string_view key) const {
  const auto* item = find_item(items, key);
  return item ? &item->second : nullptr;
}

void Value::Dict::set(std::string key, Value v) {
  if (auto* item = find_item(items, key)) item->second = std::move(v);
  else items.emplace_back(std::move(key), std::move(v));
}

Value Value::undefined(std::string name) {
  Value v;
  v.name_ = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::none;
  return v;
}
Value::Value(bool b) : kind_(Kind::boolean), b_(b), i_(b ? 1 : 0) {}
Value::Value(int64_t i) : kind_(Kind::integer), i_(i) {}
Value::Value(double d) : kind_(Kind::floating), f_num_(d) {}
Value::Value(std::string s) : kind_(Kind::string) {
  detail::charge_value(s.size(), "a string");
  s_ = std::make_shared<const std::string>(std::move(s));
}
Value::Value(List l) : kind_(Kind::list) {
  detail::charge_value(l.size() * sizeof(Value), "a list");
  l_ = std::make_shared<List>(std::move(l));
  measure();
}
Value Value::tuple(List l) {
  Value v(std::move(l));
  v.b_ = true;
  return v;
}
Value::Value(Dict d) : kind_(Kind::dict) {
  size_t bytes = d.items.size() * sizeof(d.items[0]);
  for (const auto& item : d.items) bytes += item.first.size();
  detail::charge_value(bytes, "a dict");
  d_ = std::make_shared<Dict>(std::move(d));
  measure();
}
// A function may hold any value (a bound method holds its object): it counts as reaching a namespace.
Value::Value(Function f, std::string name)
    : kind_(Kind::function),
      reaches_namespace_(true),
      f_(std::make_shared<const Function>(std::move(f))),
      name_(std::move(name)) {}

void Value::measure() {
  int deepest = 0;
  bool reaches = kind_ == Kind::dict && d_->is_namespace;
  auto visit = [&](const Value& v) {
    deepest = std::max(deepest, v.depth_);
    reaches = reaches || v.reaches_namespace_;
  };
  if (kind_ == Kind::list)
    for (const auto& v : *l_) visit(v);
  else
    for (const auto& item : d_->items) visit(item.second);
  charge_steps(static_cast<int64_t>(kind_ == Kind::list ? l_->size() : d_->items.size()));
  depth_ = deepest + 1;
  reaches_namespace_ = reaches;
  if (depth_ > kMaxDepth)
    throw TemplateError(fmt::format("a {} nests deeper than {} levels (Value::kMaxDepth)", type_name(), kMaxDepth));
}

namespace {
// Recurses once a level of `j`: bounded by Value::kMaxDepth whoever built `j`.
template <class Json>
Value value_from_json(const Json& j, int depth) {
  if ((j.is_array() || j.is_object()) && depth >= Value::kMaxDepth)
    throw TemplateError(fmt::format("a JSON value nests deeper than {} levels (Value::kMaxDepth)", Value::kMaxDepth));
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Value::List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(value_from_json(e, depth + 1));
      return Value(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Value::Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), value_from_json(it.value(), depth + 1));
      return Value(std::move(d));
    }
    default: throw TemplateError(fmt::format("a JSON value of type {} has no Jinja value", j.type_name()));
  }
}
}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j, 0); }
Value Value::from_json(const nlohmann::json& j) { return value_from_json(j, 0); }

double Value::number() const {
  if (kind_ == Kind::floating) return f_num_;
  return static_cast<double>(i_);
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return b_;
    case Kind::integer: return i_ != 0;
    case Kind::floating: return f_num_ != 0.0;
    case Kind::string: return !s_->empty();
    case Kind::list: return !l_->empty();
    case Kind::dict: return !d_->items.empty();
    case Kind::function: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::undefined: return "undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return "list";
    case Kind::dict: return d_->is_namespace ? "Namespace" : "dict";
    case Kind::function: return "function";
  }
  return "?";
}

namespace {
// repr() into one buffer, its size checked as it grows: a list that holds one long string
// many times prints longer than any value it holds.
void repr_to(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::string: python_repr_to(out, v.string()); break;
    case Value::Kind::list: {
      const auto& l = v.list();
      charge_steps(static_cast<int64_t>(l.size()));
      out += v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += ", ";
        repr_to(out, l[i]);
        check_size(out.size(), "a printed list");
      }
      if (v.is_tuple()) out += l.size() == 1 ? ",)" : ")";
      else out += "]";
      break;
    }
    case Value::Kind::dict: {
      if (v.dict().is_namespace) {
        out += "<Namespace>";
        break;
      }
      const auto& items = v.dict().items;
      charge_steps(static_cast<int64_t>(items.size()));
      out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        python_repr_to(out, items[i].first);
        out += ": ";
        repr_to(out, items[i].second);
        check_size(out.size(), "a printed dict");
      }
      out += "}";
      break;
    }
    default: out += v.repr();
  }
}
}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::undefined: return {};
    case Kind::string: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::undefined: return {};
    case Kind::none: return "None";
    case Kind::boolean: return b_ ? "True" : "False";
    case Kind::integer: return std::to_string(i_);
    case Kind::floating: return python_float(f_num_);
    case Kind::string:
    case Kind::list:
    case Kind::dict: {
      std::string out;
      repr_to(out, *this);
      return out;
    }
    case Kind::function: return fmt::format("<function {}>", name_);
  }
  return {};
}

std::string Value::to_json(int indent) const {
  JsonStyle style;
  style.indent = indent;
  return json_dumps(*this, style);
}

nlohmann::ordered_json Value::json() const {
  switch (kind_) {
    case Kind::none: return nullptr;
    case Kind::boolean: return b_;
    case Kind::integer: return i_;
    case Kind::floating: return f_num_;
    case Kind::string: return *s_;
    case Kind::list: {
      auto a = nlohmann::ordered_json::array();
      for (const auto& e : *l_) a.push_back(e.json());
      return a;
    }
    case Kind::dict: {
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : d_->items) o[k] = e.json();
      return o;
    }
    case Kind::undefined: throw TemplateError(fmt::format("'{}' is undefined", name_));
    case Kind::function: throw TemplateError(fmt::format("a function ({}) has no JSON value", name_));
  }
  return nullptr;
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ != Kind::floating && o.kind_ != Kind::floating) return i_ == o.i_;
    return number() == o.number();
  }
  if (kind_ != o.kind_) return false;
  charge_steps(1);
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return true;
    case Kind::string:
      if (s_->size() == o.s_->size()) charge_scan(s_->size());
      return *s_ == *o.s_;
    case Kind::list: {
      if (l_->size() != o.l_->size()) return false;
      for (size_t i = 0; i < l_->size(); ++i)
        if (!(*l_)[i].equals((*o.l_)[i])) return false;
      return true;
    }
    case Kind::dict: {
      if (d_ == o.d_) return true;
      if (d_->is_namespace || o.d_->is_namespace || d_->items.size() != o.d_->items.size()) return false;
      for (const auto& [k, v] : d_->items) {
        const Value* other = o.d_->find(k);
        if (!other || !v.equals(*other)) return false;
      }
      return true;
    }
    case Kind::function: return f_ == o.f_;
    default: return false;
  }
}

}  // namespace rlx::chat::jinja
