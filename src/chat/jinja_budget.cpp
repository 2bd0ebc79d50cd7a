// The render budget; see jinja_budget.hpp.
#include "chat/jinja_budget.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace rlx::chat::jinja::detail {

RenderBudget::RenderBudget(const RenderLimits& limits, const std::string& name)
    : previous_(current_), limits_(limits), name_(name) {
  RLX_CHECK(limits.max_output_bytes > 0 && limits.max_value_bytes > 0 && limits.max_allocated_bytes > 0,
            "{}: RenderLimits' byte bounds must be positive", name);
  RLX_CHECK(limits.max_steps > 0 && limits.max_iterations > 0 && limits.max_call_depth > 0 && limits.max_eval_depth > 0,
            "{}: RenderLimits' max_steps, max_iterations, max_call_depth and max_eval_depth must be positive", name);
  next_check_ = std::min<int64_t>(kStepsPerClockCheck, limits_.max_steps + 1);
  if (std::chrono::steady_clock::now() >= limits_.deadline) exceeded("deadline", "the render's deadline has passed");
  current_ = this;
}

RenderBudget::~RenderBudget() { current_ = previous_; }

void RenderBudget::check_steps() {
  if (steps_ > limits_.max_steps)
    exceeded("max_steps", fmt::format("the render took more than {} steps (runaway work)", limits_.max_steps));
  if (limits_.deadline != std::chrono::steady_clock::time_point::max() && std::chrono::steady_clock::now() >= limits_.deadline)
    exceeded("deadline", fmt::format("the render ran past its deadline (after {} steps)", steps_));
  next_check_ = std::min<int64_t>(steps_ + kStepsPerClockCheck, limits_.max_steps + 1);
}

void RenderBudget::allocate(size_t bytes) {
  allocated_ += bytes;
  if (allocated_ > limits_.max_allocated_bytes)
    exceeded("max_allocated_bytes", fmt::format("the values the render created add up to more than {} bytes",
                                                limits_.max_allocated_bytes));
  step(static_cast<int64_t>(bytes / kBytesPerStep));
}

void RenderBudget::size_exceeded(size_t bytes, const char* what) const {
  exceeded("max_value_bytes",
           fmt::format("{} of {} bytes is over the limit of {} bytes for one value", what, bytes, limits_.max_value_bytes));
}

void RenderBudget::exceeded(const char* limit, const std::string& what) const {
  std::string where = line > 0 ? fmt::format("{}:{}", name_, line) : name_;
  throw LimitError(fmt::format("{}: {} (RenderLimits::{})", where, what, limit), limit);
}

}  // namespace rlx::chat::jinja::detail
