// The Jinja engine's parser, the template's side: its block structure (text, `{{ }}` output
// and `{% %}` tags up to the tag that closes them) and its statements, and parse_template,
// the entry point. The expressions inside them are jinja_parse_expr.cpp's. The parser's
// recursion, the tree's height and its node count are bounded (ParseLimits): a template of
// 10,000 nested blocks or brackets is an error, not a tree that the renderer and the
// destructors would recurse through to the stack's end.
#include <fmt/format.h>

#include <set>

#include "chat/jinja_parser.hpp"

namespace rlx::chat::jinja::detail {

Block Parser::parse_until(std::initializer_list<const char*> ends, std::string* end) {
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

NodePtr Parser::parse_statement() {
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
  static const std::set<std::string> kKnown = {"extends", "include", "import", "from",       "block",
                                               "call",    "do",      "with",   "autoescape", "trans"};
  if (kKnown.count(tag)) fail(fmt::format("the '{}' tag is not supported in chat templates", tag));
  fail(fmt::format("unknown tag '{}'", tag));
}

NodePtr Parser::parse_if() {
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

std::vector<std::string> Parser::parse_targets() {
  std::vector<std::string> names;
  bool paren = skip_op("(");
  do {
    names.push_back(expect_name());
  } while (skip_op(","));
  if (paren) expect_op(")");
  return names;
}

NodePtr Parser::parse_for() {
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

NodePtr Parser::parse_set() {
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

NodePtr Parser::parse_macro() {
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

NodePtr Parser::parse_filter_block() {
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
