// The Jinja engine's evaluator state and the Python semantics its parts share: the renderer
// (frames, control flow, the render's budget), value helpers (len, iteration, ordering, `in`, str
// methods), and the entry points of the filters, tests and methods. Internal to src/chat:
// jinja_python.cpp (values, dict and list methods), jinja_python_str.cpp (str and its methods),
// jinja_filters.cpp and jinja_filters_seq.cpp (filters, tests), jinja_render_expr.cpp
// (expressions) and jinja_render.cpp (statements, built-in functions).
#pragma once

#include <fmt/format.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/jinja_ast.hpp"
#include "chat/jinja_budget.hpp"

namespace rlx::chat::jinja::detail {

constexpr int64_t kMaxRange = 100'000;  // Jinja2's sandbox limit

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
  // Installs the render's budget on this thread for the renderer's lifetime.
  Renderer(std::string name, std::shared_ptr<Frame> root, const RenderLimits& limits)
      : name(std::move(name)), budget(limits, this->name), frame(std::move(root)) {}

  std::string name;
  RenderBudget budget;
  std::shared_ptr<Frame> frame;
  enum class Flow { normal, brk, cont } flow = Flow::normal;
  int depth = 0;       // macro calls in progress
  int eval_depth = 0;  // expressions and statement blocks in evaluation
  int64_t iterations = 0;

  const RenderLimits& limits() const { return budget.limits(); }

  // A level of evaluation at `line` while in scope: a step, and one level of eval_depth.
  class Level {
   public:
    Level(Renderer& r, int line) : r_(r) {
      r.budget.line = line;
      r.budget.step();
      if (r.eval_depth >= r.limits().max_eval_depth)
        r.budget.exceeded("max_eval_depth",
                          fmt::format("expressions and statements nest deeper than {} levels", r.limits().max_eval_depth));
      ++r.eval_depth;
    }
    ~Level() { --r_.eval_depth; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;

   private:
    Renderer& r_;
  };

  Value lookup(const std::string& n) const {
    for (const Frame* f = frame.get(); f; f = f->parent.get()) {
      auto it = f->vars.find(n);
      if (it != f->vars.end()) return it->second;
    }
    return Value::undefined(n);
  }
  void assign(const std::string& n, Value v) { frame->vars[n] = std::move(v); }

  // Rethrows `e` prefixed with the template and `line`, unless it already names them.
  [[noreturn]] void located(int line, const std::exception& e) const {
    if (dynamic_cast<const LocatedError*>(&e) || dynamic_cast<const LimitError*>(&e)) throw;
    throw LocatedError(fmt::format("{}:{}: {}", name, line, e.what()));
  }

  void count_iteration() {
    budget.step();
    if (++iterations > limits().max_iterations)
      budget.exceeded("max_iterations", fmt::format("more than {} loop iterations in one render", limits().max_iterations));
  }

  Value get_attr(const Value& obj, const std::string& attr);
  Value get_item(const Value& obj, const Value& index);
  Value call_filter(const std::string& filter, const Value& operand, Arguments& args);
  bool call_test(const std::string& test, const Value& operand, Arguments& args);
};

// ---- Python's rules for values (jinja_python.cpp, str in jinja_python_str.cpp)
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
// A method of a str, list or dict value, called with the value it is bound to.
using MethodFn = Value (*)(const Value& self, Arguments& args);
// `fn` bound to `self`: a function named "TYPE.NAME".
Value bound_method(Value self, std::string name, MethodFn fn);
// A str method bound to `self` (undefined when there is none of that name).
Value string_method(const Value& self, const std::string& name);

// A call's arguments, evaluated (jinja_render_expr.cpp).
Arguments evaluate_args(Renderer& r, const CallArgs& args, std::string callee);

}  // namespace rlx::chat::jinja::detail
