#include <nlohmann/json.hpp>

#include "../helpers.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/trace.hpp"

using Catch::Matchers::Contains;

TEST_CASE("trace: the file is a JSON array of Chrome trace events", "[trace]") {
  rlx::test::TempDir dir;
  {
    rlx::TraceWriter t((dir / "trace.json").string(), "learner-0", /*max_buffered=*/2);
    { auto s = t.scope("step", "learner"); }
    t.complete("sync", "weights", 100, 50, {{"bytes", 1024.0}});
    t.instant("checkpoint");
    t.counter("tokens_per_s", {{"value", 12.5}});
    CHECK(t.events_written() == 5);  // with the process_name metadata event
  }
  auto j = nlohmann::json::parse(rlx::test::read_file(dir / "trace.json"));
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 5);
  CHECK(j[0]["ph"] == "M");
  CHECK(j[0]["args"]["name"] == "learner-0");
  CHECK(j[1]["name"] == "step");
  CHECK(j[1]["ph"] == "X");
  CHECK(j[1]["dur"].get<int64_t>() >= 0);
  CHECK(j[2]["args"]["bytes"] == 1024.0);
  CHECK(j[3]["ph"] == "i");
  CHECK(j[4]["ph"] == "C");
  CHECK(j[4]["args"]["value"] == 12.5);
}

TEST_CASE("trace: the installed writer receives RLX_TRACE_SCOPE and trace_span events", "[trace]") {
  rlx::test::TempDir dir;
  auto w = std::make_shared<rlx::TraceWriter>((dir / "t.json").string(), "p");
  rlx::TraceWriter::install(w);
  { RLX_TRACE_SCOPE("scoped \"quoted\" name"); }
  const int64_t start_us = rlx::TraceWriter::now_us() - 1000;
  rlx::trace_span("phase", start_us);
  rlx::TraceWriter::install(nullptr);
  { RLX_TRACE_SCOPE("not recorded"); }
  rlx::trace_span("not recorded either", start_us);
  w->close();
  auto j = nlohmann::json::parse(rlx::test::read_file(dir / "t.json"));
  REQUIRE(j.size() == 3);
  CHECK(j[1]["name"] == "scoped \"quoted\" name");
  CHECK(j[2]["name"] == "phase");
  CHECK(j[2]["ph"] == "X");
  CHECK(j[2]["ts"] == start_us);
  CHECK(j[2]["dur"].get<int64_t>() >= 1000);
}

TEST_CASE("log: level filter and role/rank prefix", "[log]") {
  rlx::test::TempDir dir;
  auto old = rlx::log::level();
  rlx::log::set_file((dir / "x.log").string());
  rlx::log::set_stderr(false);
  rlx::log::set_identity("learner", 3);
  rlx::log::set_level(rlx::log::Level::warn);
  rlx::log::info("hidden {}", 1);
  rlx::log::warn("shown {}", 2);
  rlx::log::set_file("");
  rlx::log::set_stderr(true);
  rlx::log::set_identity("", -1);
  rlx::log::set_level(old);
  auto text = rlx::test::read_file(dir / "x.log");
  CHECK_THAT(text, Contains(" W learner-3 shown 2\n"));
  CHECK(text.find("hidden") == std::string::npos);
  CHECK(rlx::log::parse_level("debug") == rlx::log::Level::debug);
  CHECK_THROWS_WITH(rlx::log::parse_level("loud"), Contains("unknown log level 'loud'"));
}

TEST_CASE("errors: RLX_CHECK throws rlx::Error, RLX_ASSERT says it is a bug", "[error]") {
  auto f = [](int n) { RLX_CHECK(n > 0, "n must be positive, got {}", n); };
  CHECK_NOTHROW(f(1));
  CHECK_THROWS_WITH(f(-2), Contains("n must be positive, got -2"));
  auto g = [] { RLX_ASSERT(1 + 1 == 3, "arithmetic"); };
  CHECK_THROWS_AS(g(), rlx::InternalError);
  CHECK_THROWS_WITH(g(), Contains("this is a bug in rlx"));
}

#include <ATen/Parallel.h>

#include "rlx/core/threads.hpp"

TEST_CASE("threads: one threading layer gets the cores", "[threads]") {
  auto plan = rlx::set_compute_threads(2);
  CHECK(at::get_num_threads() == plan.intra_op_threads);
  // Either OpenBLAS has the 2 threads and LibTorch's pool 1, or LibTorch has them.
  CHECK(((plan.blas_threads == 2 && plan.intra_op_threads == 1) || (plan.blas_threads == 0 && plan.intra_op_threads == 2)));
  CHECK(plan.threads() == 2);
  CHECK_THAT(plan.describe(), Contains("2"));
  rlx::set_compute_threads(1);
  CHECK(at::get_num_threads() == 1);
}
