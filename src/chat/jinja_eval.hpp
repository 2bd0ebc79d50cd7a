// The Jinja engine's evaluator state and the Python semantics its parts share: the renderer
// (frames, control flow, bounds), value helpers (len, iteration, ordering, `in`, str
// methods), and the entry points of the filters, tests and methods. Internal to src/chat:
// jinja_python.cpp (values, methods), jinja_filters.cpp (filters, tests) and
// jinja_render.cpp (expressions, statements, built-in functions).
#pragma once

#include <fmt/format.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/jinja_ast.hpp"

namespace rlx::jinja::detail {

constexpr size_t kMaxOutputBytes = 64u << 20;  // a rendered conversation past this is a runaway template
constexpr int64_t kMaxIterations = 10'000'000;  // loop iterations in one render
constexpr int kMaxCallDepth = 64;               // nested macro calls
constexpr int64_t kMaxRange = 100'000;          // Jinja2's sandbox limit

// An error already prefixed with its template and line: outer statements pass it through.
class LocatedError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

[[noreturn]] inline void fail(const std::string& what) { throw TemplateError(what); }

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};

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

// ---- Python's rules for values (jinja_python.cpp)
std::string undefined_message(const Value& v);
void require_defined(const Value& v);
int64_t as_int(const Value& v, const char* what);
std::vector<Value> chars_of(const std::string& s);  // a string's code points
int64_t py_len(const Value& v);
std::vector<Value> iterate(const Value& v);  // list items, dict keys, characters; none for undefined
int compare(const Value& a, const Value& b);  // Python's ordering
bool contains(const Value& container, const Value& item);  // `in`
std::string lower(const std::string& s);
std::string upper(const std::string& s);
bool py_space(char c);
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
Value py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
std::string capitalize(const std::string& s);
std::string html_escape(const std::string& s);
const std::string& need_string(const Value& v, const char* what);
std::vector<int64_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v);
// A str method bound to `self` (undefined when there is none of that name).
Value string_method(const Value& self, const std::string& name);

// A call's arguments, evaluated (jinja_render.cpp).
Arguments evaluate(Renderer& r, const CallArgs& args, std::string callee);

}  // namespace rlx::jinja::detail
