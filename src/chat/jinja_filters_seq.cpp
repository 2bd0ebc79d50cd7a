// The Jinja engine's filters on a sequence's or a dict's items: its ends, length and order,
// what each item maps to or passes (map, select, join, sum), and a dict's items sorted. Many
// take `attribute=`, a dotted path into each item. Gathered by filters() (jinja_filters.cpp).
#include <algorithm>

#include "chat/jinja_eval.hpp"
#include "chat/jinja_filters.hpp"
#include "chat/jinja_text.hpp"

namespace rlx::chat::jinja::detail {
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

std::vector<Value> sorted_copy(Renderer& r, std::vector<Value> items, bool reverse, bool case_sensitive,
                               const Value& attr) {
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

}  // namespace

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

}  // namespace rlx::chat::jinja::detail
