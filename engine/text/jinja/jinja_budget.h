#pragma once
// The render budget of jinja_limits.h: evaluation steps in total and the size of every string, list,
// dict and output a template builds. Operators, filters and value functions are free functions with no
// interpreter at hand, so they reach the budget of the render running on their thread through a
// thread-local pointer that a RenderBudget object sets for its lifetime (render() makes one).
#include <cstddef>
#include <cstdint>

#include "engine/text/jinja/jinja_value.h"

namespace kvchat::jinja {

class RenderBudget {
 public:
  RenderBudget();   // becomes this thread's current budget
  ~RenderBudget();  // restores the previous one
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  std::int64_t steps_used() const { return steps_used_; }

 private:
  friend void charge_steps(std::int64_t steps);
  std::int64_t steps_used_ = 0;
  RenderBudget* previous_;
};

// Counts `steps` against the current render's budget; EvalError past kMaxRenderSteps. Outside a render
// nothing is counted.
void charge_steps(std::int64_t steps);
// Steps for handling `bytes` bytes of text (one per kBytesPerStep, at least one).
void charge_bytes(std::size_t bytes);
// EvalError when a `what` ("string", "list", "output", ...) of `bytes` bytes is over kMaxValueBytes.
// Call it before allocating.
void check_size(std::size_t bytes, const char* what);
// a * b, or SIZE_MAX where that overflows: sizes computed before allocating never wrap around.
std::size_t saturating_multiply(std::size_t a, std::size_t b);
// a + b, or SIZE_MAX where that overflows.
std::size_t saturating_add(std::size_t a, std::size_t b);

// What a value costs in memory beyond shared parts: a string its bytes; a list or dict sizeof(Value)
// per item plus the bytes of the strings it holds (copying a Value copies its string, shares its list).
std::size_t value_bytes(const Value& value);
// For a value an operation just produced: checks its size and charges the steps for making it.
void charge_new_value(const Value& value);

}  // namespace kvchat::jinja
