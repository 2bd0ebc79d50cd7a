// Judging a program on test cases (env/code_judge.hpp).
#include "rlx/env/code_judge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <cmath>

#include "rlx/core/clock.hpp"
#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/hash.hpp"
#include "rlx/core/json.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/env/env.hpp"
#include "rlx/env/sandbox.hpp"

namespace rlx::env::code {

namespace {

using json = nlohmann::json;

// Runs solution.py's function `argv[1]` on the arguments of stdin's second line; prints its
// result as JSON on a line tagged with the nonce of the first (the solution's own prints are
// told apart, and the comparison happens outside the sandbox).
constexpr const char* kCallHarness = R"PY(import json, os, sys
_write, _dumps, _type, _enc, _repr = os.write, json.dumps, type, str.encode, repr
_nonce = sys.stdin.readline().strip()
_args = json.loads(sys.stdin.readline())
_name = sys.argv[1]
_ns = {"__name__": "solution"}
try:
    with open("solution.py") as _f:
        exec(compile(_f.read(), "solution.py", "exec"), _ns)
    _cls = _ns.get("Solution")
    if _cls is not None and hasattr(_cls, _name):
        _fn = getattr(_cls(), _name)
    elif _name in _ns:
        _fn = _ns[_name]
    else:
        raise NameError("no function " + _name)
    _line = "\n@@rlx %s ok %s\n" % (_nonce, _dumps(_fn(*_args), default=_repr))
except BaseException as _e:
    _line = "\n@@rlx %s error %s\n" % (_nonce, _type(_e).__name__)
_write(1, _enc(_line))
)PY";

// A list of lines is a text with newlines (some datasets write inputs and outputs so).
std::string text_of(const json& v, std::string_view where, std::string_view field, size_t i) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array() && std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_string(); })) {
    std::string out;
    for (const auto& line : v) out += line.get<std::string>() + "\n";
    return out;
  }
  throw Error(fmt::format("{}: field '{}[{}]': expected text (or a list of lines), got {}", where, field, i, v.type_name()));
}

// Call-based arguments: a list, or text with one JSON value per line (LiveCodeBench).
std::string args_of(const json& v, std::string_view where, size_t i) {
  if (v.is_array()) return v.dump();
  if (v.is_string()) {
    json args = json::array();
    const std::string text = v.get<std::string>();
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      if (line.find_first_not_of(" \t\r") != std::string::npos) {
        const auto a = json::parse(line, nullptr, /*allow_exceptions=*/false);
        RLX_CHECK(!a.is_discarded(), "{}: field 'inputs[{}]': line '{}' is not JSON (call-based arguments)", where, i,
                  line.substr(0, 80));
        args.push_back(a);
      }
      start = end + 1;
    }
    return args.dump();
  }
  throw Error(fmt::format("{}: field 'inputs[{}]': expected a list of arguments (fn_name is set), got {}", where, i,
                          v.type_name()));
}

// A call's expected value: JSON, or text that holds JSON, else the text itself.
std::string expected_value_of(const json& v) {
  if (v.is_string()) {
    const auto parsed = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) return parsed.dump();
  }
  return v.dump();
}

template <class T>
T number_option(const json& o, const char* key, T fallback, double lo, double hi) {
  if (!o.contains(key)) return fallback;
  const auto& v = o.at(key);
  RLX_CHECK(v.is_number(), "code option '{}': expected a number, got {}", key, v.dump());
  const double x = v.get<double>();
  RLX_CHECK(x >= lo && x <= hi, "code option '{}': {} is outside [{}, {}]", key, x, lo, hi);
  return static_cast<T>(x);
}

template <class E>
E enum_option(const json& o, const char* key, E fallback) {
  if (!o.contains(key)) return fallback;
  RLX_CHECK(o.at(key).is_string(), "code option '{}': expected a name, got {}", key, o.at(key).dump());
  return config::parse_enum<E>(o.at(key).get<std::string>(), fmt::format("code option '{}'", key));
}

std::string_view rstrip(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\f' || s.back() == '\v'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> normalized_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(rstrip(text.substr(start, end - start)));
    start = end + 1;
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

std::vector<std::string_view> tokens(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

std::optional<double> number(std::string_view t) {
  double v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool within(double a, double b, double tol) {
  const double d = std::fabs(a - b);
  return d <= tol || d <= tol * std::fabs(b);
}

bool lines_match(std::string_view got, std::string_view expected, double tol) {
  if (got == expected) return true;
  if (tol <= 0) return false;
  const auto g = tokens(got), e = tokens(expected);
  if (g.size() != e.size()) return false;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == e[i]) continue;
    const auto a = number(g[i]), b = number(e[i]);
    if (!a || !b || !within(*a, *b, tol)) return false;
  }
  return true;
}

// The last line of a program's stderr (the exception, for Python), bounded.
std::string last_line(std::string_view text) {
  const auto lines = normalized_lines(text);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it)
    if (!it->empty()) return std::string(it->substr(0, 200));
  return {};
}

CaseVerdict verdict_of_run(const SandboxResult& r) {
  switch (r.verdict) {
    case SandboxVerdict::ok: return r.exit_code == 0 ? CaseVerdict::passed : CaseVerdict::runtime_error;
    case SandboxVerdict::timeout:
    case SandboxVerdict::cpu_time: return CaseVerdict::time_limit;
    case SandboxVerdict::memory: return CaseVerdict::memory_limit;
    case SandboxVerdict::output_limit: return CaseVerdict::output_limit;
    case SandboxVerdict::file_size:
    case SandboxVerdict::filter:
    case SandboxVerdict::signal: return CaseVerdict::runtime_error;
    case SandboxVerdict::setup_error:
    case SandboxVerdict::cancelled: break;
  }
  throw InfraError(fmt::format("code judge: the sandbox failed: {} ({})", config::enum_to_string(r.verdict), r.detail));
}

// The call harness's result line, if exactly one carries the nonce.
std::optional<std::string> tagged_result(const std::string& out, const std::string& nonce) {
  const std::string tag = "@@rlx " + nonce + " ";
  const auto pos = out.find(tag);
  if (pos == std::string::npos || out.find(tag, pos + 1) != std::string::npos) return std::nullopt;
  const size_t start = pos + tag.size();
  const size_t end = out.find('\n', start);
  return out.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

TestSpec TestSpec::from_json(const json& io_field, std::string_view where) {
  json io = io_field;
  if (io.is_string()) {
    io = json::parse(io_field.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    RLX_CHECK(!io.is_discarded(), "{}: field 'input_output': a string that is not JSON", where);
  }
  RLX_CHECK(io.is_object(), "{}: field 'input_output': expected an object with 'inputs' and 'outputs', got {}", where,
            io.type_name());
  for (const char* key : {"inputs", "outputs"}) {
    RLX_CHECK(io.contains(key), "{}: field '{}' is missing", where, key);
    RLX_CHECK(io.at(key).is_array(), "{}: field '{}': expected a list, got {}", where, key, io.at(key).type_name());
  }
  const auto& in = io.at("inputs");
  const auto& out = io.at("outputs");
  RLX_CHECK(in.size() == out.size(), "{}: field 'outputs': {} outputs for {} inputs", where, out.size(), in.size());
  RLX_CHECK(!in.empty(), "{}: field 'inputs': no test cases", where);
  TestSpec s;
  if (io.contains("fn_name") && !io.at("fn_name").is_null()) {
    RLX_CHECK(io.at("fn_name").is_string(), "{}: field 'fn_name': expected text, got {}", where, io.at("fn_name").type_name());
    s.fn_name = io.at("fn_name").get<std::string>();
    RLX_CHECK(!s.fn_name.empty() && s.fn_name.find_first_of(" \t\n()") == std::string::npos,
              "{}: field 'fn_name': '{}' is not a function name", where, s.fn_name);
  }
  for (size_t i = 0; i < in.size(); ++i) {
    if (s.fn_name.empty())
      s.cases.push_back({text_of(in[i], where, "inputs", i), text_of(out[i], where, "outputs", i)});
    else
      s.cases.push_back({args_of(in[i], where, i), expected_value_of(out[i])});
  }
  return s;
}

json TestSpec::to_json() const {
  json j = {{"inputs", json::array()}, {"outputs", json::array()}};
  for (const auto& c : cases) {
    j["inputs"].push_back(fn_name.empty() ? json(c.input) : json::parse(c.input));
    j["outputs"].push_back(fn_name.empty() ? json(c.output) : json::parse(c.output));
  }
  if (!fn_name.empty()) j["fn_name"] = fn_name;
  return j;
}

JudgeOptions JudgeOptions::from_json(const json& o) {
  JudgeOptions j;
  if (o.is_null()) return j;
  RLX_CHECK(o.is_object(), "code options: expected an object, got {}", o.dump());
  j.reward = enum_option(o, "reward", j.reward);
  j.selection = enum_option(o, "case_selection", j.selection);
  j.time_limit_s = number_option(o, "time_limit_s", j.time_limit_s, 0.01, 3600);
  j.memory_mb = number_option(o, "memory_mb", j.memory_mb, 16, 1 << 20);
  j.output_bytes = number_option(o, "output_bytes", j.output_bytes, 1, 1ull << 32);
  j.max_cases = number_option(o, "max_cases", j.max_cases, 1, 100000);
  j.time_budget_s = number_option(o, "time_budget_s", j.time_budget_s, 0.01, 86400);
  j.float_tol = number_option(o, "float_tol", j.float_tol, 0, 1);
  if (o.contains("python")) {
    RLX_CHECK(o.at("python").is_string() && !o.at("python").get<std::string>().empty(),
              "code option 'python': expected a command, got {}", o.at("python").dump());
    j.python = o.at("python").get<std::string>();
  }
  return j;
}

std::string extract_code(std::string_view text) {
  // Every fenced block: its info string and its body.
  struct Block {
    std::string_view lang, body;
  };
  std::vector<Block> blocks;
  for (size_t pos = 0; (pos = text.find("```", pos)) != std::string_view::npos;) {
    const size_t info = pos + 3;
    const size_t eol = text.find('\n', info);
    if (eol == std::string_view::npos) break;
    const std::string_view lang = rstrip(text.substr(info, eol - info));
    const size_t close = text.find("```", eol + 1);
    blocks.push_back({lang, text.substr(eol + 1, close == std::string_view::npos ? std::string_view::npos : close - eol - 1)});
    if (close == std::string_view::npos) break;
    pos = close + 3;
  }
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
    if (it->lang == "python" || it->lang == "py" || it->lang == "python3") return std::string(it->body);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
    if (it->lang.empty()) return std::string(it->body);
  return std::string(text);
}

bool outputs_match(std::string_view got, std::string_view expected, double float_tol) {
  const auto g = normalized_lines(got), e = normalized_lines(expected);
  if (g.size() != e.size()) return false;
  for (size_t i = 0; i < g.size(); ++i)
    if (!lines_match(g[i], e[i], float_tol)) return false;
  return true;
}

bool values_match(const json& got, const json& expected, double float_tol) {
  const auto same = [float_tol](const auto& self, const json& a, const json& b) -> bool {
    if (a.is_number() && b.is_number()) {
      if (a == b) return true;
      return float_tol > 0 && within(a.get<double>(), b.get<double>(), float_tol);
    }
    if (a.is_array() && b.is_array()) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!self(self, a[i], b[i])) return false;
      return true;
    }
    if (a.is_object() && b.is_object()) {
      if (a.size() != b.size()) return false;
      for (const auto& [k, v] : b.items())
        if (!a.contains(k) || !self(self, a.at(k), v)) return false;
      return true;
    }
    return a == b;
  };
  if (same(same, got, expected)) return true;
  return expected.is_array() && expected.size() == 1 && same(same, got, expected[0]);
}

std::vector<size_t> select_cases(size_t n, size_t max, CaseSelection selection, uint64_t seed) {
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  if (n <= max) return all;
  if (selection == CaseSelection::first) {
    all.resize(max);
    return all;
  }
  // A partial Fisher-Yates shuffle on rlx's counter-based stream: the same on every machine.
  RngStream rng(seed, 0);
  for (size_t i = 0; i < max; ++i) {
    const auto j = static_cast<size_t>(rng.uniform_int(static_cast<int64_t>(i), static_cast<int64_t>(n - 1)));
    std::swap(all[i], all[j]);
  }
  all.resize(max);
  std::sort(all.begin(), all.end());
  return all;
}

uint64_t spec_fingerprint(const TestSpec& spec) {
  uint64_t h = hash64(spec.fn_name.data(), spec.fn_name.size(), spec.cases.size());
  for (const auto& c : spec.cases) h = hash64(c.input.data(), c.input.size(), h);
  return h;
}

json Judgement::info() const {
  json verdicts = json::array();
  for (const auto& c : cases) verdicts.push_back(std::string(config::enum_to_string(c.verdict)));
  json j = {{"passed", passed},
            {"total", selected},
            {"cases_available", available},
            {"solved", passed == selected ? 1 : 0},
            {"budget_exhausted", budget_exhausted ? 1 : 0},
            {"wall_s", wall_s},
            {"verdicts", verdicts}};
  for (const auto& [v, name] : enum_names(CaseVerdict{}))
    j[fmt::format("cases_{}", name)] = counts[static_cast<size_t>(v)];
  for (const auto& c : cases)
    if (c.verdict != CaseVerdict::passed && c.verdict != CaseVerdict::not_run) {
      j["first_failure"] = {{"case", c.index}, {"verdict", std::string(config::enum_to_string(c.verdict))}, {"detail", c.detail}};
      break;
    }
  return j;
}

Judgement judge(const Sandbox& sandbox, const std::string& code, const TestSpec& spec, const JudgeOptions& o,
                uint64_t nonce_seed) {
  RLX_CHECK(!spec.cases.empty(), "code judge: a problem without test cases");
  Judgement j;
  j.available = spec.cases.size();
  const uint64_t fingerprint = spec_fingerprint(spec);
  const auto chosen = select_cases(spec.cases.size(), o.max_cases, o.selection, fingerprint);
  j.selected = chosen.size();
  const bool call = !spec.fn_name.empty();
  const double t0 = now_s();
  bool stop = false;
  RngStream nonces = RngStream(nonce_seed, fingerprint).fork("code_judge");
  for (const size_t index : chosen) {
    CaseResult c{.index = index};
    const double left = o.time_budget_s - (now_s() - t0);
    if (stop || left < 0.01) {
      j.budget_exhausted = j.budget_exhausted || (!stop && left < 0.01);
    } else {
      const TestCase& tc = spec.cases[index];
      SandboxLimits limits = sandbox.options().limits;
      limits.wall_s = std::min(o.time_limit_s, left);
      limits.cpu_s = o.time_limit_s;
      limits.memory_mb = o.memory_mb;
      limits.output_bytes = std::max<uint64_t>(o.output_bytes, 2 * tc.output.size() + 1024);
      SandboxRequest req{.files = {{"solution.py", code}}, .limits = limits};
      std::string nonce;
      if (call) {
        nonce = fmt::format("{:016x}", nonces.next_u64());
        req.argv = {o.python, "harness.py", spec.fn_name};
        req.files.emplace_back("harness.py", kCallHarness);
        req.stdin_data = nonce + "\n" + tc.input + "\n";
      } else {
        req.argv = {o.python, "solution.py"};
        req.stdin_data = tc.input;
      }
      const SandboxResult r = sandbox.run(req);
      c.wall_s = r.wall_s;
      c.verdict = verdict_of_run(r);
      if (c.verdict == CaseVerdict::time_limit && limits.wall_s < o.time_limit_s) j.budget_exhausted = true;
      if (c.verdict != CaseVerdict::passed) {
        c.detail = r.verdict == SandboxVerdict::ok ? last_line(r.stderr_text) : r.detail;
      } else if (!call) {
        if (!outputs_match(r.stdout_text, tc.output, o.float_tol)) c.verdict = CaseVerdict::wrong_answer;
      } else if (const auto line = tagged_result(r.stdout_text, nonce); !line) {
        c.verdict = CaseVerdict::runtime_error;
        c.detail = "no result (the program ended before the call returned)";
      } else if (line->rfind("error ", 0) == 0) {
        c.verdict = CaseVerdict::runtime_error;
        c.detail = line->substr(6);
      } else {
        const auto got = json::parse(line->substr(line->find(' ') + 1), nullptr, /*allow_exceptions=*/false);
        if (got.is_discarded() || !values_match(got, json::parse(tc.output), o.float_tol))
          c.verdict = CaseVerdict::wrong_answer;
      }
      if (c.verdict == CaseVerdict::passed) ++j.passed;
      if (c.verdict != CaseVerdict::passed && o.reward == RewardMode::all_or_nothing) stop = true;
    }
    ++j.counts[static_cast<size_t>(c.verdict)];
    j.cases.push_back(std::move(c));
  }
  j.wall_s = now_s() - t0;
  const double fraction = static_cast<double>(j.passed) / static_cast<double>(j.selected);
  j.reward = o.reward == RewardMode::fraction ? fraction : (j.passed == j.selected ? 1.0 : 0.0);
  return j;
}

}  // namespace rlx::env::code
