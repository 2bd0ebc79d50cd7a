// JSON from outside rlx (a request body, a model's config.json, a dataset line, a CLI
// argument), parsed with bounds: nesting deeper than `max_depth` and numbers that do not
// fit a double (1e999) are errors naming `what`, as are syntax errors (with the byte
// offset). Anything built recursively from the result (template values, messages) can
// then rely on the depth bound.
//
//   auto body = rlx::parse_json<nlohmann::ordered_json>(req.body, "the request body");
//   // throws rlx::Error: "the request body: nested deeper than 128 levels at byte 129"
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <string_view>

#include "rlx/core/error.hpp"

namespace rlx {

// Deep enough for any real request, tool schema or config; shallow enough that every
// recursive walk over the value (destructors included) stays far from the stack's end.
inline constexpr int kMaxJsonDepth = 128;

// Thrown for malformed or out-of-bounds JSON; a server answers it with 400.
class JsonError : public Error {
 public:
  using Error::Error;
};

template <class Json = nlohmann::json>
Json parse_json(std::string_view text, std::string_view what, int max_depth = kMaxJsonDepth) {
  typename Json::parser_callback_t bound = [&](int depth, typename Json::parse_event_t ev, Json& v) {
    using E = typename Json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= max_depth)
      throw JsonError(fmt::format("{}: nested deeper than {} levels", what, max_depth));
    if (ev == E::value && v.is_number_float() && !std::isfinite(v.template get<double>()))
      throw JsonError(fmt::format("{}: a number out of range (it does not fit a double)", what));
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), bound);
  } catch (const nlohmann::json::parse_error& e) {
    throw JsonError(fmt::format("{}: not valid JSON at byte {}: {}", what, e.byte, e.what()));
  } catch (const nlohmann::json::out_of_range& e) {  // 406: nlohmann's parser refuses 1e999 itself
    throw JsonError(fmt::format("{}: a number out of range (it does not fit a double): {}", what, e.what()));
  }
}

}  // namespace rlx
