// Python's text rules the Jinja engine needs: float repr, string repr, json.dumps options,
// and UTF-8 code points (Python indexes and measures strings by code point). Defined in
// jinja_text.cpp.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlx::chat::jinja {

class Value;

std::string python_float(double d);
std::string python_repr(std::string_view s);
// python_repr(s) appended to `out`: repr() of a list or dict prints into one buffer.
void python_repr_to(std::string& out, std::string_view s);

// json.dumps' options as HF's `tojson` passes them through.
struct JsonStyle {
  int indent = -1;  // < 0: one line
  std::string item_separator, key_separator;  // empty: Python's defaults for `indent`
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string json_dumps(const Value& v, const JsonStyle& style);

// Byte offsets of each code point's start in `s`, then s.size(). Invalid bytes count as one
// code point each.
std::vector<size_t> code_points(std::string_view s);
size_t count_code_points(std::string_view s);  // len(s), without the offsets
size_t code_point_length(std::string_view s, size_t i);  // bytes of the code point at s[i] (< s.size())
// str.find from byte `from`, in time linear in the sizes (npos when absent).
size_t find_text(std::string_view haystack, std::string_view needle, size_t from = 0);

// str.upper()/str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic letters.
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);

}  // namespace rlx::chat::jinja
