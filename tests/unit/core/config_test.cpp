#include "rlx/core/config.hpp"

#include "../helpers.hpp"
#include "rlx/launch/config.hpp"

using Catch::Matchers::Contains;
using rlx::RunConfig;
namespace config = rlx::config;

namespace {
struct Inner {
  double lr = 1e-3;
  std::vector<int> sizes = {1, 2};
  std::optional<std::string> note;
  template <class V>
  void visit(V& v) {
    v("lr", lr, "learning rate", config::in_half_open(0, 1));
    v("sizes", sizes, "sizes", config::at_least(1));
    v("note", note, "optional note");
  }
};
struct Outer {
  int steps = 10;
  bool flag = false;
  std::string name = "x";
  rlx::DType dtype = rlx::DType::float32;
  Inner inner;
  std::map<std::string, int> extra;
  template <class V>
  void visit(V& v) {
    v("steps", steps, "steps", config::at_least(1));
    v("flag", flag, "a flag");
    v("name", name, "a name");
    v("dtype", dtype, "dtype");
    v("inner", inner, "inner section");
    v("extra", extra, "free-form map");
  }
  void validate() const { RLX_CHECK(name != "forbidden", "name may not be 'forbidden'"); }
};
}  // namespace

TEST_CASE("config: empty input gives the defaults", "[config]") {
  auto o = config::load_string<Outer>("");
  CHECK(o.steps == 10);
  CHECK(o.inner.lr == 1e-3);
  CHECK(o.inner.sizes == std::vector<int>{1, 2});
  CHECK_FALSE(o.inner.note.has_value());
}

TEST_CASE("config: values of every kind are read", "[config]") {
  auto o = config::load_string<Outer>(
      "steps: 7\nflag: true\nname: hello\ndtype: bfloat16\ninner:\n  lr: 0.5\n  sizes: [3, 4, 5]\n  note: hi\n"
      "extra: {a: 1, b: 2}\n");
  CHECK(o.steps == 7);
  CHECK(o.flag);
  CHECK(o.name == "hello");
  CHECK(o.dtype == rlx::DType::bfloat16);
  CHECK(o.inner.lr == 0.5);
  CHECK(o.inner.sizes == std::vector<int>{3, 4, 5});
  CHECK(o.inner.note == std::optional<std::string>("hi"));
  CHECK(o.extra == std::map<std::string, int>{{"a", 1}, {"b", 2}});
}

TEST_CASE("config: unknown keys are named with the line and the closest valid key", "[config]") {
  rlx::test::TempDir dir;
  rlx::test::write_file(dir / "c.yaml", "steps: 3\ninner:\n  lrr: 0.1\n");
  auto msg = rlx::test::error_of([&] { config::load_file<Outer>(dir / "c.yaml"); });
  CHECK_THAT(msg, Contains("inner.lrr"));
  CHECK_THAT(msg, Contains("c.yaml:3"));
  CHECK_THAT(msg, Contains("unknown key"));
  CHECK_THAT(msg, Contains("did you mean 'inner.lr'"));
}

TEST_CASE("config: wrong types name the key, the line and the value", "[config]") {
  auto msg = rlx::test::error_of([] { config::load_string<Outer>("steps: abc\n", {}, "f.yaml"); });
  CHECK_THAT(msg, Contains("steps (f.yaml:1): expected an integer, got 'abc'"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("steps: 2.5\n"); });
  CHECK_THAT(msg, Contains("expected an integer"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("flag: maybe\n"); });
  CHECK_THAT(msg, Contains("flag"));
  CHECK_THAT(msg, Contains("expected true or false"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("inner: 3\n"); });
  CHECK_THAT(msg, Contains("inner"));
  CHECK_THAT(msg, Contains("expected a section"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("inner:\n  sizes: 3\n"); });
  CHECK_THAT(msg, Contains("inner.sizes"));
  CHECK_THAT(msg, Contains("expected a list"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("name: [1, 2]\n"); });
  CHECK_THAT(msg, Contains("name"));
  CHECK_THAT(msg, Contains("expected string, got a list"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("steps: 99999999999\n"); });
  CHECK_THAT(msg, Contains("does not fit"));
}

TEST_CASE("config: out-of-range values name the allowed range", "[config]") {
  auto msg = rlx::test::error_of([] { config::load_string<Outer>("steps: 0\n"); });
  CHECK_THAT(msg, Contains("steps"));
  CHECK_THAT(msg, Contains("0 is out of range: must be >= 1"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("inner:\n  lr: 0\n"); });
  CHECK_THAT(msg, Contains("inner.lr"));
  CHECK_THAT(msg, Contains("must be in (0, 1]"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("inner:\n  sizes: [1, 0]\n"); });
  CHECK_THAT(msg, Contains("inner.sizes[1]"));
  msg = rlx::test::error_of([] { config::load_string<Outer>("inner:\n  lr: .nan\n"); });
  CHECK_THAT(msg, Contains("out of range"));
}

TEST_CASE("config: enums list the valid names and suggest one", "[config]") {
  auto msg = rlx::test::error_of([] { config::load_string<Outer>("dtype: float33\n"); });
  CHECK_THAT(msg, Contains("'float33' is not one of float32|bfloat16|float16"));
  CHECK_THAT(msg, Contains("did you mean 'float32'"));
}

TEST_CASE("config: every error is reported at once", "[config]") {
  auto msg = rlx::test::error_of([] { config::load_string<Outer>("steps: 0\nflg: true\ndtype: x\n"); });
  CHECK_THAT(msg, Contains("3 config errors"));
  CHECK_THAT(msg, Contains("steps"));
  CHECK_THAT(msg, Contains("flg"));
  CHECK_THAT(msg, Contains("dtype"));
}

TEST_CASE("config: a struct's validate() is applied with its path", "[config]") {
  auto msg = rlx::test::error_of([] { config::load_string<Outer>("name: forbidden\n"); });
  CHECK_THAT(msg, Contains("may not be 'forbidden'"));
}

TEST_CASE("config: command-line overrides", "[config]") {
  std::vector<std::string> ov = {"steps=5", "inner.lr=0.25", "inner.sizes=[9]", "name=a=b", "inner.note=null"};
  auto o = config::load_string<Outer>("inner:\n  note: x\n", ov);
  CHECK(o.steps == 5);
  CHECK(o.inner.lr == 0.25);
  CHECK(o.inner.sizes == std::vector<int>{9});
  CHECK(o.name == "a=b");
  CHECK_FALSE(o.inner.note.has_value());

  std::vector<std::string> bad = {"inner.lrate=0.1"};
  auto msg = rlx::test::error_of([&] { config::load_string<Outer>("", bad); });
  CHECK_THAT(msg, Contains("inner.lrate (command line): unknown key; did you mean 'inner.lr'"));
  std::vector<std::string> malformed = {"steps"};
  msg = rlx::test::error_of([&] { config::load_string<Outer>("", malformed); });
  CHECK_THAT(msg, Contains("expected section.key=value"));
  std::vector<std::string> through_value = {"steps.x=1"};
  msg = rlx::test::error_of([&] { config::load_string<Outer>("steps: 3\n", through_value); });
  CHECK_THAT(msg, Contains("steps is a value, not a section"));
}

// Issue 50, item 9: inputs a hostile tester tried.
TEST_CASE("config: a directory, a device, .inf, an absurd timeout and key= are refused or read as meant", "[config]") {
  // A directory read as an empty file (all defaults), /dev/zero read without end.
  rlx::test::TempDir dir;
  CHECK_THAT(rlx::test::error_of([&] { config::load_file<Outer>(dir.path); }), Contains("is a directory, not a file"));
  CHECK_THAT(rlx::test::error_of([] { config::parse_file("/dev/zero"); }),
             Contains("/dev/zero: it is a device, pipe or socket, not a file"));
  // .inf is in no range, whatever the bound says.
  std::vector<std::string> inf = {"inner.lr=.inf"};
  auto msg = rlx::test::error_of([&] { config::load_string<Outer>("", inf); });
  CHECK_THAT(msg, Contains("inner.lr (command line): .inf is out of range"));
  for (const auto* o : {"learner.lr=.inf", "learner.eps=.inf", "env.timeout_s=.inf", "hub.lease_timeout_s=1e-300",
                        "hub.peer_timeout_s=-.inf", "learner.lr=.nan"}) {
    std::vector<std::string> ov = {o};
    INFO(o);
    msg = rlx::test::error_of([&] { config::load_string<RunConfig>("", ov); });
    CHECK_THAT(msg, Contains(std::string(o).substr(0, std::string(o).find('=')) + " (command line)"));
    CHECK_THAT(msg, Contains("out of range"));
  }
  // An override's error is the command line's, not line 1 of the file.
  rlx::test::write_file(dir / "c.yaml", "steps: 3\ninner:\n  lr: 5\n");
  std::vector<std::string> ov = {"steps=0"};
  msg = rlx::test::error_of([&] { config::load_file<Outer>(dir / "c.yaml", ov); });
  CHECK_THAT(msg, Contains("steps (command line)"));
  CHECK_THAT(msg, Contains("inner.lr (" + (dir / "c.yaml").string() + ":3)"));
  // key= is the empty string; key=null is null.
  std::vector<std::string> empty = {"inner.note=", "name="};
  auto o = config::load_string<Outer>("inner:\n  note: x\n", empty);
  CHECK(o.inner.note == std::optional<std::string>(""));
  CHECK(o.name.empty());
  auto rc = config::load_string<RunConfig>("hub:\n  state_file: s.json\n", std::vector<std::string>{"hub.state_file="});
  CHECK(rc.hub.state_file.empty());
  // run.name is one directory name, in valid UTF-8.
  for (const auto* name : {"run.name=a\xff\xfe", "run.name=../x", "run.name=a/b", "run.name=.."}) {
    INFO(name);
    msg = rlx::test::error_of([&] { config::load_string<RunConfig>("", std::vector<std::string>{name}); });
    CHECK_THAT(msg, Contains("run ("));
    CHECK_THAT(msg, Contains("name"));
  }
  CHECK(config::load_string<RunConfig>("", std::vector<std::string>{"run.name=été-1"}).run.name == "été-1");
}

TEST_CASE("config: invalid YAML names the line and column", "[config]") {
  auto msg = rlx::test::error_of([] { config::load_string<Outer>("steps: [1, 2\n", {}, "bad.yaml"); });
  CHECK_THAT(msg, Contains("bad.yaml:"));
  CHECK_THAT(msg, Contains("invalid YAML"));
  msg = rlx::test::error_of([] { config::load_file<Outer>("/nonexistent/rlx.yaml"); });
  CHECK_THAT(msg, Contains("cannot read config file /nonexistent/rlx.yaml"));
}

TEST_CASE("config: to_yaml reads back to the same values", "[config]") {
  Outer o;
  o.steps = 42;
  o.inner.lr = 0.1;  // not exactly representable: the writer must keep every digit
  o.inner.note = "n";
  o.dtype = rlx::DType::float16;
  o.extra = {{"k", 3}};
  auto back = config::load_string<Outer>(config::to_yaml(o));
  CHECK(back.steps == 42);
  CHECK(back.inner.lr == 0.1);
  CHECK(back.inner.note == std::optional<std::string>("n"));
  CHECK(back.dtype == rlx::DType::float16);
  CHECK(back.extra == o.extra);

  RunConfig rc;
  rc.model.preset = "small";
  rc.run.seed = 7;
  auto rc2 = config::load_string<RunConfig>(config::to_yaml(rc));
  CHECK(config::to_yaml(rc2) == config::to_yaml(rc));
}

TEST_CASE("config: changed_keys names every key whose value differs", "[config]") {
  Outer a, b;
  CHECK(config::changed_keys(a, b).empty());
  b.steps = 11;
  b.inner.sizes = {1, 2, 3};  // a list is one value
  b.inner.note = "now set";   // absent in a's YAML
  b.extra = {{"k", 1}};
  CHECK(config::changed_keys(a, b) == std::vector<std::string>{"steps", "inner.sizes", "inner.note", "extra.k"});
  CHECK(config::changed_keys(b, a) == std::vector<std::string>{"steps", "inner.sizes", "inner.note", "extra.k"});

  RunConfig r1, r2;
  r2.rollout.workers = r1.rollout.workers + 2;
  CHECK(config::changed_keys(r1, r2) == std::vector<std::string>{"rollout.workers"});
}

TEST_CASE("config: the run config validates model presets and devices", "[config]") {
  auto msg = rlx::test::error_of([] { config::load_string<RunConfig>("model:\n  preset: tinyy\n"); });
  CHECK_THAT(msg, Contains("model"));
  CHECK_THAT(msg, Contains("unknown model preset 'tinyy'"));
  CHECK_THAT(msg, Contains("did you mean 'tiny'"));
  msg = rlx::test::error_of([] { config::load_string<RunConfig>("model:\n  device: gpu0\n"); });
  CHECK_THAT(msg, Contains("device 'gpu0'"));
  CHECK(config::load_string<RunConfig>("model:\n  device: cuda:1\n").model.device == "cuda:1");
}

TEST_CASE("config: documentation lists every key with type and default", "[config]") {
  auto rows = config::document<Outer>();
  bool found = false;
  for (const auto& r : rows)
    if (r.key == "inner.lr") {
      found = true;
      CHECK(r.type == "number");
      CHECK(r.default_value == "0.001");
      CHECK(r.range == "in (0, 1]");
    }
  CHECK(found);
  CHECK_THAT(config::to_markdown(rows), Contains("| `steps` | integer | `10` | >= 1 | steps |"));
}

TEST_CASE("config: suggestions use edit distance", "[config]") {
  CHECK(config::edit_distance("kitten", "sitting") == 3);
  CHECK(config::edit_distance("", "abc") == 3);
  std::vector<std::string> c = {"learning_rate", "batch_size"};
  CHECK(config::closest("learning_rat", c) == "learning_rate");
  CHECK(config::closest("zzz", c).empty());
}
