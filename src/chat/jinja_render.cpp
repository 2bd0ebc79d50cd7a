// The Jinja engine's statements, executed: scopes as Jinja2 has them (a frame per loop
// iteration and per macro call; `set` writes the innermost frame; `namespace` objects carry
// values out), loops, macros, the built-in functions (range, namespace, dict,
// raise_exception, strftime_now) and Template's parse and render. Every statement executed is
// a step of the render's budget and a level of its depth (RenderLimits); expressions are
// jinja_render_expr.cpp's.
#include <algorithm>
#include <ctime>

#include "chat/jinja_eval.hpp"

namespace rlx::chat::jinja {
namespace detail {

// Statements
void Text::exec(Renderer&, std::string& out) const { out += text; }
void Output::exec(Renderer& r, std::string& out) const { out += expr->eval(r).str(); }

void Block::exec(Renderer& r, std::string& out) const {
  for (const auto& n : body) {
    try {
      Renderer::Level level(r, n->line);
      n->exec(r, out);
    } catch (const TemplateError& e) {
      r.located(n->line, e);
    }
    if (out.size() > r.limits().max_output_bytes) {
      r.budget.line = n->line;
      r.budget.exceeded("max_output_bytes", fmt::format("the output is over {} bytes", r.limits().max_output_bytes));
    }
    if (r.flow != Renderer::Flow::normal) return;
  }
}

void If::exec(Renderer& r, std::string& out) const {
  for (const auto& [cond, body] : branches) {
    bool taken;
    try {
      taken = cond->eval(r).truthy();
    } catch (const TemplateError& e) {
      r.located(cond->line, e);
    }
    if (taken) {
      body.exec(r, out);
      return;
    }
  }
  otherwise.exec(r, out);
}

namespace {
void bind_targets(Renderer& r, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    r.assign(targets[0], v);
    return;
  }
  if (!v.is_list()) fail(fmt::format("cannot unpack a {} into {} names", v.type_name(), targets.size()));
  if (v.list().size() != targets.size())
    fail(fmt::format("cannot unpack {} values into {} names", v.list().size(), targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) r.assign(targets[i], v.list()[i]);
}

// Swaps the renderer's frame for a new child (or another frame) for a scope's duration.
class ScopedFrame {
 public:
  ScopedFrame(Renderer& r, std::shared_ptr<Frame> parent) : r_(r), saved_(r.frame) {
    auto f = std::make_shared<Frame>();
    f->parent = std::move(parent);
    r_.frame = std::move(f);
  }
  ~ScopedFrame() { r_.frame = std::move(saved_); }
  ScopedFrame(const ScopedFrame&) = delete;
  ScopedFrame& operator=(const ScopedFrame&) = delete;

 private:
  Renderer& r_;
  std::shared_ptr<Frame> saved_;
};
}  // namespace

void For::exec(Renderer& r, std::string& out) const {
  std::vector<Value> items = iterate(iterable->eval(r));
  if (filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      ScopedFrame scope(r, r.frame);
      bind_targets(r, targets, item);
      if (filter->eval(r).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  auto n = static_cast<int64_t>(items.size());
  std::shared_ptr<Frame> outer = r.frame;
  for (int64_t i = 0; i < n; ++i) {
    r.count_iteration();
    ScopedFrame scope(r, outer);
    bind_targets(r, targets, items[static_cast<size_t>(i)]);
    RenderBudget::Uncharged evaluators_own(r.budget);  // the `loop` variable is not the template's to pay for
    Value::Dict loop;
    loop.set("index0", Value(i));
    loop.set("index", Value(i + 1));
    loop.set("revindex0", Value(n - i - 1));
    loop.set("revindex", Value(n - i));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == n - 1));
    loop.set("length", Value(n));
    loop.set("depth", Value(1));
    loop.set("depth0", Value(0));
    loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem"));
    loop.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem"));
    loop.set("cycle", Value(Function([i](Arguments& a) -> Value {
                              if (a.positional.empty()) fail("loop.cycle() needs at least one value");
                              return a.positional[static_cast<size_t>(i) % a.positional.size()];
                            }),
                            "loop.cycle"));
    r.assign("loop", Value(std::move(loop)));
    evaluators_own.end();
    body.exec(r, out);
    if (r.flow == Renderer::Flow::brk) {
      r.flow = Renderer::Flow::normal;
      break;
    }
    r.flow = Renderer::Flow::normal;
  }
  if (n == 0) otherwise.exec(r, out);
}

void Set::exec(Renderer& r, std::string& out) const {
  (void)out;
  Value v = value->eval(r);
  if (!attr.empty()) {
    Value ns = r.lookup(targets[0]);
    if (!ns.is_dict() || !ns.dict().is_namespace) {
      require_defined(ns);
      fail(fmt::format("cannot assign attribute '{}' on '{}', a {} and not a namespace()", attr, targets[0], ns.type_name()));
    }
    // The one mutation a template can make: were a namespace able to hold itself (or a value,
    // or a bound method, holding it), values could nest without end or never be freed.
    if (v.reaches_namespace())
      fail(fmt::format("cannot set {}.{} to a {} that is or holds a namespace or a function (it could hold itself)", targets[0],
                       attr, v.type_name()));
    ns.dict_mut().set(attr, std::move(v));
    return;
  }
  bind_targets(r, targets, v);
}

void SetBlock::exec(Renderer& r, std::string& out) const {
  (void)out;
  std::string captured;
  body.exec(r, captured);
  r.assign(target, Value(std::move(captured)));
}

void Macro::exec(Renderer& r, std::string& out) const {
  (void)out;
  std::weak_ptr<Frame> defined_in = r.frame;
  Renderer* renderer = &r;
  const Macro* self = this;
  r.assign(name, Value(Function([renderer, self, defined_in](Arguments& a) -> Value {
                         Renderer& rr = *renderer;
                         auto parent = defined_in.lock();
                         if (!parent) fail(fmt::format("macro '{}' is called outside the scope it was defined in", self->name));
                         if (a.positional.size() > self->params.size())
                           fail(fmt::format("macro '{}' takes {} arguments, got {}", self->name, self->params.size(), a.positional.size()));
                         rr.budget.step();
                         if (rr.depth >= rr.limits().max_call_depth)
                           rr.budget.exceeded("max_call_depth",
                                              fmt::format("macro calls nest deeper than {} (macro '{}')", rr.limits().max_call_depth, self->name));
                         ScopedFrame scope(rr, parent);
                         for (const auto& [k, v] : a.keywords) {
                           bool known = std::any_of(self->params.begin(), self->params.end(), [&](const auto& p) { return p.first == k; });
                           if (!known) fail(fmt::format("macro '{}' has no parameter '{}'", self->name, k));
                         }
                         for (size_t i = 0; i < self->params.size(); ++i) {
                           const auto& [pname, dflt] = self->params[i];
                           Value v = a.get(i, pname);
                           if (i >= a.positional.size()) {
                             bool given = std::any_of(a.keywords.begin(), a.keywords.end(), [&](const auto& kw) { return kw.first == pname; });
                             if (!given) v = dflt ? dflt->eval(rr) : Value::undefined(pname);
                           }
                           rr.assign(pname, std::move(v));
                         }
                         ++rr.depth;
                         std::string result;
                         try {
                           self->body.exec(rr, result);
                         } catch (...) {
                           --rr.depth;
                           throw;
                         }
                         --rr.depth;
                         return Value(std::move(result));
                       }),
                       name));
}

void FilterBlock::exec(Renderer& r, std::string& out) const {
  std::string captured;
  body.exec(r, captured);
  Value v(std::move(captured));
  for (const auto& f : chain) {
    Arguments a = evaluate_args(r, f->args, f->filter);
    v = r.call_filter(f->filter, v, a);
  }
  out += v.str();
}

void LoopControl::exec(Renderer& r, std::string& out) const {
  (void)out;
  r.flow = is_break ? Renderer::Flow::brk : Renderer::Flow::cont;
}

namespace {
// The global functions every template sees.
std::shared_ptr<Frame> builtins() {
  auto f = std::make_shared<Frame>();
  auto add = [&](const char* name, Function fn) { f->vars[name] = Value(std::move(fn), name); };
  add("range", [](Arguments& a) -> Value {
    a.check(3, {});
    if (a.positional.empty()) fail("range expected at least 1 argument");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = as_int(a.positional[0], "range()");
    } else {
      start = as_int(a.positional[0], "range()");
      stop = as_int(a.positional[1], "range()");
      if (a.positional.size() == 3) step = as_int(a.positional[2], "range()");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    Value::List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<int64_t>(out.size()) >= kMaxRange) fail(fmt::format("range() is over {} items", kMaxRange));
      out.emplace_back(i);
    }
    return Value(std::move(out));
  });
  // namespace(...) and dict(...): dicts' items, then keyword arguments.
  auto merged = [](Arguments& a, bool is_namespace) -> Value {
    Value::Dict d;
    d.is_namespace = is_namespace;
    for (const auto& p : a.positional) {
      if (!p.is_dict()) fail(fmt::format("{}() takes dicts and keyword arguments, got {}", a.callee, p.type_name()));
      for (const auto& [k, v] : p.dict().items) d.set(k, v);
    }
    for (const auto& [k, v] : a.keywords) d.set(k, v);
    return Value(std::move(d));
  };
  add("namespace", [merged](Arguments& a) { return merged(a, true); });
  add("dict", [merged](Arguments& a) { return merged(a, false); });
  add("raise_exception", [](Arguments& a) -> Value {
    fail(fmt::format("raise_exception: {}", a.get(0, "message", Value("")).str()));
  });
  add("strftime_now", [](Arguments& a) -> Value {
    a.check(1, {});
    std::string format = need_string(a.get(0, "format"), "strftime_now");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
    return Value(std::string(buf, n));
  });
  return f;
}
}  // namespace

}  // namespace detail

Template Template::parse(std::string_view source, std::string name, const ParseLimits& limits) {
  Template t;
  t.name_ = std::move(name);
  t.body_ = detail::parse_template(source, t.name_, limits);
  return t;
}

std::string Template::render(const Value& context, const RenderLimits& limits) const {
  if (!context.is_dict() && !context.is_undefined())
    throw TemplateError(fmt::format("{}: the context must be a dict, got {}", name_, context.type_name()));
  auto globals = detail::builtins();
  if (context.is_dict())
    for (const auto& [k, v] : context.dict().items) globals->vars[k] = v;
  auto root = std::make_shared<detail::Frame>();
  root->parent = globals;
  detail::Renderer r(name_, root, limits);
  std::string out;
  body_->exec(r, out);
  return out;
}

}  // namespace rlx::chat::jinja

