// Python's operators on template values (arithmetic, comparisons, subscripts, slices) and Jinja2's tests (`is`).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/text/jinja/jinja_arguments.h"
#include "engine/text/jinja/jinja_budget.h"
#include "engine/text/jinja/jinja_builtins.h"
#include "engine/text/jinja/jinja_pystr.h"
#include "engine/text/jinja/jinja_substring.h"

namespace kvchat::jinja {

namespace {

// ------------------------------------------------------------------ numbers

double python_float_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0.0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

std::int64_t python_int_mod(std::int64_t a, std::int64_t b) {
  if (b == -1) return 0;  // exact in Python; INT64_MIN % -1 traps (SIGFPE) in C++
  std::int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

std::int64_t python_floor_div(std::int64_t a, std::int64_t b) {
  if (a == INT64_MIN && b == -1) fail_integer_overflow();
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// sequence * times: the result's size is checked before it is built ('x' * 10**12, [1] * 10**9).
Value repeat(const Value& sequence, std::int64_t times) {
  std::size_t count = times > 0 ? static_cast<std::size_t>(times) : 0;
  if (sequence.is_string()) {
    if (sequence.text.empty()) count = 0;
    check_size(saturating_multiply(sequence.text.size(), count), "string");
    std::string out;
    out.reserve(sequence.text.size() * count);
    for (std::size_t i = 0; i < count; ++i) out += sequence.text;
    return string_like(sequence, std::move(out));  // Markup * n is Markup
  }
  if (sequence.items().empty()) count = 0;
  check_size(saturating_multiply(value_bytes(sequence), count), "list");
  ValueList items;
  items.reserve(sequence.items().size() * count);
  for (std::size_t i = 0; i < count; ++i) items.insert(items.end(), sequence.items().begin(), sequence.items().end());
  return Value::from_list(std::move(items), sequence.sequence);
}

// ------------------------------------------------------------------ binary operators

// Operands are never undefined here (binary_operator checks first).
using BinaryFn = Value (*)(const std::string& op, const Value& left, const Value& right);

EvalError unsupported_operands(const std::string& op, const Value& left, const Value& right) {
  // Markup defines __add__, which declines other types, so Python reports the pair of types for it.
  if (op == "+" && (left.is_string() || is_plain_sequence(left)) && left.kind != right.kind && !left.markup)
    return EvalError("can only concatenate " + python_type_name(left) + " (not \"" + python_type_name(right) +
                     "\") to " + python_type_name(left));
  return EvalError("unsupported operand type(s) for " + op + ": '" + python_type_name(left) + "' and '" +
                   python_type_name(right) + "'");
}

bool both_integral(const Value& left, const Value& right) { return left.is_integral() && right.is_integral(); }
bool both_numbers(const Value& left, const Value& right) { return left.is_number() && right.is_number(); }

// +, - and * on ints: `kChecked` is the overflow-checking builtin, `kFloat` the same on floats.
template <bool (*kChecked)(std::int64_t, std::int64_t, std::int64_t*), double (*kFloat)(double, double)>
std::optional<Value> numeric_operator(const Value& left, const Value& right) {
  if (both_integral(left, right)) {
    std::int64_t r;
    if (kChecked(left.as_int(), right.as_int(), &r)) fail_integer_overflow();
    return Value::from_int(r);
  }
  if (both_numbers(left, right)) return Value::from_float(kFloat(left.as_float(), right.as_float()));
  return std::nullopt;
}

bool checked_add(std::int64_t a, std::int64_t b, std::int64_t* r) { return __builtin_add_overflow(a, b, r); }
bool checked_sub(std::int64_t a, std::int64_t b, std::int64_t* r) { return __builtin_sub_overflow(a, b, r); }
bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t* r) { return __builtin_mul_overflow(a, b, r); }
double float_add(double a, double b) { return a + b; }
double float_sub(double a, double b) { return a - b; }
double float_mul(double a, double b) { return a * b; }

Value add(const std::string& op, const Value& left, const Value& right) {
  if (auto sum = numeric_operator<checked_add, float_add>(left, right)) return *sum;
  if (left.is_string() && right.is_string()) {
    // Markup.__add__ / __radd__: a Markup operand escapes the plain one and the sum stays Markup.
    if (left.markup || right.markup)
      return Value::from_markup(escape_to_markup(left).text + escape_to_markup(right).text);
    return Value::from_string(left.text + right.text);
  }
  if (is_plain_sequence(left) && is_plain_sequence(right) && left.sequence == right.sequence) {
    ValueList items = left.items();
    items.insert(items.end(), right.items().begin(), right.items().end());
    return Value::from_list(std::move(items), left.sequence);
  }
  throw unsupported_operands(op, left, right);
}

Value subtract(const std::string& op, const Value& left, const Value& right) {
  if (auto difference = numeric_operator<checked_sub, float_sub>(left, right)) return *difference;
  throw unsupported_operands(op, left, right);
}

Value multiply(const std::string& op, const Value& left, const Value& right) {
  if (auto product = numeric_operator<checked_mul, float_mul>(left, right)) return *product;
  if ((left.is_string() || is_plain_sequence(left)) && right.is_integral()) return repeat(left, right.as_int());
  if ((right.is_string() || is_plain_sequence(right)) && left.is_integral()) return repeat(right, left.as_int());
  throw unsupported_operands(op, left, right);
}

// "/", "//" and "%".
Value divide(const std::string& op, const Value& left, const Value& right) {
  if (left.is_string() && op == "%")
    throw EvalError("printf-style string formatting ('%' on a string) is not supported");
  bool integral = both_integral(left, right);
  if (!both_numbers(left, right)) throw unsupported_operands(op, left, right);
  bool zero = integral ? right.as_int() == 0 : right.as_float() == 0.0;
  if (zero) throw EvalError(op == "%" ? "integer division or modulo by zero" : "division by zero");
  if (op == "/") return Value::from_float(left.as_float() / right.as_float());
  if (integral) {
    if (op == "//") return Value::from_int(python_floor_div(left.as_int(), right.as_int()));
    return Value::from_int(python_int_mod(left.as_int(), right.as_int()));
  }
  double mod = python_float_mod(left.as_float(), right.as_float());
  if (op == "%") return Value::from_float(mod);
  return Value::from_float(std::round((left.as_float() - mod) / right.as_float()));
}

// base ** exponent by squaring: O(log exponent) steps, so `1 ** 10**12` does not run 10^12 loops. A square
// that overflows while bits of the exponent remain means the result overflows too.
std::int64_t python_int_pow(std::int64_t base, std::int64_t exponent) {
  std::int64_t result = 1;
  while (exponent > 0) {
    if ((exponent & 1) && __builtin_mul_overflow(result, base, &result)) fail_integer_overflow();
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) fail_integer_overflow();
  }
  return result;
}

Value power(const std::string& op, const Value& left, const Value& right) {
  if (both_integral(left, right) && right.as_int() >= 0)
    return Value::from_int(python_int_pow(left.as_int(), right.as_int()));
  if (both_numbers(left, right)) {
    if (left.as_float() == 0.0 && right.as_float() < 0) throw EvalError("0.0 cannot be raised to a negative power");
    return Value::from_float(std::pow(left.as_float(), right.as_float()));
  }
  throw unsupported_operands(op, left, right);
}

const std::unordered_map<std::string_view, BinaryFn>& binary_operators() {
  static const std::unordered_map<std::string_view, BinaryFn> table = {
      {"+", add}, {"-", subtract}, {"*", multiply}, {"/", divide}, {"//", divide}, {"%", divide}, {"**", power},
  };
  return table;
}

// ------------------------------------------------------------------ comparisons

// The comparison operators; the comparison tests (`x is gt 3`, ...) use the same functions.
using CompareFn = bool (*)(const Value& left, const Value& right);

bool not_equal(const Value& a, const Value& b) { return !equals(a, b); }
bool greater(const Value& a, const Value& b) { return less_than(b, a); }
bool greater_or_equal(const Value& a, const Value& b) { return less_than(b, a) || equals(a, b); }
bool less_or_equal(const Value& a, const Value& b) { return less_than(a, b) || equals(a, b); }
bool contained_in(const Value& item, const Value& container) { return contains(container, item); }
bool not_contained_in(const Value& item, const Value& container) { return !contains(container, item); }

const std::unordered_map<std::string_view, CompareFn>& comparisons() {
  static const std::unordered_map<std::string_view, CompareFn> table = {
      {"==", equals},        {"!=", not_equal},        {"<", less_than},     {">", greater},
      {"<=", less_or_equal}, {">=", greater_or_equal}, {"in", contained_in}, {"not in", not_contained_in},
  };
  return table;
}

// ------------------------------------------------------------------ tests

// `name` is the name the template used (messages show an alias such as "eq" as written).
using TestFn = bool (*)(const std::string& name, const Value& value, const CallArgs& args);

// The one argument of a test such as `divisibleby(3)` or `sameas x`.
Value test_argument(const std::string& name, const CallArgs& args, const char* parameter) {
  auto a = bind(name, args, 1, {parameter});
  if (!a[0]) throw EvalError("the test '" + name + "' needs an argument");
  return *a[0];
}

bool is_divisible(const Value& value, const Value& divisor) { return !truthy(binary_operator("%", value, divisor)); }

bool test_sameas(const std::string& name, const Value& value, const CallArgs& args) {
  Value other = test_argument(name, args, "other");
  if (value.kind == Kind::None || value.kind == Kind::Bool || other.kind == Kind::None || other.kind == Kind::Bool)
    return value.kind == other.kind && value.boolean == other.boolean;
  if (value.kind == Kind::List && other.kind == Kind::List) return value.list == other.list;
  if (value.kind == Kind::Dict && other.kind == Kind::Dict) return value.dict == other.dict;
  if (value.kind == Kind::Namespace && other.kind == Kind::Namespace) return value.ns == other.ns;
  throw EvalError("'sameas' (Python object identity) is only supported for None, booleans and containers");
}

bool is_sequence(const Value& value) {
  return value.is_string() || value.kind == Kind::Dict || value.is_undefined() ||
         (value.kind == Kind::List && value.sequence != Sequence::Generator);
}

bool is_iterable(const Value& value) {
  return value.is_string() || value.kind == Kind::Dict || value.kind == Kind::List || value.is_undefined();
}

// Tests that compare the value with their one argument: `kCompare(value, other)`.
template <bool (*kCompare)(const Value&, const Value&)>
bool test_compare(const std::string& name, const Value& value, const CallArgs& args) {
  return kCompare(value, test_argument(name, args, "other"));
}

// Every test Jinja2 has, under all its names. Tests without a parameter ignore extra arguments.
const std::unordered_map<std::string_view, TestFn>& tests() {
  using Name = const std::string&;
  using Args = const CallArgs&;
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"defined", [](Name, const Value& v, Args) { return !v.is_undefined(); }},
      {"undefined", [](Name, const Value& v, Args) { return v.is_undefined(); }},
      {"none", [](Name, const Value& v, Args) { return v.is_none(); }},
      {"boolean", [](Name, const Value& v, Args) { return v.kind == Kind::Bool; }},
      {"false", [](Name, const Value& v, Args) { return v.kind == Kind::Bool && !v.boolean; }},
      {"true", [](Name, const Value& v, Args) { return v.kind == Kind::Bool && v.boolean; }},
      {"integer", [](Name, const Value& v, Args) { return v.kind == Kind::Int; }},
      {"float", [](Name, const Value& v, Args) { return v.kind == Kind::Float; }},
      {"string", [](Name, const Value& v, Args) { return v.is_string(); }},
      {"mapping", [](Name, const Value& v, Args) { return v.kind == Kind::Dict; }},
      {"number", [](Name, const Value& v, Args) { return v.is_number(); }},
      {"sequence", [](Name, const Value& v, Args) { return is_sequence(v); }},
      {"iterable", [](Name, const Value& v, Args) { return is_iterable(v); }},
      {"callable", [](Name, const Value& v, Args) { return v.kind == Kind::Callable || v.kind == Kind::Loop; }},
      {"escaped", [](Name, const Value& v, Args) { return v.is_string() && v.markup; }},
      {"lower", [](Name, const Value& v, Args) { return pystr::is_lower(to_str(v)); }},
      {"upper", [](Name, const Value& v, Args) { return pystr::is_upper(to_str(v)); }},
      {"odd", [](Name, const Value& v, Args) { return !is_divisible(v, Value::from_int(2)); }},
      {"even", [](Name, const Value& v, Args) { return is_divisible(v, Value::from_int(2)); }},
      {"divisibleby",
       [](Name name, const Value& v, Args args) { return is_divisible(v, test_argument(name, args, "num")); }},
      {"filter",
       [](Name, const Value& v, Args) { return v.is_string() && filter_support(v.text) == Support::Supported; }},
      {"test", [](Name, const Value& v, Args) { return v.is_string() && test_support(v.text) == Support::Supported; }},
      {"sameas", test_sameas},
      {"in", [](Name name, const Value& v, Args args) { return contained_in(v, test_argument(name, args, "seq")); }},
      {"==", test_compare<equals>},
      {"eq", test_compare<equals>},
      {"equalto", test_compare<equals>},
      {"!=", test_compare<not_equal>},
      {"ne", test_compare<not_equal>},
      {">", test_compare<greater>},
      {"gt", test_compare<greater>},
      {"greaterthan", test_compare<greater>},
      {">=", test_compare<greater_or_equal>},
      {"ge", test_compare<greater_or_equal>},
      {"<", test_compare<less_than>},
      {"lt", test_compare<less_than>},
      {"lessthan", test_compare<less_than>},
      {"<=", test_compare<less_or_equal>},
      {"le", test_compare<less_or_equal>},
  };
  return table;
}

}  // namespace

// ------------------------------------------------------------------ operators

std::uint64_t range_length(std::int64_t start, std::int64_t stop, std::int64_t step) {
  if (step > 0 ? start >= stop : start <= stop) return 0;
  // The distance between two int64 values and the magnitude of INT64_MIN fit in a uint64.
  std::uint64_t distance = step > 0 ? static_cast<std::uint64_t>(stop) - static_cast<std::uint64_t>(start)
                                    : static_cast<std::uint64_t>(start) - static_cast<std::uint64_t>(stop);
  std::uint64_t stride = step > 0 ? static_cast<std::uint64_t>(step) : 0 - static_cast<std::uint64_t>(step);
  return (distance - 1) / stride + 1;
}

Value binary_operator(const std::string& op, const Value& left, const Value& right) {
  if (left.is_undefined()) fail_undefined(left);
  if (right.is_undefined()) fail_undefined(right);
  auto found = binary_operators().find(op);
  if (found == binary_operators().end()) throw EvalError("unknown operator '" + op + "'");
  return found->second(op, left, right);
}

Value unary_minus(const Value& operand, bool negate) {
  if (operand.is_undefined()) fail_undefined(operand);
  if (operand.kind == Kind::Float) return Value::from_float(negate ? -operand.number : operand.number);
  if (operand.is_integral()) {
    if (negate && operand.as_int() == INT64_MIN) fail_integer_overflow();
    return Value::from_int(negate ? -operand.as_int() : operand.as_int());
  }
  throw EvalError(std::string("bad operand type for unary ") + (negate ? "-" : "+") + ": '" +
                  python_type_name(operand) + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::Undefined: return false;  // Undefined iterates as empty
    case Kind::String:
      if (!item.is_string())
        throw EvalError("'in <string>' requires string as left operand, not " + python_type_name(item));
      charge_bytes(container.text.size());
      return item.text.empty() || SubstringSearch(item.text).find(container.text) != std::string::npos;
    case Kind::List:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& v) { return equals(v, item); });
    case Kind::Dict: return dict_find(container.entries(), item) != nullptr;
    default: throw EvalError("argument of type '" + python_type_name(container) + "' is not iterable");
  }
}

bool compare(const std::string& op, const Value& left, const Value& right) {
  auto found = comparisons().find(op);
  if (found == comparisons().end()) throw EvalError("unknown comparison '" + op + "'");
  return found->second(left, right);
}

// ------------------------------------------------------------------ subscription

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(object);
  auto fallback = [&] {
    // environment.getitem: a failed subscription retries as an attribute when the key is a string.
    if (key.is_string()) return get_attribute(object, key.text);
    return Value::undefined("'" + type_description(object) + "' has no element " + to_repr(key));
  };
  if ((is_plain_sequence(object) || object.is_string()) && key.is_integral()) {
    std::int64_t length = length_of(object);
    std::int64_t index = key.as_int();
    if (index < 0) index += length;
    if (index < 0 || index >= length)
      return Value::undefined(type_description(object) + " has no element " + std::to_string(key.as_int()));
    if (object.is_string()) {
      std::u32string cps = pystr::decode(object.text);
      return string_like(object, pystr::encode(std::u32string(1, cps[static_cast<std::size_t>(index)])));
    }
    return object.items()[static_cast<std::size_t>(index)];
  }
  if (object.kind == Kind::Dict) {
    const Value* found = dict_find(object.entries(), key);
    if (found) return *found;
  }
  return fallback();
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) fail_undefined(object);
  auto bound = [](const Value& v, bool& present) -> std::int64_t {
    present = !(v.is_none() || v.is_undefined());
    return present ? v.as_int() : 0;
  };
  for (const Value* v : {&start, &stop, &step})
    if (!(v->is_none() || v->is_integral())) return Value::undefined("slice indices must be integers or None");
  if (!(is_plain_sequence(object) || object.is_string()))
    return Value::undefined("'" + type_description(object) + "' cannot be sliced");
  bool has_start, has_stop, has_step;
  std::int64_t first = bound(start, has_start), last = bound(stop, has_stop), stride = bound(step, has_step);
  if (!has_step) stride = 1;
  if (stride == 0) throw EvalError("slice step cannot be zero");
  std::int64_t length = length_of(object);
  std::int64_t lower = stride > 0 ? 0 : -1, upper = stride > 0 ? length : length - 1;
  auto clamp = [&](std::int64_t v) {
    if (v < 0) {
      v += length;
      if (v < lower) v = lower;
    } else if (v > upper) {
      v = upper;
    }
    return v;
  };
  first = has_start ? clamp(first) : (stride < 0 ? upper : lower);
  last = has_stop ? clamp(last) : (stride < 0 ? lower : upper);
  // first + k * stride for k below the count stays between first and last: `i += stride` past the
  // last index would overflow for strides near the int64 limits (x[::-9223372036854775808]).
  std::uint64_t count = range_length(first, last, stride);
  std::vector<std::size_t> indices;
  indices.reserve(static_cast<std::size_t>(count));
  for (std::uint64_t k = 0; k < count; ++k)
    indices.push_back(
        static_cast<std::size_t>(static_cast<std::uint64_t>(first) + k * static_cast<std::uint64_t>(stride)));
  if (object.is_string()) {
    std::u32string cps = pystr::decode(object.text), out;
    for (std::size_t i : indices) out.push_back(cps[i]);
    return string_like(object, pystr::encode(out));  // Markup keeps itself through [i] and [a:b]
  }
  ValueList out;
  for (std::size_t i : indices) out.push_back(object.items()[i]);
  return Value::from_list(std::move(out), object.sequence);
}

// ------------------------------------------------------------------ tests

Support test_support(const std::string& name) { return tests().count(name) ? Support::Supported : Support::Unknown; }

bool apply_test(const std::string& name, const Value& value, const CallArgs& args) {
  auto found = tests().find(name);
  if (found == tests().end()) throw EvalError("no test named '" + name + "'");
  return found->second(name, value, args);
}

}  // namespace kvchat::jinja
