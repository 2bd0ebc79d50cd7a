#include "rlx/core/trace.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "rlx/core/error.hpp"

namespace rlx {

namespace {
std::shared_ptr<TraceWriter> g_installed_owner;
std::atomic<TraceWriter*> g_installed{nullptr};

std::string quoted(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

std::string args_json(const std::vector<std::pair<std::string, double>>& args) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : args) j[k] = v;
  return j.dump();
}

long thread_id() { return static_cast<long>(::syscall(SYS_gettid)); }
}  // namespace

TraceWriter::TraceWriter(const std::string& path, std::string_view process_name, size_t max_buffered)
    : max_buffered_(max_buffered == 0 ? 1 : max_buffered), pid_(static_cast<int>(::getpid())) {
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) throw Error(fmt::format("cannot open trace file {}: {}", path, std::strerror(errno)));
  std::fputs("[\n", file_);
  push(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":{}}}}})", pid_,
                   quoted(process_name)));
}

TraceWriter::~TraceWriter() { close(); }

int64_t TraceWriter::now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

void TraceWriter::complete(std::string_view name, std::string_view category, int64_t start_us, int64_t duration_us,
                           const std::vector<std::pair<std::string, double>>& args) {
  push(fmt::format(R"({{"name":{},"cat":{},"ph":"X","ts":{},"dur":{},"pid":{},"tid":{},"args":{}}})", quoted(name),
                   quoted(category), start_us, duration_us, pid_, thread_id(), args_json(args)));
}

void TraceWriter::instant(std::string_view name, std::string_view category) {
  push(fmt::format(R"({{"name":{},"cat":{},"ph":"i","s":"p","ts":{},"pid":{},"tid":{}}})", quoted(name),
                   quoted(category), now_us(), pid_, thread_id()));
}

void TraceWriter::counter(std::string_view name, const std::vector<std::pair<std::string, double>>& values) {
  push(fmt::format(R"({{"name":{},"ph":"C","ts":{},"pid":{},"args":{}}})", quoted(name), now_us(), pid_,
                   args_json(values)));
}

void TraceWriter::push(std::string event) {
  std::lock_guard lock(mutex_);
  if (!file_) return;
  buffer_.push_back(std::move(event));
  if (buffer_.size() >= max_buffered_) flush_locked();
}

void TraceWriter::flush_locked() {
  if (!file_) return;
  for (auto& e : buffer_) {
    if (written_ > 0) std::fputs(",\n", file_);
    std::fwrite(e.data(), 1, e.size(), file_);
    ++written_;
  }
  buffer_.clear();
  std::fflush(file_);
}

void TraceWriter::flush() {
  std::lock_guard lock(mutex_);
  flush_locked();
}

void TraceWriter::close() {
  std::lock_guard lock(mutex_);
  if (!file_) return;
  flush_locked();
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

size_t TraceWriter::events_written() const {
  std::lock_guard lock(mutex_);
  return written_ + buffer_.size();
}

void TraceWriter::install(std::shared_ptr<TraceWriter> writer) {
  g_installed.store(writer.get());
  g_installed_owner = std::move(writer);
}

TraceWriter* TraceWriter::installed() { return g_installed.load(std::memory_order_relaxed); }

void trace_span(std::string_view name, int64_t start_us) {
  if (auto* t = TraceWriter::installed()) t->complete(name, "", start_us, TraceWriter::now_us() - start_us);
}

}  // namespace rlx
