// The Jinja engine's filters and tests, by name (the ones chat templates call; docs/CHAT.md
// lists them), with Jinja2's aliases: the filters on text, numbers and any value here, those on
// a sequence's or a dict's items in jinja_filters_seq.cpp. Each call is a step of the render's
// budget; what a filter builds is checked against it before it is built.
#include <algorithm>
#include <cmath>
#include <map>

#include "chat/jinja_eval.hpp"
#include "chat/jinja_filters.hpp"
#include "chat/jinja_text.hpp"

namespace rlx::chat::jinja::detail {
namespace {

using TestFn = bool (*)(Renderer&, const Value&, Arguments&);

// Filters that change the case of text.
void add_case_filters(FilterTable& table) {
  table.insert({
      {"capitalize",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         return Value(capitalize(v.str()));
       }},
      {"lower",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         return Value(lower(v.str()));
       }},
      {"title",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         // Jinja's own title: words begin after '-', whitespace, '(', '{', '[' or '<'.
         std::string s = v.str(), out;
         bool start = true;
         for (char c : s) {
           bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
           out += static_cast<char>(sep     ? c
                                    : start ? std::toupper(static_cast<unsigned char>(c))
                                            : std::tolower(static_cast<unsigned char>(c)));
           start = sep;
         }
         return Value(std::move(out));
       }},
      {"upper",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         return Value(upper(v.str()));
       }},
  });
}

// Filters that edit text or measure it.
void add_text_filters(FilterTable& table) {
  table.insert({
      {"replace",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(3, {"old", "new", "count"});
         Value count = a.get(2, "count", Value::none());
         return Value(py_replace(v.str(), a.get(0, "old").str(), a.get(1, "new").str(),
                                 count.is_none() ? -1 : as_int(count, "count")));
       }},
      {"trim",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(1, {"chars"});
         return Value(py_strip(v.str(), a.get(0, "chars", Value::none()), true, true));
       }},
      {"indent",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(3, {"width", "first", "blank"});
         Value w = a.get(0, "width", Value(4));
         std::string ind =
             w.is_string() ? w.string()
                           : std::string(static_cast<size_t>(std::clamp<int64_t>(as_int(w, "width"), 0, 1024)), ' ');
         bool first = a.get(1, "first", Value(false)).truthy(), blank = a.get(2, "blank", Value(false)).truthy();
         Value lines_v = string_method(Value(v.str() + "\n"), "splitlines");
         Arguments none;
         Value lines = lines_v.function()(none);
         std::string out;
         const auto& ls = lines.list();
         for (size_t i = 0; i < ls.size(); ++i) {
           const std::string& l = ls[i].string();
           check_size(out.size() + 1 + ind.size() + l.size(), "a string made by indent");
           if (i) out += "\n";
           if (i > 0 && (blank || !l.empty())) out += ind;
           out += l;
         }
         if (first) {
           check_size(ind.size() + out.size(), "a string made by indent");
           out = ind + out;
         }
         return Value(std::move(out));
       }},
      {"wordcount",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         int64_t n = 0;
         bool in_word = false;
         const std::string text = v.str();
         charge_scan(text.size());
         for (char c : text) {
           bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value(n);
       }},
  });
}

// Filters on numbers, and the conversions of values to them.
void add_number_filters(FilterTable& table) {
  table.insert({
      {"abs",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         if (v.kind() == Value::Kind::floating) return Value(std::fabs(v.number()));
         return Value(static_cast<int64_t>(std::llabs(as_int(v, "abs"))));
       }},
      {"float",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
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
      {"int",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
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
      {"round",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(2, {"precision", "method"});
         if (!v.is_number()) fail(fmt::format("round expects a number, got {}", v.type_name()));
         double scale = std::pow(10.0, static_cast<double>(as_int(a.get(0, "precision", Value(0)), "precision")));
         std::string m = a.get(1, "method", Value("common")).str();
         double x = v.number() * scale;
         double y = m == "ceil"    ? std::ceil(x)
                    : m == "floor" ? std::floor(x)
                                   : std::nearbyint(x);  // Python rounds half to even
         if (m != "common" && m != "ceil" && m != "floor") fail("round: method must be 'common', 'ceil' or 'floor'");
         return Value(y / scale);
       }},
  });
}

// Filters any value takes: a default for it, and its text as printed, escaped or as JSON.
void add_value_filters(FilterTable& table) {
  table.insert({
      {"default",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(2, {"default_value", "boolean"});
         bool boolean = a.get(1, "boolean", Value(false)).truthy();
         if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value(""));
         return v;
       }},
      {"escape",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         return Value(html_escape(v.str()));
       }},
      {"safe",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         return v;
       }},
      {"string",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         return Value(v.str());
       }},
      {"tojson",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
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
  });
}

// Every filter by name, gathered from the families once, on first use. No two families name the
// same filter (insert() would keep the first).
const FilterTable& filters() {
  static const FilterTable kFilters = [] {
    FilterTable table;
    add_case_filters(table);
    add_text_filters(table);
    add_number_filters(table);
    add_sequence_filters(table);
    add_order_filters(table);
    add_per_item_filters(table);
    add_mapping_filters(table);
    add_value_filters(table);
    return table;
  }();
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
  budget.step();
  args.callee = filter;
  return fn(*this, operand, args);
}

bool Renderer::call_test(const std::string& test, const Value& operand, Arguments& args) {
  auto fn = find_named(tests(), test_aliases(), test);
  if (!fn) fail(fmt::format("no test named '{}'", test));
  budget.step();
  args.callee = test;
  return fn(*this, operand, args);
}

}  // namespace rlx::chat::jinja::detail
