#include "engine/text/jinja/jinja_budget.h"

#include <limits>
#include <string>

#include "engine/text/jinja/jinja_limits.h"

namespace kvchat::jinja {

namespace {

thread_local RenderBudget* current_budget = nullptr;

}  // namespace

RenderBudget::RenderBudget() : previous_(current_budget) { current_budget = this; }

RenderBudget::~RenderBudget() { current_budget = previous_; }

void charge_steps(std::int64_t steps) {
  RenderBudget* budget = current_budget;
  if (!budget) return;
  budget->steps_used_ += steps;
  if (budget->steps_used_ > kMaxRenderSteps)
    throw EvalError("render budget exceeded: more than " + std::to_string(kMaxRenderSteps) +
                    " evaluation steps (expressions, statements, loop iterations, comparisons, items built)");
}

void charge_bytes(std::size_t bytes) {
  charge_steps(1 + static_cast<std::int64_t>(bytes / static_cast<std::size_t>(kBytesPerStep)));
}

void check_size(std::size_t bytes, const char* what) {
  if (bytes <= kMaxValueBytes) return;
  std::string size = bytes == std::numeric_limits<std::size_t>::max() ? "more than 2^64" : std::to_string(bytes);
  throw EvalError(std::string("render budget exceeded: a ") + what + " of " + size + " bytes is over the limit of " +
                  std::to_string(kMaxValueBytes) + " bytes");
}

std::size_t saturating_multiply(std::size_t a, std::size_t b) {
  std::size_t product;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<std::size_t>::max() : product;
}

std::size_t saturating_add(std::size_t a, std::size_t b) {
  std::size_t sum;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::size_t>::max() : sum;
}

std::size_t value_bytes(const Value& value) {
  switch (value.kind) {
    case Kind::String: return value.text.size();
    case Kind::List: {
      std::size_t bytes = 0;
      for (const Value& item : *value.list) bytes = saturating_add(bytes, sizeof(Value) + item.text.size());
      return bytes;
    }
    case Kind::Dict: {
      std::size_t bytes = 0;
      for (const auto& [key, item] : *value.dict)
        bytes = saturating_add(bytes, 2 * sizeof(Value) + key.text.size() + item.text.size());
      return bytes;
    }
    default: return 0;
  }
}

void charge_new_value(const Value& value) {
  if (value.kind == Kind::List || value.kind == Kind::Dict) {
    std::size_t items = value.kind == Kind::List ? value.list->size() : value.dict->size();
    charge_steps(static_cast<std::int64_t>(items));  // before value_bytes, which walks them
    std::size_t bytes = value_bytes(value);
    check_size(bytes, value.kind == Kind::List ? "list" : "dict");
    charge_bytes(bytes);
  } else if (value.kind == Kind::String) {
    check_size(value.text.size(), "string");
    charge_bytes(value.text.size());
  }
}

}  // namespace kvchat::jinja
