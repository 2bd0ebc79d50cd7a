// Chrome / Perfetto trace events (the JSON array format that ui.perfetto.dev and
// chrome://tracing open).
//
//   rlx::TraceWriter trace("runs/x/trace-learner-0.json", "learner-0");
//   { auto s = trace.scope("step", "learner"); ... }          // one "X" event
//   trace.counter("tokens_per_s", {{"value", 1234.0}});
//
// Or install it process-wide and use RLX_TRACE_SCOPE("name") for a block, or
// rlx::trace_span("name", start_us) for a phase that is not one block (it ends before an
// early return, or spans a loop's iterations); both cost one branch when tracing is off.
// Events are buffered (bounded) and appended to the file; the file is a valid JSON array
// once the writer is closed or destroyed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlx {

class TraceWriter {
 public:
  // Opens (truncates) `path`; throws rlx::Error if it cannot. `process_name` labels the
  // process row in the viewer.
  TraceWriter(const std::string& path, std::string_view process_name, size_t max_buffered = 4096);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Microseconds on the wall clock, shared by every process of a run.
  static int64_t now_us();

  void complete(std::string_view name, std::string_view category, int64_t start_us, int64_t duration_us,
                const std::vector<std::pair<std::string, double>>& args = {});
  void instant(std::string_view name, std::string_view category = "");
  void counter(std::string_view name, const std::vector<std::pair<std::string, double>>& values);

  class Scope {
   public:
    Scope(TraceWriter* writer, std::string_view name, std::string_view category)
        : writer_(writer), name_(name), category_(category), start_(writer ? now_us() : 0) {}
    ~Scope() {
      if (writer_) writer_->complete(name_, category_, start_, now_us() - start_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    TraceWriter* writer_;
    std::string name_, category_;
    int64_t start_;
  };
  Scope scope(std::string_view name, std::string_view category = "") { return Scope(this, name, category); }

  void flush();
  // Flushes and terminates the JSON array; later events are dropped.
  void close();
  size_t events_written() const;

  // Process-wide writer used by RLX_TRACE_SCOPE (nullptr: tracing off).
  static void install(std::shared_ptr<TraceWriter> writer);
  static TraceWriter* installed();

 private:
  void push(std::string event);
  void flush_locked();

  mutable std::mutex mutex_;
  std::FILE* file_ = nullptr;
  std::vector<std::string> buffer_;
  size_t max_buffered_;
  size_t written_ = 0;
  int pid_;
};

// A span from `start_us` (TraceWriter::now_us()) to now in the installed writer; nothing
// when none is installed. The roles' phases (wait_batch, train, generate, env_step, ...).
void trace_span(std::string_view name, int64_t start_us);

}  // namespace rlx

#define RLX_TRACE_CONCAT2(a, b) a##b
#define RLX_TRACE_CONCAT(a, b) RLX_TRACE_CONCAT2(a, b)
#define RLX_TRACE_SCOPE(name) \
  ::rlx::TraceWriter::Scope RLX_TRACE_CONCAT(rlx_trace_scope_, __LINE__)(::rlx::TraceWriter::installed(), name, "")
