// The Jinja engine's parser: the tokens of jinja_lexer.cpp become the syntax tree of
// jinja_ast.hpp, with Jinja2's grammar and operator precedence. The parser's recursion, the
// tree's height and its node count are bounded (ParseLimits): a template of 10,000 nested
// brackets or a chain of 10,000 `+` is an error, not a tree that the renderer and the
// destructors would recurse through to the stack's end.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "chat/jinja_ast.hpp"
#include "chat/jinja_lexer.hpp"

namespace rlx::chat::jinja::detail {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string_view source, const std::string& name, const ParseLimits& limits)
      : t_(std::move(tokens)), source_(source), name_(name), limits_(limits) {}

  std::unique_ptr<Block> run() {
    auto block = make<Block>();
    std::string end;
    *block = parse_until({}, &end);
    return block;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::text: return "text";
      case Tok::var_begin: return "'{{'";
      case Tok::var_end: return "'}}'";
      case Tok::block_begin: return "'{%'";
      case Tok::block_end: return "'%}'";
      case Tok::eof: return "the end of the template";
      case Tok::string: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw TemplateError(fmt::format("{}:{}: {}", name_, cur().line, what));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != Tok::name) fail(fmt::format("expected a name, got {}", describe(cur())));
    return t_[i_++].text;
  }
  void expect_block_end(const char* tag) {
    if (cur().type != Tok::block_end) fail(fmt::format("expected '%}}' to end '{}', got {}", tag, describe(cur())));
    ++i_;
  }
  template <class N>
  std::unique_ptr<N> make(int line = 0) {
    if (++nodes_ > limits_.max_nodes)
      limit_failed("max_nodes", fmt::format("the template has more than {} syntax-tree nodes", limits_.max_nodes));
    auto n = std::make_unique<N>();
    n->line = line > 0 ? line : cur().line;
    return n;
  }

  // ---- bounds
  [[noreturn]] void limit_failed(const char* limit, const std::string& what) const {
    size_t pos = std::min(cur().pos, source_.size());
    size_t line_start = source_.rfind('\n', pos == 0 ? 0 : pos - 1);
    size_t column = line_start == std::string_view::npos || pos == 0 ? pos + 1 : pos - line_start;
    throw LimitError(fmt::format("{}:{}: {} at column {} (ParseLimits::{})", name_, cur().line, what, column, limit), limit);
  }
  // One level of the parser's recursion (a block, a bracket, a `not` or a sign) while in scope.
  class Nested {
   public:
    Nested(Parser& p, int& depth, const char* what) : depth_(depth) {
      if (++depth_ > p.limits_.max_depth)
        p.limit_failed("max_depth", fmt::format("{} nest deeper than {} levels", what, p.limits_.max_depth));
    }
    ~Nested() { --depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    int& depth_;
  };
  // `n`'s height from its children's, checked: a left-associative chain grows its tree one
  // level per link without any recursion in the parser.
  void grow(Expr& n, const Expr* child) {
    if (child) n.height = std::max(n.height, child->height + 1);
    if (n.height > limits_.max_depth)
      limit_failed("max_depth", fmt::format("an expression nests deeper than {} levels", limits_.max_depth));
  }
  void grow(Expr& n, const CallArgs& args) {
    for (const auto& e : args.positional) grow(n, e.get());
    for (const auto& [k, e] : args.keywords) grow(n, e.get());
  }

  // Statements up to a block tag named in `ends` (which is consumed; its name goes to
  // *end), or to the end of the template when `ends` is empty.
  Block parse_until(std::initializer_list<const char*> ends, std::string* end) {
    Nested nested(*this, block_depth_, "statement blocks");
    Block block;
    block.line = cur().line;
    int open_line = cur().line;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::eof) {
        if (ends.size() == 0) return block;
        std::string list;
        for (const char* e : ends) list += (list.empty() ? "'" : " or '") + std::string(e) + "'";
        throw TemplateError(fmt::format("{}:{}: the template ended while looking for {} (block opened at line {})", name_,
                                        t.line, list, open_line));
      }
      if (t.type == Tok::text) {
        auto n = make<Text>();
        n->text = t.text;
        block.body.push_back(std::move(n));
        ++i_;
      } else if (t.type == Tok::var_begin) {
        ++i_;
        auto n = make<Output>();
        n->expr = parse_tuple();
        if (cur().type != Tok::var_end) fail(fmt::format("expected '}}}}', got {}", describe(cur())));
        ++i_;
        block.body.push_back(std::move(n));
      } else if (t.type == Tok::block_begin) {
        ++i_;
        std::string tag = expect_name();
        for (const char* e : ends)
          if (tag == e) {
            *end = tag;
            return block;
          }
        --i_;
        block.body.push_back(parse_statement());
      } else {
        fail(fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  NodePtr parse_statement() {
    std::string tag = cur().text;
    ++i_;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "filter") return parse_filter_block();
    if (tag == "break" || tag == "continue") {
      --i_;
      auto n = make<LoopControl>();
      ++i_;
      n->is_break = tag == "break";
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside a loop", tag));
      expect_block_end(tag.c_str());
      return n;
    }
    if (tag == "generation") {
      // transformers' AssistantTracker marks assistant tokens; the text is the body's.
      expect_block_end("generation");
      std::string end;
      auto n = make<Block>();
      *n = parse_until({"endgeneration"}, &end);
      expect_block_end("endgeneration");
      return n;
    }
    --i_;
    static const std::set<std::string> kKnown = {"extends", "include", "import", "from", "block", "call", "do", "with",
                                                 "autoescape", "trans"};
    if (kKnown.count(tag)) fail(fmt::format("the '{}' tag is not supported in chat templates", tag));
    fail(fmt::format("unknown tag '{}'", tag));
  }

  NodePtr parse_if() {
    auto n = make<If>();
    ExprPtr cond = parse_expression();
    expect_block_end("if");
    while (true) {
      std::string end;
      Block body = parse_until({"elif", "else", "endif"}, &end);
      n->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_expression();
        expect_block_end("elif");
        continue;
      }
      if (end == "else") {
        expect_block_end("else");
        n->otherwise = parse_until({"endif"}, &end);
      }
      expect_block_end("endif");
      return n;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    do {
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  NodePtr parse_for() {
    auto n = make<For>();
    n->targets = parse_targets();
    if (!skip_name("in")) fail(fmt::format("expected 'in' in 'for', got {}", describe(cur())));
    n->iterable = parse_tuple(/*with_condexpr=*/false);
    if (skip_name("if")) n->filter = parse_expression();
    if (is_name("recursive")) fail("recursive loops are not supported");
    expect_block_end("for");
    ++loop_depth_;
    std::string end;
    n->body = parse_until({"else", "endfor"}, &end);
    --loop_depth_;
    if (end == "else") {
      expect_block_end("else");
      n->otherwise = parse_until({"endfor"}, &end);
    }
    expect_block_end("endfor");
    return n;
  }

  NodePtr parse_set() {
    int line = cur().line;
    std::string first = expect_name();
    if (skip_op(".")) {
      auto n = make<Set>();
      n->line = line;
      n->targets = {first};
      n->attr = expect_name();
      expect_op("=");
      n->value = parse_tuple();
      expect_block_end("set");
      return n;
    }
    std::vector<std::string> targets = {first};
    while (skip_op(",")) targets.push_back(expect_name());
    if (skip_op("=")) {
      auto n = make<Set>();
      n->line = line;
      n->targets = std::move(targets);
      n->value = parse_tuple();
      expect_block_end("set");
      return n;
    }
    if (targets.size() != 1) fail("a block 'set' assigns one name");
    if (is_op("|")) fail("filters on a block 'set' are not supported");
    expect_block_end("set");
    auto n = make<SetBlock>();
    n->line = line;
    n->target = first;
    std::string end;
    n->body = parse_until({"endset"}, &end);
    expect_block_end("endset");
    return n;
  }

  NodePtr parse_macro() {
    auto n = make<Macro>();
    n->name = expect_name();
    expect_op("(");
    bool defaults = false;
    while (!is_op(")")) {
      std::string param = expect_name();
      ExprPtr def;
      if (skip_op("=")) {
        def = parse_expression();
        defaults = true;
      } else if (defaults) {
        fail(fmt::format("macro parameter '{}' without a default follows one with a default", param));
      }
      n->params.emplace_back(param, std::move(def));
      if (!skip_op(",")) break;
    }
    expect_op(")");
    expect_block_end("macro");
    int saved = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    n->body = parse_until({"endmacro"}, &end);
    loop_depth_ = saved;
    expect_block_end("endmacro");
    return n;
  }

  NodePtr parse_filter_block() {
    auto n = make<FilterBlock>();
    do {
      n->chain.push_back(parse_filter(nullptr));
    } while (skip_op("|"));
    expect_block_end("filter");
    std::string end;
    n->body = parse_until({"endfilter"}, &end);
    expect_block_end("endfilter");
    return n;
  }

  // ---- expressions, lowest precedence first
  ExprPtr parse_tuple(bool with_condexpr = true) {
    int line = cur().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto list = make<ListExpr>(line);
    list->tuple = true;
    grow(*list, first.get());
    list->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::var_end || cur().type == Tok::block_end || is_op(")") || is_name("if")) break;
      list->items.push_back(with_condexpr ? parse_expression() : parse_or());
      grow(*list, list->items.back().get());
    }
    return list;
  }

  ExprPtr parse_expression() {
    Nested nested(*this, expr_depth_, "expressions");
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto n = make<Conditional>();
      ++i_;
      n->then = std::move(e);
      n->cond = parse_or();
      if (skip_name("else")) n->otherwise = parse_expression();
      grow(*n, n->then.get());
      grow(*n, n->cond.get());
      grow(*n, n->otherwise.get());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto n = make<Binary>(line);
    n->op = std::move(op);
    grow(*n, l.get());
    grow(*n, r.get());
    n->left = std::move(l);
    n->right = std::move(r);
    return n;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      ++i_;
      e = binary("or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      ++i_;
      e = binary("and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Nested nested(*this, expr_depth_, "expressions");
      auto n = make<Unary>();
      ++i_;
      n->op = '!';
      n->operand = parse_not();
      grow(*n, n->operand.get());
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr e = parse_math1();
    std::unique_ptr<Compare> cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                                    cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == Tok::name && peek().text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make<Compare>(line);
        grow(*cmp, e.get());
        cmp->first = std::move(e);
      }
      cmp->rest.emplace_back(op, parse_math1());
      grow(*cmp, cmp->rest.back().second.get());
    }
    if (cmp) return cmp;
    return e;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = cur().line;
      ++i_;
      e = binary(op, std::move(e), parse_concat(), line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      ++i_;
      e = binary("~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = cur().line;
      ++i_;
      e = binary(op, std::move(e), parse_pow(), line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      ++i_;
      e = binary("**", std::move(e), parse_unary(true), line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Nested nested(*this, expr_depth_, "expressions");
      auto n = make<Unary>();
      n->op = cur().text[0];
      ++i_;
      n->operand = parse_unary(false);
      grow(*n, n->operand.get());
      e = std::move(n);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    if (t.type == Tok::name) {
      auto lit = make<Literal>();
      if (t.text == "true" || t.text == "True") lit->value = Value(true);
      else if (t.text == "false" || t.text == "False") lit->value = Value(false);
      else if (t.text == "none" || t.text == "None") lit->value = Value::none();
      else {
        auto n = make<Name>();
        n->name = t.text;
        ++i_;
        return n;
      }
      ++i_;
      return lit;
    }
    if (t.type == Tok::string) {
      auto lit = make<Literal>();
      std::string s;
      while (cur().type == Tok::string) s += t_[i_++].text;  // adjacent strings concatenate
      lit->value = Value(std::move(s));
      return lit;
    }
    if (t.type == Tok::integer || t.type == Tok::floating) {
      auto lit = make<Literal>();
      try {
        lit->value = t.type == Tok::integer ? Value(static_cast<int64_t>(std::stoll(t.text))) : Value(std::stod(t.text));
      } catch (const std::exception&) {
        fail(fmt::format("the number {} is out of range", t.text));
      }
      ++i_;
      return lit;
    }
    if (is_op("(")) {
      ++i_;
      if (skip_op(")")) {  // ()
        auto empty = make<ListExpr>();
        empty->tuple = true;
        return empty;
      }
      ExprPtr e = parse_tuple();
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      auto n = make<ListExpr>();
      ++i_;
      while (!is_op("]")) {
        n->items.push_back(parse_expression());
        grow(*n, n->items.back().get());
        if (!skip_op(",")) break;
      }
      expect_op("]");
      return n;
    }
    if (is_op("{")) {
      auto n = make<DictExpr>();
      ++i_;
      while (!is_op("}")) {
        ExprPtr k = parse_expression();
        expect_op(":");
        n->items.emplace_back(std::move(k), parse_expression());
        grow(*n, n->items.back().first.get());
        grow(*n, n->items.back().second.get());
        if (!skip_op(",")) break;
      }
      expect_op("}");
      return n;
    }
    fail(fmt::format("unexpected {}", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        ++i_;
        if (cur().type == Tok::integer) {
          auto n = make<GetItem>();
          grow(*n, e.get());
          n->object = std::move(e);
          auto lit = make<Literal>();
          try {
            lit->value = Value(static_cast<int64_t>(std::stoll(cur().text)));
          } catch (const std::exception&) {
            fail(fmt::format("the number {} is out of range", cur().text));
          }
          ++i_;
          n->index = std::move(lit);
          e = std::move(n);
          continue;
        }
        auto n = make<GetAttr>();
        grow(*n, e.get());
        n->object = std::move(e);
        n->attr = expect_name();
        e = std::move(n);
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    int line = cur().line;
    expect_op("[");
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (skip_op(":")) {
        if (++colons > 2) fail("a slice has at most two ':'");
        continue;
      }
      if (parts[colons]) fail(fmt::format("expected ']' or ':', got {}", describe(cur())));
      parts[colons] = parse_expression();
    }
    expect_op("]");
    if (colons == 0) {
      if (!parts[0]) fail("an empty subscript");
      auto n = make<GetItem>(line);
      grow(*n, object.get());
      grow(*n, parts[0].get());
      n->object = std::move(object);
      n->index = std::move(parts[0]);
      return n;
    }
    auto n = make<Slice>(line);
    for (const Expr* child : {object.get(), parts[0].get(), parts[1].get(), parts[2].get()}) grow(*n, child);
    n->object = std::move(object);
    n->start = std::move(parts[0]);
    n->stop = std::move(parts[1]);
    n->step = std::move(parts[2]);
    return n;
  }

  CallArgs parse_call_args() {
    CallArgs args;
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail("'*' and '**' arguments are not supported");
      if (cur().type == Tok::name && peek().type == Tok::op && peek().text == "=") {
        std::string key = t_[i_].text;
        i_ += 2;
        args.keywords.emplace_back(std::move(key), parse_expression());
      } else {
        if (!args.keywords.empty()) fail("a positional argument follows a keyword argument");
        args.positional.push_back(parse_expression());
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto n = make<Call>();
    n->callee = std::move(callee);
    n->args = parse_call_args();
    grow(*n, n->callee.get());
    grow(*n, n->args);
    return n;
  }

  std::unique_ptr<FilterExpr> parse_filter(ExprPtr operand) {
    auto n = make<FilterExpr>();
    n->operand = std::move(operand);
    n->filter = expect_name();
    if (!has_filter(n->filter)) {
      --i_;
      fail(fmt::format("no filter named '{}'", n->filter));
    }
    if (is_op("(")) n->args = parse_call_args();
    grow(*n, n->operand.get());
    grow(*n, n->args);
    return n;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (skip_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        auto n = make<TestExpr>();
        ++i_;
        n->operand = std::move(e);
        n->negated = skip_name("not");
        n->test = expect_name();
        if (!has_test(n->test)) {
          --i_;
          fail(fmt::format("no test named '{}'", n->test));
        }
        if (is_op("(")) {
          n->args = parse_call_args();
        } else if ((cur().type == Tok::name || cur().type == Tok::string || cur().type == Tok::integer ||
                    cur().type == Tok::floating || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if")) {
          if (is_name("is")) fail("tests cannot be chained with 'is'");
          n->args.positional.push_back(parse_postfix(parse_primary()));
        }
        grow(*n, n->operand.get());
        grow(*n, n->args);
        e = std::move(n);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  std::string_view source_;
  const std::string& name_;
  const ParseLimits& limits_;
  int loop_depth_ = 0;
  int block_depth_ = 0, expr_depth_ = 0;  // the parser's recursion: blocks, and brackets and prefixes
  size_t nodes_ = 0;
};


}  // namespace

std::unique_ptr<Block> parse_template(std::string_view source, const std::string& name, const ParseLimits& limits) {
  RLX_CHECK(limits.max_template_bytes > 0 && limits.max_depth > 0 && limits.max_nodes > 0,
            "{}: ParseLimits' bounds must be positive", name);
  if (source.size() > limits.max_template_bytes)
    throw LimitError(fmt::format("{}: the template is {} bytes, over the limit of {} (ParseLimits::max_template_bytes)", name,
                                 source.size(), limits.max_template_bytes),
                     "max_template_bytes");
  Parser parser(lex(source, name), source, name, limits);
  return parser.run();
}

}  // namespace rlx::chat::jinja::detail
