// Values of the Jinja engine with Python's semantics: truth, equality, str(), repr(), and
// json.dumps as Hugging Face's `tojson` calls it. Inside a render, every value created,
// printed or compared is charged to the render's budget (jinja_budget.hpp), and lists and
// dicts nest at most Value::kMaxDepth deep.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
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

void python_repr_to(std::string& out, std::string_view s) {
  charge_scan(s.size());
  char quote = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) quote = '"';
  out += quote;
  for (size_t i = 0; i < s.size(); ++i) {
    check_growing(out, i, "a printed string");
    char c = s[i];
    auto u = static_cast<unsigned char>(c);
    if (c == '\\') out += "\\\\";
    else if (c == quote) out += fmt::format("\\{}", c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  out += quote;
}

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

std::string python_repr(std::string_view s) {
  std::string out;
  python_repr_to(out, s);
  return out;
}

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
  for (size_t i = 0; i < s.size(); i += static_cast<unsigned char>(s[i]) < 0x80 ? 1 : code_point_length(s, i)) starts.push_back(i);
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
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
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
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.boolean() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.integer()); return;
    case Value::Kind::floating: {
      double d = v.number();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
      else out += python_float(d);
      return;
    }
    case Value::Kind::string: json_string(out, v.string(), style.ensure_ascii); return;
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
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a].first < items[b].first; });
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
