// A Jinja engine for chat templates: the subset of Jinja2 that Hugging Face
// `chat_template`s use, with the settings `transformers` renders them under
// (sandboxed and immutable, `trim_blocks`, `lstrip_blocks`, loop controls, no
// autoescape, its own `tojson`). No C++ Jinja library is packaged for Debian.
//
// Covered: `{{ }}` / `{% %}` / `{# #}` with `-` and `+` whitespace control,
// `if`/`elif`/`else`, `for` (tuple targets, `if` filter, `else`, `loop.*`,
// `break`/`continue`), `set` (names, tuples, `namespace` attributes, blocks),
// `macro` with defaults and keyword arguments, `filter` blocks, `raw`,
// `generation` (rendered as its body); Python semantics for values, operators,
// slices, string/dict methods and `str()`/`repr()` output; the filters and tests
// that real templates call (see docs/CHAT.md for the list). Anything else is an
// error naming the template and line, never a silent difference.
//
//   auto t = rlx::chat::jinja::Template::parse("{% for m in messages %}{{ m.role }};{% endfor %}", "demo");
//   auto ctx = rlx::chat::jinja::Value::from_json(R"({"messages": [{"role": "user"}]})"_json);
//   t.render(ctx);  // "user;"
//
// A template downloaded with a model is untrusted: parsing and rendering are bounded
// (ParseLimits, RenderLimits) and a bound reached throws LimitError naming it and the line.
//
//   rlx::chat::jinja::RenderLimits limits;
//   limits.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
//   t.render(ctx, limits);  // LimitError "demo:1: ... (RenderLimits::deadline)" past it
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlx/core/error.hpp"

namespace rlx::chat::jinja {

// A template that cannot be parsed or rendered: the message starts with "NAME:LINE: ".
// `raise_exception(msg)` in a template throws it with the template's own message.
class TemplateError : public Error {
 public:
  using Error::Error;
};

// A bound of ParseLimits or RenderLimits was reached. The message names the template, the
// line and the field ("chat_template:3: ... (RenderLimits::max_steps)"); `limit()` is the
// field's name ("max_steps", "deadline", ...), for a server to tell a timeout from a bad template.
class LimitError : public TemplateError {
 public:
  LimitError(std::string message, std::string limit) : TemplateError(std::move(message)), limit_(std::move(limit)) {}
  const std::string& limit() const { return limit_; }

 private:
  std::string limit_;
};

// Bounds on parsing a template: its syntax tree must stay far from the stack's end in the
// parser, the renderer and its destructor. Real chat templates nest fewer than 20 levels.
struct ParseLimits {
  size_t max_template_bytes = 1u << 20;  // the source's size; real chat templates are a few KiB
  // Nesting of statement blocks, and the height of any expression's syntax tree: brackets,
  // operators, `not`, `-`, filters, attribute and item lookups and calls each add a level,
  // and so does each link of a chain (`a + b + c` is 3 deep, `x.a.b` 3). The parser takes
  // about 2.5 KiB of stack a bracket level (640 KiB at the bound, in a release build).
  int max_depth = 256;
  size_t max_nodes = 100'000;  // syntax-tree nodes (statements, expressions, text runs)
};

// Bounds on one render: a hostile template stops with a LimitError, whatever it does. The
// defaults are far above what real chat templates need over long conversations.
struct RenderLimits {
  size_t max_output_bytes = 64u << 20;  // the rendered text, and any text a set/filter block or macro captures
  // Any one value created: a string's bytes, a list's or dict's items at sizeof(Value) each.
  size_t max_value_bytes = 64u << 20;
  // All the values created in the render, added up (freed ones too): bounds memory and copying.
  size_t max_allocated_bytes = 1u << 30;
  // Work: one step per expression or statement evaluated, loop iteration, filter, test or
  // macro call, item a filter, loop or comparison visits, and 64 bytes created or scanned.
  // About 2 s of runaway work; Qwen3's template over 10,000 messages takes 1.3 million.
  int64_t max_steps = 20'000'000;
  int64_t max_iterations = 10'000'000;  // loop iterations, all loops together
  int max_call_depth = 64;              // macro calls in progress at once (recursion)
  // Expressions and statements in evaluation at once, macro bodies included: bounds the stack
  // the renderer uses (about 600 bytes a level in a release build: 640 KiB at the bound).
  int max_eval_depth = 1024;
  // When to give up (a server's request deadline): checked when the render starts and every
  // 1024 steps after. time_point::max(): none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

class Value;
struct Arguments;
using Function = std::function<Value(Arguments&)>;

// A Jinja value: Python's None, bool, int, float, str, list (and tuple), dict with string keys
// (insertion-ordered, like Python's), a callable (macro or built-in), or undefined. Lists and
// dicts are shared, as Python objects are.
class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, function };
  using List = std::vector<Value>;
  struct Dict {
    std::vector<std::pair<std::string, Value>> items;
    bool is_namespace = false;  // `namespace(...)`: its attributes may be assigned
    const Value* find(std::string_view key) const;
    void set(std::string key, Value v);
  };

  Value() = default;  // undefined
  static Value undefined(std::string name = {});
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(List l);
  static Value tuple(List l);  // a list that prints as Python's tuple: ('a', 1)
  Value(Dict d);
  Value(Function f, std::string name);
  // JSON nested deeper than kMaxDepth is an error (the conversion recurses once a level).
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  // Lists and dicts nest at most this deep (from JSON, or built by a template), so that every
  // walk over a value (printing, comparing, destroying) stays far from the stack's end.
  static constexpr int kMaxDepth = 256;

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_number() const { return kind_ == Kind::integer || kind_ == Kind::floating || kind_ == Kind::boolean; }
  bool is_list() const { return kind_ == Kind::list; }
  bool is_tuple() const { return kind_ == Kind::list && b_; }
  bool is_dict() const { return kind_ == Kind::dict; }
  bool is_function() const { return kind_ == Kind::function; }

  bool boolean() const { return b_; }
  int64_t integer() const { return i_; }
  double number() const;  // int, float or bool as a double
  const std::string& string() const { return *s_; }
  const List& list() const { return *l_; }
  const Dict& dict() const { return *d_; }
  Dict& dict_mut() { return *d_; }
  const Function& function() const { return *f_; }
  // For an undefined value, the name it was looked up by ("" if none); for a function, its name.
  const std::string& name() const { return name_; }

  bool truthy() const;
  // Python's str(): what `{{ v }}` prints (undefined prints nothing).
  std::string str() const;
  // Python's repr(): strings quoted as Python quotes them; what lists and dicts print inside.
  std::string repr() const;
  // json.dumps(v, ensure_ascii=False, indent=indent), keys in insertion order: HF's `tojson`.
  // indent < 0: one line with ", " and ": ". Throws for undefined values and functions.
  std::string to_json(int indent = -1) const;
  nlohmann::ordered_json json() const;
  // Python's ==: 1 == 1.0 == True, lists and dicts element by element.
  bool equals(const Value& other) const;
  const char* type_name() const;
  // Levels of lists and dicts: 0 for a scalar, 1 for [1, 2], 2 for [[1]]. A namespace holds no
  // namespace (see reaches_namespace) but its attributes may change: the actual depth of a
  // value holding one is at most depth() + kMaxDepth + 1.
  int depth() const { return depth_; }
  // Whether the value is, or holds, a namespace or a function (a function may hold any value):
  // what a namespace attribute may not be set to, so that no namespace reaches itself.
  bool reaches_namespace() const { return reaches_namespace_; }

 private:
  void measure();  // depth_ and reaches_namespace_ of a new list or dict, checked against the bounds

  Kind kind_ = Kind::undefined;
  bool b_ = false;
  bool reaches_namespace_ = false;
  int depth_ = 0;
  int64_t i_ = 0;
  double f_num_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<List> l_;
  std::shared_ptr<Dict> d_;
  std::shared_ptr<const Function> f_;
  std::string name_;
};

// What a call passes: positional values, then keyword values, in order.
struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  std::string callee;  // for error messages
  // The argument at `index` or named `name`; `fallback` when neither was passed.
  Value get(size_t index, std::string_view name, Value fallback = Value()) const;
  // Throws naming the callee when more than `max_positional` positional arguments were
  // passed or a keyword not in `known`.
  void check(size_t max_positional, std::initializer_list<std::string_view> known) const;
};

namespace detail {
struct Node;
}

class Template {
 public:
  // Parses `source`; `name` prefixes every error ("chat_template:12: ...").
  static Template parse(std::string_view source, std::string name = "template", const ParseLimits& limits = {});
  // Renders with `context` (a dict) as the global variables, after the built-ins
  // (`range`, `namespace`, `dict`, `raise_exception`, `strftime_now`, ...). Throws
  // LimitError when a bound of `limits` is reached, TemplateError for other errors.
  std::string render(const Value& context, const RenderLimits& limits = {}) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const detail::Node> body_;
};

}  // namespace rlx::chat::jinja
