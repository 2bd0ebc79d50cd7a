// The Jinja engine's lexer and parser, with the settings Hugging Face renders chat templates
// under: `trim_blocks` (the newline after a block or comment tag is dropped), `lstrip_blocks`
// (spaces before a block or comment tag at the start of a line are dropped), `-`/`+` markers,
// and no trailing newline kept. The grammar and operator precedence are Jinja2's.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "chat/jinja_ast.hpp"

namespace rlx::jinja::detail {
namespace {

enum class Tok { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type;
  std::string text;
  int line;
};

constexpr size_t kMaxTemplateBytes = 1 << 20;  // real chat templates are a few KiB

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& name) : src_(src), name_(name) {}

  std::vector<Token> run() {
    // keep_trailing_newline = False: one final newline of the source is not output.
    if (!src_.empty() && src_.back() == '\n') {
      src_.remove_suffix(1);
      if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
    }
    size_t pos = 0;
    bool strip_next = false, trim_next = false;
    while (pos <= src_.size()) {
      size_t start = find_tag(pos);
      size_t text_begin = pos, text_end = start == npos ? src_.size() : start;
      if (strip_next) {
        while (text_begin < text_end && is_space(src_[text_begin])) ++text_begin;
      } else if (trim_next) {
        if (src_.compare(text_begin, 2, "\r\n") == 0 && text_begin + 2 <= text_end) text_begin += 2;
        else if (text_begin < text_end && src_[text_begin] == '\n') ++text_begin;
      }
      strip_next = trim_next = false;
      if (start == npos) {
        emit_text(text_begin, text_end);
        break;
      }
      char kind = src_[start + 1];
      char marker = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (marker == '-') {
        while (text_end > text_begin && is_space(src_[text_end - 1])) --text_end;
      } else if (kind != '{' && marker != '+') {
        size_t j = text_end;
        while (j > text_begin && (src_[j - 1] == ' ' || src_[j - 1] == '\t')) --j;
        if (j == 0 || src_[j - 1] == '\n') text_end = j;
      }
      emit_text(text_begin, text_end);
      size_t body = start + 2 + ((marker == '-' || marker == '+') ? 1 : 0);
      if (kind == '#') {
        size_t end = src_.find("#}", body);
        if (end == npos) fail(line_at(start), "a comment is not closed with '#}'");
        strip_next = end > body && src_[end - 1] == '-';
        trim_next = !strip_next && !(end > body && src_[end - 1] == '+');
        pos = end + 2;
        continue;
      }
      bool block = kind == '%';
      tokens_.push_back({block ? Tok::block_begin : Tok::var_begin, "", line_at(start)});
      size_t first_token = tokens_.size();
      pos = lex_tag(body, block, strip_next, trim_next);
      if (block && tokens_.size() == first_token + 2 && tokens_[first_token].text == "raw")
        pos = lex_raw(pos, strip_next, trim_next);
    }
    tokens_.push_back({Tok::eof, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  static constexpr size_t npos = std::string_view::npos;

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != npos && i + 1 < src_.size(); i = src_.find('{', i + 1)) {
      char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
    }
    return npos;
  }

  int line_at(size_t pos) {
    // Lines are counted incrementally: positions only move forward.
    pos = std::min(pos, src_.size());
    if (pos < counted_to_) {
      counted_to_ = 0;
      counted_line_ = 1;
    }
    counted_line_ += static_cast<int>(std::count(src_.begin() + static_cast<long>(counted_to_), src_.begin() + static_cast<long>(pos), '\n'));
    counted_to_ = pos;
    return counted_line_;
  }

  void emit_text(size_t begin, size_t end) {
    if (end > begin) tokens_.push_back({Tok::text, std::string(src_.substr(begin, end - begin)), line_at(begin)});
  }

  [[noreturn]] void fail(int line, const std::string& what) const {
    throw TemplateError(fmt::format("{}:{}: {}", name_, line, what));
  }

  // Tokens of a tag's expression up to its end delimiter; returns the position after it.
  size_t lex_tag(size_t i, bool block, bool& strip_next, bool& trim_next) {
    const char* close = block ? "%}" : "}}";
    int open_line = line_at(i);
    while (true) {
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (i >= src_.size()) fail(open_line, fmt::format("a tag is not closed with '{}'", close));
      if (src_.compare(i, 2, close) == 0 || ((src_[i] == '-' || src_[i] == '+') && src_.compare(i + 1, 2, close) == 0)) {
        char marker = src_[i] == '-' || src_[i] == '+' ? src_[i] : '\0';
        if (marker == '+' && !block) fail(line_at(i), "'+' before '}}' is not allowed");
        tokens_.push_back({block ? Tok::block_end : Tok::var_end, "", line_at(i)});
        strip_next = marker == '-';
        trim_next = block && marker == '\0';
        return i + (marker ? 3 : 2);
      }
      int line = line_at(i);
      char c = src_[i];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        tokens_.push_back({Tok::name, std::string(src_.substr(i, j - i)), line});
        i = j;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t j = i;
        bool is_float = false;
        auto digits = [&] {
          while (j < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        };
        digits();
        if (j + 1 < src_.size() && src_[j] == '.' && std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
          is_float = true;
          ++j;
          digits();
        }
        if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
          size_t k = j + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
            is_float = true;
            j = k;
            digits();
          }
        }
        std::string text(src_.substr(i, j - i));
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        tokens_.push_back({is_float ? Tok::floating : Tok::integer, text, line});
        i = j;
      } else if (c == '\'' || c == '"') {
        tokens_.push_back({Tok::string, lex_string(i, line), line});
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                           "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|"};
        bool found = false;
        for (const char* op : kOps) {
          size_t n = std::strlen(op);
          if (src_.compare(i, n, op) == 0) {
            tokens_.push_back({Tok::op, op, line});
            i += n;
            found = true;
            break;
          }
        }
        if (!found) fail(line, fmt::format("unexpected character '{}'", c));
      }
    }
  }

  // A quoted string with Python's escapes; `i` moves past the closing quote.
  std::string lex_string(size_t& i, int line) {
    char quote = src_[i++];
    std::string out;
    while (true) {
      if (i >= src_.size()) fail(line, "a string is not closed");
      char c = src_[i++];
      if (c == quote) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= src_.size()) fail(line, "a string is not closed");
      char e = src_[i++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n > src_.size()) fail(line, fmt::format("a '\\{}' escape needs {} hex digits", e, n));
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            char h = src_[i + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) fail(line, fmt::format("a '\\{}' escape needs {} hex digits", e, n));
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          i += n;
          if (cp < 0x80) out += static_cast<char>(cp);
          else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            if (cp > 0x10FFFF) fail(line, "a '\\U' escape is past U+10FFFF");
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:  // Python keeps an unknown escape as written
          out += '\\';
          out += e;
      }
    }
  }

  // `{% raw %}...{% endraw %}`: the text between, as is.
  size_t lex_raw(size_t pos, bool& strip_next, bool& trim_next) {
    tokens_.resize(tokens_.size() - 3);  // block_begin raw block_end
    size_t search = pos;
    while (true) {
      size_t start = src_.find("{%", search);
      if (start == npos) fail(line_at(pos), "'raw' is not closed with 'endraw'");
      size_t i = start + 2;
      bool strip_before = i < src_.size() && src_[i] == '-';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) {
        search = start + 2;
        continue;
      }
      i += 6;
      while (i < src_.size() && is_space(src_[i])) ++i;
      char marker = i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i] : '\0';
      if (marker) ++i;
      if (src_.compare(i, 2, "%}") != 0) fail(line_at(start), "'endraw' is not closed with '%}'");
      size_t b = pos, e = start;
      if (strip_next)
        while (b < e && is_space(src_[b])) ++b;
      else if (trim_next && b < e && src_[b] == '\n')
        ++b;
      if (strip_before)
        while (e > b && is_space(src_[e - 1])) --e;
      emit_text(b, e);
      strip_next = marker == '-';
      trim_next = marker == '\0';
      return i + 2;
    }
  }

  std::string_view src_;
  const std::string& name_;
  std::vector<Token> tokens_;
  size_t counted_to_ = 0;
  int counted_line_ = 1;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name) : t_(std::move(tokens)), name_(name) {}

  std::unique_ptr<Block> run() {
    auto block = std::make_unique<Block>();
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
  std::unique_ptr<N> make() {
    auto n = std::make_unique<N>();
    n->line = cur().line;
    return n;
  }

  // Statements up to a block tag named in `ends` (which is consumed; its name goes to
  // *end), or to the end of the template when `ends` is empty.
  Block parse_until(std::initializer_list<const char*> ends, std::string* end) {
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
      auto n = std::make_unique<Block>(parse_until({"endgeneration"}, &end));
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
    auto list = std::make_unique<ListExpr>();
    list->line = line;
    list->tuple = true;
    list->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::var_end || cur().type == Tok::block_end || is_op(")") || is_name("if")) break;
      list->items.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return list;
  }

  ExprPtr parse_expression() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto n = make<Conditional>();
      ++i_;
      n->then = std::move(e);
      n->cond = parse_or();
      if (skip_name("else")) n->otherwise = parse_expression();
      e = std::move(n);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto n = std::make_unique<Binary>();
    n->line = line;
    n->op = std::move(op);
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
      auto n = make<Unary>();
      ++i_;
      n->op = '!';
      n->operand = parse_not();
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
        cmp = std::make_unique<Compare>();
        cmp->line = line;
        cmp->first = std::move(e);
      }
      cmp->rest.emplace_back(op, parse_math1());
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
      auto n = make<Unary>();
      n->op = cur().text[0];
      ++i_;
      n->operand = parse_unary(false);
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
        auto empty = std::make_unique<ListExpr>();
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
          n->object = std::move(e);
          auto lit = make<Literal>();
          lit->value = Value(static_cast<int64_t>(std::stoll(cur().text)));
          ++i_;
          n->index = std::move(lit);
          e = std::move(n);
          continue;
        }
        auto n = make<GetAttr>();
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
      auto n = std::make_unique<GetItem>();
      n->line = line;
      n->object = std::move(object);
      n->index = std::move(parts[0]);
      return n;
    }
    auto n = std::make_unique<Slice>();
    n->line = line;
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
  const std::string& name_;
  int loop_depth_ = 0;
};

}  // namespace

std::unique_ptr<Block> parse_template(std::string_view source, const std::string& name) {
  if (source.size() > kMaxTemplateBytes)
    throw TemplateError(fmt::format("{}: the template is {} bytes, over the limit of {}", name, source.size(), kMaxTemplateBytes));
  Lexer lexer(source, name);
  Parser parser(lexer.run(), name);
  return parser.run();
}

}  // namespace rlx::jinja::detail
