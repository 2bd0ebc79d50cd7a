// The Jinja engine's filters and tests, by name (the ones chat templates call; docs/CHAT.md
// lists them), with Jinja2's aliases. Each call is a step of the render's budget; what a
// filter builds is checked against it before it is built.
#include <algorithm>
#include <cmath>
#include <map>

#include "chat/jinja_eval.hpp"
#include "chat/jinja_text.hpp"

namespace rlx::chat::jinja::detail {
namespace {

using FilterFn = Value (*)(Renderer&, const Value&, Arguments&);
using TestFn = bool (*)(Renderer&, const Value&, Arguments&);
using FilterTable = std::map<std::string, FilterFn, std::less<>>;

}  // namespace

namespace {


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

// Filters on a sequence's items as they stand: its ends, its length, a list or a reversed copy.
void add_sequence_filters(FilterTable& table) {
  table.insert({
      {"first",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         if (v.is_string() && !v.string().empty()) return Value(v.string().substr(0, code_point_length(v.string(), 0)));
         auto items = iterate(v);
         return items.empty() ? Value::undefined("first") : items.front();
       }},
      {"last",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         if (v.is_string() && !v.string().empty()) {
           const std::string& s = v.string();
           size_t at = s.size() - 1;  // the last code point starts at most 3 bytes from the end
           for (size_t back = std::min<size_t>(s.size(), 4); back >= 1; --back)
             if (code_point_length(s, s.size() - back) == back) {
               at = s.size() - back;
               break;
             }
           return Value(s.substr(at));
         }
         auto items = iterate(v);
         return items.empty() ? Value::undefined("last") : items.back();
       }},
      {"length",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         return Value(py_len(v));
       }},
      {"list",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         return Value(iterate(v));
       }},
      {"reverse",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         if (v.is_string()) {
           const std::string& s = v.string();
           auto cps = code_points(s);
           std::string out;
           out.reserve(s.size());
           for (size_t i = cps.size() - 1; i > 0; --i) out.append(s, cps[i - 1], cps[i] - cps[i - 1]);
           return Value(std::move(out));
         }
         auto items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value(std::move(items));
       }},
  });
}

// Filters that order items or drop repeats; like Jinja2's, they compare strings
// case-insensitively unless told otherwise.
void add_order_filters(FilterTable& table) {
  table.insert({
      {"max",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"case_sensitive", "attribute"});
         auto s = sorted_copy(r, iterate(v), false, a.get(0, "case_sensitive", Value(false)).truthy(),
                              a.get(1, "attribute"));
         return s.empty() ? Value::undefined("max") : s.back();
       }},
      {"min",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"case_sensitive", "attribute"});
         auto s = sorted_copy(r, iterate(v), false, a.get(0, "case_sensitive", Value(false)).truthy(),
                              a.get(1, "attribute"));
         return s.empty() ? Value::undefined("min") : s.front();
       }},
      {"sort",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(3, {"reverse", "case_sensitive", "attribute"});
         return Value(sorted_copy(r, iterate(v), a.get(0, "reverse", Value(false)).truthy(),
                                  a.get(1, "case_sensitive", Value(false)).truthy(), a.get(2, "attribute")));
       }},
      {"unique",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
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
  });
}

// Filters that apply something to each item of a sequence (an attribute, a filter, a test)
// and collect the results.
void add_per_item_filters(FilterTable& table) {
  table.insert({
      {"join",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"d", "attribute"});
         std::string sep = a.get(0, "d", Value("")).str();
         Value attr = a.get(1, "attribute");
         std::string out;
         bool first = true;
         for (const auto& item : iterate(v)) {
           std::string piece = (attr.is_undefined() ? item : attribute_path(r, item, attr)).str();
           check_size(out.size() + sep.size() + piece.size(), "a string made by join");
           if (!first) out += sep;
           out += piece;
           first = false;
         }
         return Value(std::move(out));
       }},
      {"map",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
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
      {"reject",
       [](Renderer& r, const Value& v, Arguments& a) -> Value { return Value(select_items(r, v, a, false, false)); }},
      {"rejectattr",
       [](Renderer& r, const Value& v, Arguments& a) -> Value { return Value(select_items(r, v, a, true, false)); }},
      {"select",
       [](Renderer& r, const Value& v, Arguments& a) -> Value { return Value(select_items(r, v, a, false, true)); }},
      {"selectattr",
       [](Renderer& r, const Value& v, Arguments& a) -> Value { return Value(select_items(r, v, a, true, true)); }},
      {"sum",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(2, {"attribute", "start"});
         Value attr = a.get(0, "attribute");
         Value total = a.get(1, "start", Value(0));
         for (const auto& item : iterate(v)) {
           Value x = attr.is_undefined() ? item : attribute_path(r, item, attr);
           if (!x.is_number() || !total.is_number())
             fail(fmt::format("sum: unsupported operand types {} and {}", total.type_name(), x.type_name()));
           if (x.kind() == Value::Kind::floating || total.kind() == Value::Kind::floating)
             total = Value(total.number() + x.number());
           else
             total = Value(total.integer() + x.integer());
         }
         return total;
       }},
  });
}

// Filters on dicts and on objects' attributes.
void add_mapping_filters(FilterTable& table) {
  table.insert({
      {"attr",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(1, {});
         return r.get_attr(v, need_string(a.get(0, "name"), "attr"));
       }},
      {"dictsort",
       [](Renderer& r, const Value& v, Arguments& a) -> Value {
         a.check(3, {"case_sensitive", "by", "reverse"});
         if (!v.is_dict()) fail(fmt::format("dictsort expects a dict, got {}", v.type_name()));
         bool by_value = a.get(1, "by", Value("key")).str() == "value";
         std::vector<Value> pairs;
         for (const auto& [k, x] : v.dict().items) pairs.push_back(Value::tuple({Value(k), x}));
         return Value(sorted_copy(r, std::move(pairs), a.get(2, "reverse", Value(false)).truthy(),
                                  a.get(0, "case_sensitive", Value(false)).truthy(), Value(by_value ? 1 : 0)));
       }},
      {"items",
       [](Renderer&, const Value& v, Arguments& a) -> Value {
         a.check(0, {});
         if (v.is_undefined()) return Value(Value::List{});
         if (!v.is_dict()) fail(fmt::format("items expects a dict, got {}", v.type_name()));
         Value::List out;
         for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple({Value(k), x}));
         return Value(std::move(out));
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
