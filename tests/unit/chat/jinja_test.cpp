#include "rlx/chat/jinja.hpp"

#include <pthread.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_paths.hpp"

using rlx::chat::jinja::LimitError;
using rlx::chat::jinja::ParseLimits;
using rlx::chat::jinja::RenderLimits;
using rlx::chat::jinja::Template;
using rlx::chat::jinja::TemplateError;
using rlx::chat::jinja::Value;
using json = nlohmann::ordered_json;

namespace {
std::string render(const std::string& src, const json& ctx = json::object()) {
  return Template::parse(src, "t").render(Value::from_json(ctx));
}
std::string error_of(const std::string& src, const json& ctx = json::object()) {
  try {
    render(src, ctx);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "(no error)";
}
const std::filesystem::path kChatFixtures = std::filesystem::path(rlx::test_paths::kFixtureDir) / "chat";

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}
// The LimitError a template's parse or render throws: "(none)" when it throws nothing.
LimitError limit_error(const std::string& src, const RenderLimits& limits = {}, const ParseLimits& parse = {},
                       const json& ctx = json::object()) {
  try {
    Template::parse(src, "t", parse).render(Value::from_json(ctx), limits);
  } catch (const LimitError& e) {
    return e;
  }
  return LimitError("(none)", "");
}
// After a bound stops a render, the next render on the thread has its full budget and values
// built outside a render are not charged to anything.
void renders_normally_after() {
  CHECK(render("{% for m in messages %}{{ m.role }}:{{ m.content | trim }};{% endfor %}",
               {{"messages", {{{"role", "user"}, {"content", " hi "}}}}}) == "user:hi;");
  CHECK(Value(std::string(80u << 20, 'x')).string().size() == 80u << 20);  // over the default max_value_bytes
}
}  // namespace

TEST_CASE("jinja: whitespace control as transformers sets it (trim_blocks, lstrip_blocks)", "[chat]") {
  CHECK(render("a\n  {% if true %}\n    b\n  {% endif %}\nc") == "a\n    b\nc");
  CHECK(render("x  {%- if true -%}  y  {%- endif %} z") == "xy z");
  CHECK(render("{% if true %}\nkept\n  {%+ if true %} plus{% endif %}{% endif %}") == "kept\n   plus");
  CHECK(render("line\n") == "line");  // one trailing newline is dropped
  CHECK(render("{# c #}\nafter") == "after");
  CHECK(render("{{ 'v' }}\nnext") == "v\nnext");  // trim_blocks leaves expression tags alone
}

TEST_CASE("jinja: scopes, loops and namespaces behave as Jinja2's", "[chat]") {
  // `set` in a loop body lives for that iteration only; a namespace carries values out.
  CHECK(render("{% for i in range(3) %}{% if i == 0 %}{% set x = 5 %}{% endif %}{{ x }};{% endfor %}[{{ x }}]") == "5;;;[]");
  CHECK(render("{% set ns = namespace(n=0) %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}") == "10");
  CHECK(render("{% for x in [1,2,3] %}{{ loop.index }}/{{ loop.revindex0 }}{{ '|' if not loop.last }}{% endfor %}") == "1/2|2/1|3/0");
  CHECK(render("{% for i in range(9) %}{% if i > 3 %}{% break %}{% endif %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}") == "02");
  CHECK(render("{% for x in [] %}a{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}") == "1B23");
}

TEST_CASE("jinja: values print as Python prints them", "[chat]") {
  CHECK(render("{{ [1, 'a', none, true, 2.0] }}") == "[1, 'a', None, True, 2.0]");
  CHECK(render("{{ {'k': \"it's\"} }}") == "{'k': \"it's\"}");
  CHECK(render("{{ 1e20 }} {{ 1e-7 }} {{ 0.1 + 0.2 }} {{ 7 // -2 }} {{ -7 % 3 }}") == "1e+20 1e-07 0.30000000000000004 -4 2");
  CHECK(render("{{ d | tojson }}", {{"d", {{"b", 1}, {"a", "é\n"}}}}) == "{\"b\": 1, \"a\": \"é\\n\"}");
  CHECK(render("{{ 'ünï'[1:] }}{{ 'ünï' | length }}{{ 'ü'.upper() }}") == "nï3Ü");
  // A method's argument made on the spot (a temporary) outlives its use: count once held a
  // reference into it (gcc 13's -Wdangling-reference on the CUDA image).
  CHECK(render("{{ 'abcabcab'.count('ab' ~ '') }} {{ 'aaa'.count('') }} {{ s.count(s[0:2]) }}", {{"s", "xyxyx"}}) == "3 4 2");
}

TEST_CASE("jinja: bad templates name the line and what is wrong", "[chat]") {
  CHECK_THAT(error_of("line one\n{% if x %}\nno end"), Catch::Contains("t:3:") && Catch::Contains("'endif'"));
  CHECK_THAT(error_of("\n\n{{ x | nosuch }}"), Catch::Contains("t:3:") && Catch::Contains("no filter named 'nosuch'"));
  CHECK_THAT(error_of("{% frobnicate %}"), Catch::Contains("t:1:") && Catch::Contains("unknown tag 'frobnicate'"));
  CHECK_THAT(error_of("a\n{{ raise_exception('roles must alternate') }}"), Catch::Contains("t:2:") && Catch::Contains("roles must alternate"));
  CHECK_THAT(error_of("\n{{ x.y.z }}", {{"x", json::object()}}), Catch::Contains("t:2:") && Catch::Contains("'y' is undefined"));
  CHECK_THAT(error_of("{{ 'a' + 1 }}"), Catch::Contains("unsupported operand"));
  CHECK_THAT(error_of("{{ xs.append(1) }}", {{"xs", json::array()}}), Catch::Contains("immutable"));
  CHECK_THAT(error_of("{% break %}"), Catch::Contains("outside a loop"));
  CHECK_THAT(error_of("{{ 'unterminated }}"), Catch::Contains("not closed"));
  // Bounded: a runaway template stops with an error, not an exhausted machine.
  CHECK_THAT(error_of("{% for i in range(1000000) %}{% endfor %}"), Catch::Contains("range()"));
  CHECK_THAT(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), Catch::Contains("nest deeper"));
}

// Parity with Python's jinja2 (as transformers configures it) on feature cases, from the
// fixtures scripts/make_chat_template_fixtures.sh writes.
TEST_CASE("jinja: parity with jinja2 on the feature cases", "[chat]") {
  auto expected_file = kChatFixtures / "expected.jsonl";
  if (!std::filesystem::exists(expected_file))
    FAIL("missing " << expected_file << ": run scripts/make_chat_template_fixtures.sh " << kChatFixtures.string());
  std::ifstream cases_in(std::filesystem::path(rlx::test_paths::kSourceDir) / "tests/data/jinja_cases.json");
  json cases = json::parse(cases_in);
  std::ifstream in(expected_file);
  int checked = 0, errors = 0;
  for (std::string line; std::getline(in, line);) {
    json r = json::parse(line);
    if (r["template"] != "features") continue;
    const json& c = cases[std::stoul(r["case"].get<std::string>())];
    INFO("case " << r["case"] << ": " << c["template"].get<std::string>());
    if (r.contains("error")) {
      INFO("jinja2: " << r["error"]);
      CHECK_THROWS_AS(render(c["template"].get<std::string>(), c["context"]), TemplateError);
      ++errors;
    } else {
      CHECK(render(c["template"].get<std::string>(), c["context"]) == r["text"].get<std::string>());
    }
    ++checked;
  }
  CHECK(checked >= 30);
  CHECK(errors >= 5);
}

// ---- Bounds: a hostile chat_template (downloaded with a model) stops with a LimitError that
// names the bound and the template line, instead of crashing or hanging what loads it.

TEST_CASE("jinja bounds: nested brackets and blocks are parse errors naming the depth limit", "[chat]") {
  // 10,000 nested parentheses: the recursive-descent parser, the renderer and the tree's
  // destructor each recursed once a level (SIGSEGV before the bound).
  LimitError parens = limit_error("{{ " + repeat("(", 10000) + "1" + repeat(")", 10000) + " }}");
  CHECK(parens.limit() == "max_depth");
  CHECK_THAT(parens.what(), Catch::Contains("t:1:") && Catch::Contains("256 levels") && Catch::Contains("column 260") &&
                                Catch::Contains("ParseLimits::max_depth"));
  LimitError ifs = limit_error(repeat("{% if true %}", 30000) + repeat("{% endif %}", 30000));
  CHECK(ifs.limit() == "max_depth");
  CHECK_THAT(ifs.what(), Catch::Contains("statement blocks nest deeper than 256"));
  for (const char* open : {"[", "{'k': ", "f(", "x[", "-", "not ", "(1 if "}) {
    INFO(open);
    CHECK(limit_error("{{ " + repeat(open, 10000) + "1 }}").limit() == "max_depth");
  }
  LimitError lines = limit_error("\n\n{{ " + repeat("[", 300) + " }}");
  CHECK_THAT(lines.what(), Catch::StartsWith("t:3:"));
  // Just inside the bound, the same shapes parse and render.
  CHECK(render("{{ " + repeat("(", 200) + "7" + repeat(")", 200) + " }}") == "7");
  CHECK(render(repeat("{% if true %}", 200) + "in" + repeat("{% endif %}", 200)) == "in");
  renders_normally_after();
}

TEST_CASE("jinja bounds: long flat chains build no deeper tree than the depth limit", "[chat]") {
  // A left-associative chain is as deep as it is long without any recursion in the parser:
  // its evaluation and its destruction recursed once a link.
  for (const char* link : {" + 1", " - 1", " * 1", " ~ 1", " and 1", " or 1", " // 1", " ** 1", ".a", "[0]", "()", " | string",
                           " if 1 else 1"}) {
    INFO(link);
    LimitError e = limit_error("{{ 1" + repeat(link, 10000) + " }}");
    CHECK(e.limit() == "max_depth");
    CHECK_THAT(e.what(), Catch::Contains("ParseLimits::max_depth"));
  }
  CHECK(limit_error("{{ " + repeat("not ", 10000) + "1 }}").limit() == "max_depth");
  CHECK(limit_error("{{ " + repeat("- ", 10000) + "1 }}").limit() == "max_depth");
  // A chain of 200 is fine (real templates chain fewer than 20); a chained comparison is one node.
  CHECK(render("{{ 0" + repeat(" + 1", 200) + " }}") == "200");
  CHECK(render("{{ 1" + repeat(" == 1", 10000) + " }}") == "True");
  CHECK(render("{{ 'a'" + repeat(" | string", 200) + " }}") == "a");
  // Too many nodes, however flat.
  ParseLimits few;
  few.max_nodes = 100;
  CHECK(limit_error(repeat("{{ 1 }}", 60), {}, few).limit() == "max_nodes");
  renders_normally_after();
}

TEST_CASE("jinja bounds: values that double are stopped at the value size limit", "[chat]") {
  // Doubling a string 64 times in a namespace reached 3.3 GB in 4 s; the defaults stop it at 64 MiB.
  auto doubling = [](const std::string& init, const std::string& doubled) {
    return "{% set ns = namespace(s=" + init + ") %}{% for i in range(64) %}\n{% set ns.s = " + doubled + " %}{% endfor %}";
  };
  LimitError defaults = limit_error(doubling("'ab'", "ns.s ~ ns.s"));
  CHECK(defaults.limit() == "max_value_bytes");
  CHECK_THAT(defaults.what(), Catch::Contains("t:2:") && Catch::Contains("67108864 bytes") &&
                                  Catch::Contains("RenderLimits::max_value_bytes"));
  RenderLimits small;
  small.max_value_bytes = 1 << 20;
  for (const char* doubled : {"ns.s + ns.s", "ns.s | replace('a', 'aa')", "[ns.s, ns.s] | join", "ns.s.replace('a', 'aa')",
                              "'-'.join([ns.s, ns.s])", "ns.s * 2", "[ns.s, ns.s] | string", "[ns.s, ns.s] | tojson",
                              "ns.s | indent(width=ns.s, first=true)"}) {
    INFO(doubled);
    LimitError e = limit_error(doubling("'a<'", doubled), small);
    CHECK(e.limit() == "max_value_bytes");
    CHECK_THAT(e.what(), Catch::Contains("t:2:") && Catch::Contains("RenderLimits::max_value_bytes"));
  }
  // Lists alike: items count sizeof(Value) bytes each.
  for (const char* doubled : {"ns.s + ns.s", "ns.s * 2"}) {
    INFO(doubled);
    CHECK(limit_error(doubling("[1]", doubled), small).limit() == "max_value_bytes");
  }
  // A list holding one long string many times prints longer than any value it holds.
  CHECK(limit_error("{% set s = 'x' * 100000 %}{{ [s] * 100 }}", small).limit() == "max_value_bytes");
  CHECK(limit_error("{{ ('a ' * 200000).split() }}", small).limit() == "max_value_bytes");
  CHECK(limit_error("{% for c in 'x' * 100000 %}{% endfor %}", small).limit() == "max_value_bytes");
  CHECK(limit_error("{{ ('<' * 300000) | escape }}", small).limit() == "max_value_bytes");
  // Strings made and dropped add up to max_allocated_bytes.
  RenderLimits little;
  little.max_allocated_bytes = 10 << 20;
  CHECK(limit_error("{% for i in range(100) %}{% set s = 'x' * 1000000 %}{% endfor %}", little).limit() == "max_allocated_bytes");
  RenderLimits short_output;
  short_output.max_output_bytes = 1000;
  CHECK(limit_error("{% for i in range(2000) %}{{ i }}{% endfor %}", short_output).limit() == "max_output_bytes");
  renders_normally_after();
}

TEST_CASE("jinja bounds: runaway work stops at the step budget, the call depth or the deadline", "[chat]") {
  // A macro calling itself twice, 60 deep: 2^60 calls, within the call-depth limit.
  RenderLimits steps;
  steps.max_steps = 100'000;
  LimitError fork = limit_error("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}\n{{ f(60) }}", steps);
  CHECK(fork.limit() == "max_steps");
  CHECK_THAT(fork.what(), Catch::Contains("more than 100000 steps") && Catch::Contains("RenderLimits::max_steps"));
  LimitError deep = limit_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  CHECK(deep.limit() == "max_call_depth");
  CHECK_THAT(deep.what(), Catch::Contains("macro calls nest deeper than 64 (macro 'f')"));
  // Quadratic filters and comparisons count the items they visit.
  CHECK(limit_error("{{ range(30000) | unique | length }}", steps).limit() == "max_steps");
  CHECK(limit_error("{% set l = range(50000) | list %}{{ l == l }}{{ l == l }}{{ l == l }}", steps).limit() == "max_steps");
  // Macros nest expressions: their product is bounded too.
  RenderLimits shallow;
  shallow.max_eval_depth = 100;
  CHECK(limit_error("{% macro f(n) %}{{ ((((f(n - 1) if n > 0 else 0)))) }}{% endmacro %}{{ f(40) }}", shallow).limit() ==
        "max_eval_depth");
  // A deadline already passed: the render does not start.
  RenderLimits late;
  late.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  LimitError past = limit_error("{{ 'never' }}", late);
  CHECK(past.limit() == "deadline");
  CHECK_THAT(past.what(), Catch::Contains("RenderLimits::deadline"));
  renders_normally_after();
}

TEST_CASE("jinja bounds: values nest a bounded depth and a namespace never holds itself", "[chat]") {
  // A list wrapped in itself in a loop: printing, comparing and freeing it recursed without end.
  CHECK_THAT(error_of("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"),
             Catch::Contains("nests deeper than 256 levels"));
  CHECK_THAT(error_of("{% set ns = namespace(x=0) %}{% set ns.x = ns %}"), Catch::Contains("cannot set ns.x"));
  CHECK_THAT(error_of("{% set ns = namespace(x=0) %}{% set ns.x = [1, {'a': ns}] %}"), Catch::Contains("holds a namespace"));
  CHECK_THAT(error_of("{% set ns = namespace(x=0) %}{% set ns.x = [ns].index %}"), Catch::Contains("or a function"));
  // Namespaces in namespaces are fine when made so, and ordinary values may be assigned.
  CHECK(render("{% set a = namespace(n=1) %}{% set b = namespace(inner=a) %}{% set a.n = [[2]] %}{{ b.inner.n }}") == "[[2]]");
  // JSON built elsewhere (not through rlx::parse_json) is converted with the same bound.
  json deep = json::array();
  json* at = &deep;
  for (int i = 0; i < 100000; ++i) at = &at->emplace_back(json::array());
  CHECK_THROWS_WITH(Value::from_json(deep), Catch::Contains("nests deeper than 256 levels"));
  json fine = json::array();
  at = &fine;
  for (int i = 0; i < 200; ++i) at = &at->emplace_back(json::array());
  CHECK(Value::from_json(fine).depth() == 201);
  renders_normally_after();
}

TEST_CASE("jinja bounds: substring searches take linear time", "[chat]") {
  // std::string::find compares the whole needle at each position: 2e12 byte comparisons here.
  json ctx = {{"a", std::string(2'000'000, 'a')}};
  CHECK(render("{{ (a ~ 'b') in (a ~ a) }} {{ (a ~ a).count(a ~ 'b') }} {{ ((a ~ a).split(a ~ 'b')) | length }} "
               "{{ ((a ~ a).rsplit('b' ~ a)) | length }} {{ (a ~ a).find(a ~ 'b') }}",
               ctx) == "False 0 1 1 -1");
  CHECK(render("{{ 'a-b-c'.rsplit('-', 1) }} {{ 'aaa'.rsplit('aa') }} {{ 'aaa'.split('aa') }}") == "['a-b', 'c'] ['a', ''] ['', 'a']");
  renders_normally_after();
}

// The bounds are stack bounds: the deepest parse and render they allow fit in a thread's
// stack far smaller than the 8 MiB threads get by default (a bound too generous, or frames
// grown too big, would crash this test).
TEST_CASE("jinja bounds: the deepest template the bounds allow runs in a 4 MiB stack", "[chat]") {
  auto in_small_stack = [](const std::function<void()>& fn) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 4u << 20);
    pthread_t thread;
    auto call = [](void* f) -> void* {
      (*static_cast<const std::function<void()>*>(f))();
      return nullptr;
    };
    REQUIRE(pthread_create(&thread, &attr, call, const_cast<std::function<void()>*>(&fn)) == 0);
    pthread_join(thread, nullptr);
    pthread_attr_destroy(&attr);
  };
  std::string parens, recursion, blocks, nested;
  in_small_stack([&] {
    parens = error_of("{{ " + repeat("(", 255) + "1" + repeat(")", 255) + " }}");
    recursion = error_of("{% macro f(n) %}{{ " + repeat("1 + (", 240) + "f(n + 1)" + repeat(")", 240) + " }}{% endmacro %}{{ f(0) }}");
    blocks = error_of(repeat("{% if true %}", 255) + "{{ " + repeat("-", 250) + "1 }}" + repeat("{% endif %}", 255));
    nested = error_of(
        "{% set n = namespace(v=none) %}{% set l = [n] %}{% for i in range(254) %}{% set l = [l] %}{% endfor %}"
        "{% set ns = namespace(x=[]) %}{% for i in range(255) %}{% set ns.x = [ns.x] %}{% endfor %}{% set n.v = ns.x %}"
        "{{ l | string | length }} {{ l | tojson | length }} {{ l == l }}");
  });
  CHECK(parens == "(no error)");
  CHECK_THAT(recursion, Catch::Contains("RenderLimits::max_eval_depth"));
  CHECK(blocks == "(no error)");
  CHECK(nested == "(no error)");
}
