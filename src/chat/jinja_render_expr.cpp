// The Jinja engine's expressions, evaluated: names looked up through the frames, literals,
// attribute and item lookup, slices, calls, filters and tests, and Python's operators
// (arithmetic, comparisons, `in`, `and`/`or`). Every expression evaluated is a step of the
// render's budget and a level of its depth (RenderLimits).
#include <algorithm>
#include <cmath>

#include "chat/jinja_eval.hpp"
#include "chat/jinja_text.hpp"

namespace rlx::chat::jinja::detail {

Arguments evaluate_args(Renderer& r, const CallArgs& args, std::string callee) {
  Arguments a;
  a.callee = std::move(callee);
  for (const auto& e : args.positional) a.positional.push_back(e->eval(r));
  for (const auto& [k, e] : args.keywords) a.keywords.emplace_back(k, e->eval(r));
  return a;
}

// Expressions
Value Expr::eval(Renderer& r) const {
  Renderer::Level level(r, line);
  return evaluate(r);
}

Value Literal::evaluate(Renderer&) const { return value; }
Value Name::evaluate(Renderer& r) const { return r.lookup(name); }

Value ListExpr::evaluate(Renderer& r) const {
  Value::List out;
  out.reserve(items.size());
  for (const auto& e : items) out.push_back(e->eval(r));
  return tuple ? Value::tuple(std::move(out)) : Value(std::move(out));
}

Value DictExpr::evaluate(Renderer& r) const {
  Value::Dict d;
  for (const auto& [k, v] : items) {
    Value key = k->eval(r);
    if (!key.is_string()) fail(fmt::format("dict keys must be strings here, got {}", key.type_name()));
    d.set(key.string(), v->eval(r));
  }
  return Value(std::move(d));
}

Value GetAttr::evaluate(Renderer& r) const { return r.get_attr(object->eval(r), attr); }
Value GetItem::evaluate(Renderer& r) const {
  Value obj = object->eval(r);
  return r.get_item(obj, index->eval(r));
}

Value Slice::evaluate(Renderer& r) const {
  Value obj = object->eval(r);
  auto opt = [&](const ExprPtr& e) { return e ? e->eval(r) : Value::none(); };
  Value a = opt(start), b = opt(stop), c = opt(step);
  if (obj.is_list()) {
    Value::List out;
    for (int64_t i : slice_indices(static_cast<int64_t>(obj.list().size()), a, b, c))
      out.push_back(obj.list()[static_cast<size_t>(i)]);
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

Value Call::evaluate(Renderer& r) const {
  Value f = callee->eval(r);
  if (!f.is_function()) {
    require_defined(f);
    fail(fmt::format("'{}' object is not callable", f.type_name()));
  }
  Arguments a = evaluate_args(r, args, f.name());
  return f.function()(a);
}

Value FilterExpr::evaluate(Renderer& r) const {
  Value v = operand->eval(r);
  Arguments a = evaluate_args(r, args, filter);
  return r.call_filter(filter, v, a);
}

Value TestExpr::evaluate(Renderer& r) const {
  Value v = operand->eval(r);
  Arguments a = evaluate_args(r, args, test);
  return Value(r.call_test(test, v, a) != negated);
}

Value Unary::evaluate(Renderer& r) const {
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

// The size of `n` copies of `unit` bytes, saturating rather than overflowing.
size_t times(size_t unit, int64_t n) {
  auto count = static_cast<size_t>(n);
  if (unit != 0 && count > SIZE_MAX / unit) return SIZE_MAX;
  return unit * count;
}

Value repeat(const Value& seq, int64_t n) {
  n = std::max<int64_t>(n, 0);
  if (seq.is_string() ? seq.string().empty() : seq.list().empty()) n = 0;  // not 2^63 appends of nothing
  if (seq.is_string()) {
    check_size(times(seq.string().size(), n), "a repeated string");
    std::string out;
    out.reserve(seq.string().size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += seq.string();
    return Value(std::move(out));
  }
  check_size(times(seq.list().size() * sizeof(Value), n), "a repeated list");
  Value::List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(out));
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string out = a.str(), tail = b.str();
    check_size(out.size() + tail.size(), "a string joined with '~'");
    out += tail;
    return Value(std::move(out));
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(a.string().size() + b.string().size(), "a string joined with '+'");
      return Value(a.string() + b.string());
    }
    if (a.is_list() && b.is_list()) {
      check_items(a.list().size() + b.list().size(), "a list joined with '+'");
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

Value Binary::evaluate(Renderer& r) const {
  Value a = left->eval(r);
  if (op == "and") return a.truthy() ? right->eval(r) : a;
  if (op == "or") return a.truthy() ? a : right->eval(r);
  return arithmetic(op, a, right->eval(r));
}

Value Compare::evaluate(Renderer& r) const {
  Value a = first->eval(r);
  for (const auto& [op, e] : rest) {
    Value b = e->eval(r);
    bool ok;
    if (op == "==")
      ok = a.equals(b);
    else if (op == "!=")
      ok = !a.equals(b);
    else if (op == "in")
      ok = contains(b, a);
    else if (op == "notin")
      ok = !contains(b, a);
    else {
      int c = compare(a, b);
      ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!ok) return Value(false);
    a = std::move(b);
  }
  return Value(true);
}

Value Conditional::evaluate(Renderer& r) const {
  if (cond->eval(r).truthy()) return then->eval(r);
  return otherwise ? otherwise->eval(r) : Value::undefined();
}

}  // namespace rlx::chat::jinja::detail
