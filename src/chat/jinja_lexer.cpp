// The Jinja engine's lexer; see jinja_lexer.hpp.
#include "chat/jinja_lexer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "rlx/chat/jinja.hpp"

namespace rlx::chat::jinja::detail {
namespace {

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
      tokens_.push_back({block ? Tok::block_begin : Tok::var_begin, "", line_at(start), start});
      size_t first_token = tokens_.size();
      pos = lex_tag(body, block, strip_next, trim_next);
      if (block && tokens_.size() == first_token + 2 && tokens_[first_token].text == "raw")
        pos = lex_raw(pos, strip_next, trim_next);
    }
    tokens_.push_back({Tok::eof, "", line_at(src_.size()), src_.size()});
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
    if (end > begin) tokens_.push_back({Tok::text, std::string(src_.substr(begin, end - begin)), line_at(begin), begin});
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
        tokens_.push_back({block ? Tok::block_end : Tok::var_end, "", line_at(i), i});
        strip_next = marker == '-';
        trim_next = block && marker == '\0';
        return i + (marker ? 3 : 2);
      }
      int line = line_at(i);
      char c = src_[i];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        tokens_.push_back({Tok::name, std::string(src_.substr(i, j - i)), line, i});
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
        tokens_.push_back({is_float ? Tok::floating : Tok::integer, text, line, i});
        i = j;
      } else if (c == '\'' || c == '"') {
        size_t at = i;
        std::string text = lex_string(i, line);
        tokens_.push_back({Tok::string, std::move(text), line, at});
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                           "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|"};
        bool found = false;
        for (const char* op : kOps) {
          size_t n = std::strlen(op);
          if (src_.compare(i, n, op) == 0) {
            tokens_.push_back({Tok::op, op, line, i});
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

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& name) { return Lexer(source, name).run(); }

}  // namespace rlx::chat::jinja::detail
