// What the render in progress on this thread may still spend (RenderLimits): the evaluator,
// the value constructors, the string builders and the comparisons charge it, so that a
// hostile template stops with a LimitError naming the bound and the line wherever its work
// happens (deep in a filter, a repr or a sort) without a renderer passed down to each. Outside
// a render nothing is installed and nothing is counted: values a caller builds are the
// caller's to bound. Internal to src/chat.
//
//   RenderBudget budget(limits, "chat_template");  // installed until it goes out of scope
//   charge_steps(n);                              // n items visited
//   check_size(out.size() + piece.size(), "a joined string");  // before appending
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "rlx/chat/jinja.hpp"

namespace rlx::chat::jinja::detail {

// A step per this many bytes created or scanned: the work of a long string counts as a node's.
constexpr size_t kBytesPerStep = 64;
// The deadline is read once per this many steps.
constexpr int64_t kStepsPerClockCheck = 1024;

class RenderBudget {
 public:
  // Checks `limits` (a bad bound is a ConfigError naming the field) and the deadline, and
  // installs the budget on this thread until it is destroyed.
  RenderBudget(const RenderLimits& limits, const std::string& name);
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  // The budget of the render in progress on this thread, or null.
  static RenderBudget* current() { return current_; }

  const RenderLimits& limits() const { return limits_; }
  int line = 0;  // the template line being evaluated, for errors

  void step(int64_t n = 1) {
    steps_ += n;
    if (steps_ >= next_check_) check_steps();
  }
  // A value (or a string being built) of `bytes`: over max_value_bytes is an error.
  void check_size(size_t bytes, const char* what) const {
    if (bytes > limits_.max_value_bytes) size_exceeded(bytes, what);
  }
  // `bytes` allocated for a new value: they count toward max_allocated_bytes and max_steps.
  void allocate(size_t bytes);

  // Throws LimitError "NAME:LINE: WHAT (RenderLimits::LIMIT)".
  [[noreturn]] void exceeded(const char* limit, const std::string& what) const;

  // While in scope (or until end()), values are built uncharged: for what the evaluator
  // itself builds (a loop's `loop` variable), which is not the template's to pay for.
  class Uncharged {
   public:
    explicit Uncharged(RenderBudget& b) : budget_(&b) { current_ = nullptr; }
    ~Uncharged() { end(); }
    void end() {
      if (budget_) current_ = budget_;
      budget_ = nullptr;
    }
    Uncharged(const Uncharged&) = delete;
    Uncharged& operator=(const Uncharged&) = delete;

   private:
    RenderBudget* budget_;
  };

 private:
  void check_steps();
  [[noreturn]] void size_exceeded(size_t bytes, const char* what) const;

  // initial-exec: a load, not a call to __tls_get_addr, from librlx.so (charged at every step).
  [[gnu::tls_model("initial-exec")]] static inline thread_local RenderBudget* current_ = nullptr;
  RenderBudget* previous_;
  RenderLimits limits_;
  const std::string& name_;
  int64_t steps_ = 0, next_check_ = 0;
  size_t allocated_ = 0;
};

// The same, on the current render if there is one; nothing outside a render.
inline void charge_steps(int64_t n) {
  if (RenderBudget* b = RenderBudget::current()) b->step(n);
}
inline void charge_scan(size_t bytes) { charge_steps(static_cast<int64_t>(bytes / kBytesPerStep)); }
inline void check_size(size_t bytes, const char* what) {
  if (const RenderBudget* b = RenderBudget::current()) b->check_size(bytes, what);
}
// A new value of `bytes`: checked against max_value_bytes, then charged.
inline void charge_value(size_t bytes, const char* what) {
  if (RenderBudget* b = RenderBudget::current()) {
    b->check_size(bytes, what);
    b->allocate(bytes);
  }
}
// Memory the evaluator allocates for its own work (a string's code point offsets): charged
// toward max_allocated_bytes, not checked as a value.
inline void charge_allocation(size_t bytes) {
  if (RenderBudget* b = RenderBudget::current()) b->allocate(bytes);
}
// `items` values about to be built into one list: checked before the allocation.
inline void check_items(size_t items, const char* what) { check_size(items * sizeof(Value), what); }

}  // namespace rlx::chat::jinja::detail
