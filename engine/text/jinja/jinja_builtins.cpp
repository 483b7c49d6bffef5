#include "engine/text/jinja/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>

#include "engine/text/jinja/jinja_pystr.h"

namespace kvchat::jinja {

namespace {

// ------------------------------------------------------------------ argument binding

// Binds positional and keyword arguments to a Python-style parameter list.
std::vector<std::optional<Value>> bind(const std::string& function, const CallArgs& args, std::size_t skip,
                                       std::initializer_list<const char*> parameters) {
  std::vector<std::optional<Value>> bound(parameters.size());
  std::vector<std::string> names(parameters.begin(), parameters.end());
  if (args.positional.size() > skip + names.size())
    throw EvalError(function + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
                    std::to_string(args.positional.size() - skip) + " given)");
  for (std::size_t i = skip; i < args.positional.size(); ++i) bound[i - skip] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) throw EvalError(function + "() got an unexpected keyword argument '" + key + "'");
    auto index = static_cast<std::size_t>(it - names.begin());
    if (bound[index]) throw EvalError(function + "() got multiple values for argument '" + key + "'");
    bound[index] = value;
  }
  return bound;
}

bool bool_arg(const std::optional<Value>& arg, bool fallback) { return arg ? truthy(*arg) : fallback; }

std::int64_t int_arg(const std::string& function, const std::optional<Value>& arg, std::int64_t fallback) {
  if (!arg || arg->is_none()) return fallback;
  if (!arg->is_integral())
    throw EvalError(function + "(): expected an integer argument, got " + python_type_name(*arg));
  return arg->as_int();
}

std::optional<std::string> optional_str_arg(const std::string& function, const std::optional<Value>& arg) {
  if (!arg || arg->is_none()) return std::nullopt;
  if (!arg->is_string())
    throw EvalError(function + "(): expected a string argument, got " + python_type_name(*arg));
  return arg->text;
}

std::string str_arg(const std::string& function, const std::optional<Value>& arg, const char* name) {
  if (!arg) throw EvalError(function + "() missing required argument '" + name + "'");
  if (!arg->is_string())
    throw EvalError(function + "(): argument '" + name + "' must be str, not " + python_type_name(*arg));
  return arg->text;
}

// ------------------------------------------------------------------ attribute paths

// make_attrgetter: "a.b.0" looks up item a, then b, then element 0 (environment.getitem).
Value lookup_attribute_path(const Value& item, const Value& attribute, const std::optional<Value>& fallback) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (const std::string& part : pystr::split(attribute.text, std::string("."), -1)) {
      bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      parts.push_back(digits ? Value::from_int(std::stoll(part)) : Value::from_string(part));
    }
  } else {
    parts.push_back(attribute);
  }
  Value current = item;
  for (const Value& part : parts) {
    current = get_item(current, part);
    if (fallback && !fallback->is_none() && current.is_undefined()) current = *fallback;
  }
  return current;
}

Value ignore_case(const Value& value) {
  return value.is_string() ? Value::from_string(pystr::lower(value.text)) : value;
}

// ------------------------------------------------------------------ string methods

Value call_str_method(const std::string& text, const std::string& method, const CallArgs& args) {
  const std::string fn = "str." + method;
  if (method == "strip" || method == "lstrip" || method == "rstrip") {
    auto a = bind(fn, args, 0, {"chars"});
    return Value::from_string(pystr::strip(text, optional_str_arg(fn, a[0]), method != "rstrip", method != "lstrip"));
  }
  if (method == "split" || method == "rsplit") {
    auto a = bind(fn, args, 0, {"sep", "maxsplit"});
    auto separator = optional_str_arg(fn, a[0]);
    std::int64_t max_split = int_arg(fn, a[1], -1);
    auto parts = method == "split" ? pystr::split(text, separator, max_split) : pystr::rsplit(text, separator, max_split);
    ValueList items;
    for (auto& part : parts) items.push_back(Value::from_string(std::move(part)));
    return Value::from_list(std::move(items));
  }
  if (method == "splitlines") {
    auto a = bind(fn, args, 0, {"keepends"});
    if (bool_arg(a[0], false)) throw EvalError("str.splitlines(keepends=True) is not supported");
    ValueList items;
    for (auto& line : pystr::splitlines(text)) items.push_back(Value::from_string(std::move(line)));
    return Value::from_list(std::move(items));
  }
  if (method == "startswith" || method == "endswith") {
    auto a = bind(fn, args, 0, {"prefix", "start", "end"});
    if (!a[0]) throw EvalError(fn + "() takes at least 1 argument (0 given)");
    if (a[1] || a[2]) throw EvalError(fn + "() with start/end positions is not supported");
    std::vector<std::string> candidates;
    if (a[0]->is_string()) {
      candidates.push_back(a[0]->text);
    } else if (a[0]->kind == Kind::List && a[0]->sequence == Sequence::Tuple) {
      for (const Value& item : a[0]->items()) {
        if (!item.is_string())
          throw EvalError("tuple for " + method + " must only contain str, not " + python_type_name(item));
        candidates.push_back(item.text);
      }
    } else {
      throw EvalError(method + " first arg must be str or a tuple of str, not " + python_type_name(*a[0]));
    }
    for (const std::string& c : candidates) {
      bool hit = method == "startswith"
                     ? text.compare(0, c.size(), c) == 0
                     : text.size() >= c.size() && text.compare(text.size() - c.size(), c.size(), c) == 0;
      if (hit) return Value::from_bool(true);
    }
    return Value::from_bool(false);
  }
  if (method == "upper" || method == "lower" || method == "title" || method == "capitalize") {
    bind(fn, args, 0, {});
    if (method == "upper") return Value::from_string(pystr::upper(text));
    if (method == "lower") return Value::from_string(pystr::lower(text));
    if (method == "title") return Value::from_string(pystr::title(text));
    return Value::from_string(pystr::capitalize(text));
  }
  if (method == "islower" || method == "isupper") {
    bind(fn, args, 0, {});
    return Value::from_bool(method == "islower" ? pystr::is_lower(text) : pystr::is_upper(text));
  }
  if (method == "replace") {
    auto a = bind(fn, args, 0, {"old", "new", "count"});
    return Value::from_string(
        pystr::replace(text, str_arg(fn, a[0], "old"), str_arg(fn, a[1], "new"), int_arg(fn, a[2], -1)));
  }
  if (method == "find" || method == "count") {
    auto a = bind(fn, args, 0, {"sub"});
    std::string needle = str_arg(fn, a[0], "sub");
    return Value::from_int(method == "find" ? pystr::find(text, needle) : pystr::count(text, needle));
  }
  if (method == "removeprefix" || method == "removesuffix") {
    auto a = bind(fn, args, 0, {"affix"});
    std::string affix = str_arg(fn, a[0], "affix");
    if (method == "removeprefix")
      return Value::from_string(text.compare(0, affix.size(), affix) == 0 ? text.substr(affix.size()) : text);
    bool ends = text.size() >= affix.size() && text.compare(text.size() - affix.size(), affix.size(), affix) == 0;
    return Value::from_string(ends ? text.substr(0, text.size() - affix.size()) : text);
  }
  if (method == "join") {
    auto a = bind(fn, args, 0, {"iterable"});
    if (!a[0]) throw EvalError("str.join() takes exactly one argument (0 given)");
    std::string out;
    std::size_t index = 0;
    for (const Value& item : iterate(*a[0])) {
      if (!item.is_string())
        throw EvalError("sequence item " + std::to_string(index) + ": expected str instance, " +
                        python_type_name(item) + " found");
      if (index++) out += text;
      out += item.text;
    }
    return Value::from_string(std::move(out));
  }
  throw EvalError("the method str." + method + "() is not supported");
}

const std::set<std::string>& str_attributes() {
  static const std::set<std::string> names = {
      "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
      "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier",
      "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower",
      "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex",
      "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase",
      "title", "translate", "upper", "zfill"};
  return names;
}

const std::set<std::string>& dict_attributes() {
  static const std::set<std::string> names = {"clear", "copy", "fromkeys", "get", "items", "keys",
                                              "pop", "popitem", "setdefault", "update", "values"};
  return names;
}

const std::set<std::string>& list_attributes() {
  static const std::set<std::string> names = {"append", "clear", "copy", "count", "extend", "index",
                                              "insert", "pop", "remove", "reverse", "sort"};
  return names;
}

ValueList dict_items_as_tuples(const DictEntries& entries) {
  ValueList items;
  items.reserve(entries.size());
  for (const auto& [key, value] : entries) items.push_back(Value::from_list({key, value}, Sequence::Tuple));
  return items;
}

Value call_dict_method(const Value& dict, const std::string& method, const CallArgs& args) {
  const std::string fn = "dict." + method;
  if (method == "get") {
    auto a = bind(fn, args, 0, {"key", "default"});
    if (!a[0]) throw EvalError("dict.get() expected at least 1 argument, got 0");
    const Value* found = dict_find(dict.entries(), *a[0]);
    return found ? *found : (a[1] ? *a[1] : Value::none());
  }
  if (method == "items" || method == "keys" || method == "values") {
    bind(fn, args, 0, {});
    if (method == "items") return Value::from_list(dict_items_as_tuples(dict.entries()), Sequence::View);
    ValueList items;
    for (const auto& [key, value] : dict.entries()) items.push_back(method == "keys" ? key : value);
    return Value::from_list(std::move(items), Sequence::View);
  }
  if (method == "copy") return Value::from_dict(dict.entries());
  throw EvalError("the method dict." + method + "() is not supported (templates cannot modify a dict)");
}

Value call_list_method(const Value& list, const std::string& method, const CallArgs& args) {
  const std::string fn = python_type_name(list) + "." + method;
  if (method == "count") {
    auto a = bind(fn, args, 0, {"value"});
    if (!a[0]) throw EvalError(fn + "() takes exactly one argument (0 given)");
    std::int64_t n = 0;
    for (const Value& item : list.items()) n += equals(item, *a[0]) ? 1 : 0;
    return Value::from_int(n);
  }
  if (method == "index") {
    auto a = bind(fn, args, 0, {"value"});
    if (!a[0]) throw EvalError(fn + "() takes exactly one argument (0 given)");
    for (std::size_t i = 0; i < list.items().size(); ++i)
      if (equals(list.items()[i], *a[0])) return Value::from_int(static_cast<std::int64_t>(i));
    throw EvalError(to_repr(*a[0]) + " is not in list");
  }
  if (method == "copy") return Value::from_list(list.items());
  throw EvalError("the method " + fn + "() is not supported (templates cannot modify a list)");
}

Value bound_method(const Value& object, const std::string& method) {
  std::string name = python_type_name(object) + "." + method;
  if (object.is_string()) {
    std::string text = object.text;
    return Value::from_callable(name, [text, method](const CallArgs& args) { return call_str_method(text, method, args); });
  }
  if (object.kind == Kind::Dict)
    return Value::from_callable(name, [object, method](const CallArgs& args) { return call_dict_method(object, method, args); });
  return Value::from_callable(name, [object, method](const CallArgs& args) { return call_list_method(object, method, args); });
}

// ------------------------------------------------------------------ loop attributes

Value loop_attribute(const Value& loop_value, const std::string& name) {
  LoopData& loop = *loop_value.loop;
  const auto length = static_cast<std::int64_t>(loop.items->size());
  if (name == "index") return Value::from_int(loop.index0 + 1);
  if (name == "index0") return Value::from_int(loop.index0);
  if (name == "revindex") return Value::from_int(length - loop.index0);
  if (name == "revindex0") return Value::from_int(length - loop.index0 - 1);
  if (name == "first") return Value::from_bool(loop.index0 == 0);
  if (name == "last") return Value::from_bool(loop.index0 == length - 1);
  if (name == "length") return Value::from_int(length);
  if (name == "depth") return Value::from_int(loop.depth0 + 1);
  if (name == "depth0") return Value::from_int(loop.depth0);
  if (name == "previtem")
    return loop.index0 > 0 ? (*loop.items)[static_cast<std::size_t>(loop.index0 - 1)]
                           : Value::undefined("there is no previous item");
  if (name == "nextitem")
    return loop.index0 + 1 < length ? (*loop.items)[static_cast<std::size_t>(loop.index0 + 1)]
                                    : Value::undefined("there is no next item");
  if (name == "cycle") {
    std::int64_t index0 = loop.index0;
    return Value::from_callable("loop.cycle", [index0](const CallArgs& args) {
      if (args.positional.empty()) throw EvalError("no items for cycling given");
      return args.positional[static_cast<std::size_t>(index0) % args.positional.size()];
    });
  }
  if (name == "changed") {
    std::shared_ptr<LoopData> data = loop_value.loop;
    return Value::from_callable("loop.changed", [data](const CallArgs& args) {
      Value current = Value::from_list(args.positional);
      bool changed = !data->last_changed || !equals(*data->last_changed, current);
      if (changed) data->last_changed = std::make_shared<Value>(current);
      return Value::from_bool(changed);
    });
  }
  return Value::undefined("'LoopContext object' has no attribute '" + name + "'");
}

// ------------------------------------------------------------------ numbers

[[noreturn]] void overflow() {
  throw EvalError("integer overflow (Python integers are unbounded; this interpreter uses 64 bits)");
}

double python_float_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0.0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

std::int64_t python_int_mod(std::int64_t a, std::int64_t b) {
  std::int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

std::int64_t python_floor_div(std::int64_t a, std::int64_t b) {
  if (a == INT64_MIN && b == -1) overflow();
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value repeat(const Value& sequence, std::int64_t times) {
  if (sequence.is_string()) {
    std::string out;
    for (std::int64_t i = 0; i < times; ++i) out += sequence.text;
    return Value::from_string(std::move(out));
  }
  ValueList items;
  for (std::int64_t i = 0; i < times; ++i) items.insert(items.end(), sequence.items().begin(), sequence.items().end());
  return Value::from_list(std::move(items), sequence.sequence);
}

bool is_plain_sequence(const Value& v) {
  return v.kind == Kind::List && (v.sequence == Sequence::List || v.sequence == Sequence::Tuple);
}

std::optional<double> parse_python_float(const std::string& raw) {
  std::string text = pystr::strip(raw, std::nullopt, true, true);
  std::string cleaned;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '_') {
      if (i == 0 || i + 1 == text.size() || !std::isdigit(static_cast<unsigned char>(text[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(text[i + 1])))
        return std::nullopt;
      continue;
    }
    cleaned += text[i];
  }
  if (cleaned.empty()) return std::nullopt;
  std::string lower = pystr::lower(cleaned);
  std::string body = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    double v = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -v : v;
  }
  if (body.find_first_not_of("0123456789.e+-") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(cleaned.c_str(), &end);
  if (end != cleaned.c_str() + cleaned.size()) return std::nullopt;
  return value;
}

std::optional<std::int64_t> parse_python_int(const std::string& raw, int base) {
  std::string text = pystr::strip(raw, std::nullopt, true, true);
  std::string cleaned;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '_' && i > 0 && i + 1 < text.size()) continue;
    cleaned += text[i];
  }
  if (cleaned.empty()) return std::nullopt;
  std::size_t digits_at = cleaned[0] == '+' || cleaned[0] == '-' ? 1 : 0;
  // Python accepts the literal's prefix when it matches the base: int("0x1A", 16).
  if (cleaned.size() > digits_at + 2 && cleaned[digits_at] == '0') {
    char prefix = static_cast<char>(std::tolower(static_cast<unsigned char>(cleaned[digits_at + 1])));
    if ((base == 16 && prefix == 'x') || (base == 8 && prefix == 'o') || (base == 2 && prefix == 'b'))
      cleaned.erase(digits_at, 2);
  }
  if (digits_at >= cleaned.size()) return std::nullopt;
  for (std::size_t i = digits_at; i < cleaned.size(); ++i) {
    char c = static_cast<char>(std::tolower(static_cast<unsigned char>(cleaned[i])));
    int digit = std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : 99;
    if (digit >= base) return std::nullopt;
  }
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(cleaned.c_str(), &end, base);
  if (errno == ERANGE) overflow();
  return value;
}

// ------------------------------------------------------------------ filters

Value make_generator(ValueList items) { return Value::from_list(std::move(items), Sequence::Generator); }

ValueList reversed_items(const Value& value, const std::string& filter) {
  if (value.is_undefined()) return {};
  if (value.kind == Kind::List && value.sequence == Sequence::Generator)
    throw EvalError("'generator' object is not reversible (|" + filter + ")");
  if (value.kind == Kind::List || value.kind == Kind::Dict || value.is_string()) {
    ValueList items = iterate(value);
    std::reverse(items.begin(), items.end());
    return items;
  }
  throw EvalError("'" + python_type_name(value) + "' object is not reversible");
}

std::function<bool(const Value&)> select_predicate(const std::string& filter, const CallArgs& args, bool by_attribute) {
  std::size_t offset = 0;
  std::optional<Value> attribute;
  if (by_attribute) {
    if (args.positional.size() < 2) throw EvalError(filter + ": missing parameter for attribute name");
    attribute = args.positional[1];
    offset = 1;
  }
  std::optional<std::string> test;
  CallArgs test_args;
  if (args.positional.size() > 1 + offset) {
    const Value& name = args.positional[1 + offset];
    if (!name.is_string()) throw EvalError(filter + ": the test name must be a string");
    test = name.text;
    if (test_support(*test) != Support::Supported) throw EvalError(filter + ": no test named '" + *test + "'");
    test_args.positional.push_back(Value());  // placeholder for the tested value
    test_args.positional.insert(test_args.positional.end(), args.positional.begin() + 2 + static_cast<long>(offset),
                                args.positional.end());
    test_args.keyword = args.keyword;
  } else if (!args.keyword.empty()) {
    throw EvalError(filter + "() got an unexpected keyword argument '" + args.keyword[0].first + "'");
  }
  return [attribute, test, test_args](const Value& item) {
    Value subject = attribute ? lookup_attribute_path(item, *attribute, std::nullopt) : item;
    if (!test) return truthy(subject);
    return apply_test(*test, subject, test_args);
  };
}

Value filter_select(const std::string& name, const Value& value, const CallArgs& args) {
  bool by_attribute = name == "selectattr" || name == "rejectattr";
  bool keep_when = name == "select" || name == "selectattr";
  auto predicate = select_predicate(name, args, by_attribute);
  ValueList kept;
  for (const Value& item : iterate(value))
    if (predicate(item) == keep_when) kept.push_back(item);
  return make_generator(std::move(kept));
}

Value filter_map(const Value& value, const CallArgs& args) {
  ValueList out;
  if (args.positional.size() == 1) {
    auto attribute = std::find_if(args.keyword.begin(), args.keyword.end(), [](const auto& k) { return k.first == "attribute"; });
    if (attribute == args.keyword.end()) throw EvalError("map requires a filter argument");
    std::optional<Value> fallback;
    for (const auto& [key, v] : args.keyword) {
      if (key == "default") fallback = v;
      else if (key != "attribute") throw EvalError("map(): unexpected keyword argument '" + key + "'");
    }
    for (const Value& item : iterate(value)) out.push_back(lookup_attribute_path(item, attribute->second, fallback));
    return make_generator(std::move(out));
  }
  const Value& filter = args.positional[1];
  if (!filter.is_string()) throw EvalError("map(): the filter name must be a string");
  if (filter_support(filter.text) != Support::Supported) throw EvalError("map(): no filter named '" + filter.text + "'");
  CallArgs filter_args;
  filter_args.positional.push_back(Value());
  filter_args.positional.insert(filter_args.positional.end(), args.positional.begin() + 2, args.positional.end());
  filter_args.keyword = args.keyword;
  for (const Value& item : iterate(value)) {
    filter_args.positional[0] = item;
    out.push_back(apply_filter(filter.text, item, filter_args));
  }
  return make_generator(std::move(out));
}

Value filter_sort(const Value& value, const CallArgs& args) {
  auto a = bind("sort", args, 1, {"reverse", "case_sensitive", "attribute"});
  bool reverse = bool_arg(a[0], false);
  bool case_sensitive = bool_arg(a[1], false);
  ValueList items = iterate(value);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    Value key = a[2] && !a[2]->is_none() ? lookup_attribute_path(item, *a[2], std::nullopt) : item;
    keyed.emplace_back(case_sensitive ? key : ignore_case(key), item);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? less_than(y.first, x.first) : less_than(x.first, y.first);
  });
  ValueList out;
  for (auto& entry : keyed) out.push_back(std::move(entry.second));
  return Value::from_list(std::move(out));
}

Value filter_dictsort(const Value& value, const CallArgs& args) {
  auto a = bind("dictsort", args, 1, {"case_sensitive", "by", "reverse"});
  if (value.kind != Kind::Dict) throw EvalError("dictsort: expected a mapping, got " + python_type_name(value));
  bool case_sensitive = bool_arg(a[0], false);
  std::string by = a[1] ? str_arg("dictsort", a[1], "by") : "key";
  if (by != "key" && by != "value") throw EvalError("You can only sort by either \"key\" or \"value\"");
  bool reverse = bool_arg(a[2], false);
  ValueList items = dict_items_as_tuples(value.entries());
  std::size_t at = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = x.items()[at], ky = y.items()[at];
    if (!case_sensitive) {
      kx = ignore_case(kx);
      ky = ignore_case(ky);
    }
    return reverse ? less_than(ky, kx) : less_than(kx, ky);
  });
  return Value::from_list(std::move(items));
}

Value filter_min_max(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"case_sensitive", "attribute"});
  bool case_sensitive = bool_arg(a[0], false);
  ValueList items = iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) {
    Value k = a[1] && !a[1]->is_none() ? lookup_attribute_path(item, *a[1], std::nullopt) : item;
    return case_sensitive ? k : ignore_case(k);
  };
  std::size_t best = 0;
  for (std::size_t i = 1; i < items.size(); ++i) {
    bool better = name == "min" ? less_than(key(items[i]), key(items[best])) : less_than(key(items[best]), key(items[i]));
    if (better) best = i;
  }
  return items[best];
}

Value filter_unique(const Value& value, const CallArgs& args) {
  auto a = bind("unique", args, 1, {"case_sensitive", "attribute"});
  bool case_sensitive = bool_arg(a[0], false);
  ValueList seen, out;
  for (const Value& item : iterate(value)) {
    Value k = a[1] && !a[1]->is_none() ? lookup_attribute_path(item, *a[1], std::nullopt) : item;
    if (!case_sensitive) k = ignore_case(k);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) continue;
    seen.push_back(k);
    out.push_back(item);
  }
  return make_generator(std::move(out));
}

Value filter_indent(const Value& value, const CallArgs& args) {
  auto a = bind("indent", args, 1, {"width", "first", "blank"});
  std::string indentation;
  if (a[0] && a[0]->is_string()) indentation = a[0]->text;
  else indentation = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, int_arg("indent", a[0], 4))), ' ');
  bool first = bool_arg(a[1], false);
  bool blank = bool_arg(a[2], false);
  std::string text = to_str(value) + "\n";  // Jinja2 appends a newline so that splitlines keeps the last line
  std::vector<std::string> lines = pystr::splitlines(text);
  std::string out;
  if (blank) {
    for (std::size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + indentation : "") + lines[i];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (std::size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : indentation + lines[i]);
  }
  return Value::from_string(first ? indentation + out : out);
}

Value filter_tojson(const Value& value, const CallArgs& args) {
  auto a = bind("tojson", args, 1, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (bool_arg(a[0], false)) throw EvalError("tojson(ensure_ascii=True) is not supported");
  JsonFormat format;
  if (a[1] && !a[1]->is_none()) {
    if (a[1]->is_string()) format.indent = a[1]->text;
    else format.indent = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, int_arg("tojson", a[1], 0))), ' ');
    format.item_separator = ",";
  }
  if (a[2] && !a[2]->is_none()) {
    if (!is_plain_sequence(*a[2]) || a[2]->items().size() != 2 || !a[2]->items()[0].is_string() ||
        !a[2]->items()[1].is_string())
      throw EvalError("tojson: separators must be a pair of strings");
    format.item_separator = a[2]->items()[0].text;
    format.key_separator = a[2]->items()[1].text;
  }
  format.sort_keys = bool_arg(a[3], false);
  return Value::from_string(to_json(value, format));
}

Value filter_title(const Value& value) {
  // Jinja2's title: each item of re.split(r"([-\s({\[<]+)") gets item[0].upper() + item[1:].lower().
  std::u32string cps = pystr::decode(to_str(value));
  std::string out;
  bool word_start = true;
  for (char32_t c : cps) {
    bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || pystr::is_space(c);
    std::string one = pystr::encode(std::u32string(1, c));
    if (separator) {
      out += one;
      word_start = true;
    } else {
      out += word_start ? pystr::upper(one) : pystr::lower(one);
      word_start = false;
    }
  }
  return Value::from_string(std::move(out));
}

}  // namespace

// ------------------------------------------------------------------ registries

Support filter_support(const std::string& name) {
  static const std::set<std::string> supported = {
      "abs",  "capitalize", "count", "d",        "default", "dictsort",   "first", "float",  "indent",
      "int",  "items",      "join",  "last",     "length",  "list",       "lower", "map",    "max",
      "min",  "reject",     "rejectattr", "replace", "reverse", "select", "selectattr", "sort", "string",
      "sum",  "title",      "tojson", "trim",    "unique",  "upper"};
  static const std::set<std::string> known = {
      "attr",     "batch",  "center", "e",      "escape",  "filesizeformat", "forceescape", "format",
      "groupby",  "pprint", "random", "round",  "safe",    "slice",          "striptags",   "truncate",
      "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr"};
  if (supported.count(name)) return Support::Supported;
  return known.count(name) ? Support::KnownUnsupported : Support::Unknown;
}

Support test_support(const std::string& name) {
  static const std::set<std::string> supported = {
      "odd",     "even",     "divisibleby", "defined", "undefined", "filter", "test",   "none",
      "boolean", "false",    "true",        "integer", "float",     "lower",  "upper",  "string",
      "mapping", "number",   "sequence",    "iterable", "callable", "sameas", "escaped", "in",
      "==",      "eq",       "equalto",     "!=",      "ne",        ">",      "gt",     "greaterthan",
      ">=",      "ge",       "<",           "lt",      "lessthan",  "<=",     "le"};
  return supported.count(name) ? Support::Supported : Support::Unknown;
}

Value apply_filter(const std::string& name, const Value& value, const CallArgs& args) {
  // args.positional[0] is the filtered value itself, as Jinja2 passes it.
  if (name == "trim") {
    auto a = bind("trim", args, 1, {"chars"});
    return Value::from_string(pystr::strip(to_str(value), optional_str_arg("trim", a[0]), true, true));
  }
  if (name == "length" || name == "count") {
    bind(name, args, 1, {});
    return Value::from_int(length_of(value));
  }
  if (name == "tojson") return filter_tojson(value, args);
  if (name == "upper" || name == "lower" || name == "capitalize") {
    bind(name, args, 1, {});
    std::string text = to_str(value);
    if (name == "upper") return Value::from_string(pystr::upper(text));
    if (name == "lower") return Value::from_string(pystr::lower(text));
    return Value::from_string(pystr::capitalize(text));
  }
  if (name == "title") {
    bind(name, args, 1, {});
    return filter_title(value);
  }
  if (name == "default" || name == "d") {
    auto a = bind(name, args, 1, {"default_value", "boolean"});
    bool use_default = value.is_undefined() || (bool_arg(a[1], false) && !truthy(value));
    return use_default ? (a[0] ? *a[0] : Value::from_string("")) : value;
  }
  if (name == "first") {
    bind(name, args, 1, {});
    ValueList items = iterate(value);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    bind(name, args, 1, {});
    ValueList items = reversed_items(value, name);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.front();
  }
  if (name == "join") {
    auto a = bind("join", args, 1, {"d", "attribute"});
    std::string separator = a[0] ? to_str(*a[0]) : "";
    std::string out;
    bool first = true;
    for (const Value& item : iterate(value)) {
      if (!first) out += separator;
      first = false;
      out += to_str(a[1] && !a[1]->is_none() ? lookup_attribute_path(item, *a[1], std::nullopt) : item);
    }
    return Value::from_string(std::move(out));
  }
  if (name == "map") return filter_map(value, args);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return filter_select(name, value, args);
  if (name == "list") {
    bind(name, args, 1, {});
    return Value::from_list(iterate(value));
  }
  if (name == "items") {
    bind(name, args, 1, {});
    if (value.is_undefined()) return make_generator({});
    if (value.kind != Kind::Dict) throw EvalError("Can only get item pairs from a mapping.");
    return make_generator(dict_items_as_tuples(value.entries()));
  }
  if (name == "string") {
    bind(name, args, 1, {});
    return Value::from_string(to_str(value));
  }
  if (name == "int") {
    auto a = bind("int", args, 1, {"default", "base"});
    Value fallback = a[0] ? *a[0] : Value::from_int(0);
    std::int64_t base = int_arg("int", a[1], 10);
    if (value.is_string()) {
      if (auto parsed = parse_python_int(value.text, static_cast<int>(base))) return Value::from_int(*parsed);
      if (auto as_float = parse_python_float(value.text); as_float && std::isfinite(*as_float))
        return Value::from_int(static_cast<std::int64_t>(std::trunc(*as_float)));
      return fallback;
    }
    if (value.is_integral()) return Value::from_int(value.as_int());
    if (value.kind == Kind::Float && std::isfinite(value.number))
      return Value::from_int(static_cast<std::int64_t>(std::trunc(value.number)));
    return fallback;
  }
  if (name == "float") {
    auto a = bind("float", args, 1, {"default"});
    Value fallback = a[0] ? *a[0] : Value::from_float(0.0);
    if (value.is_number()) return Value::from_float(value.as_float());
    if (value.is_string())
      if (auto parsed = parse_python_float(value.text)) return Value::from_float(*parsed);
    return fallback;
  }
  if (name == "replace") {
    auto a = bind("replace", args, 1, {"old", "new", "count"});
    if (!a[0] || !a[1]) throw EvalError("replace() missing required arguments 'old' and 'new'");
    return Value::from_string(pystr::replace(to_str(value), to_str(*a[0]), to_str(*a[1]), int_arg("replace", a[2], -1)));
  }
  if (name == "abs") {
    bind(name, args, 1, {});
    if (value.kind == Kind::Float) return Value::from_float(std::fabs(value.number));
    if (value.is_integral()) {
      if (value.as_int() == INT64_MIN) overflow();
      return Value::from_int(std::llabs(value.as_int()));
    }
    throw EvalError("bad operand type for abs(): '" + python_type_name(value) + "'");
  }
  if (name == "sum") {
    auto a = bind("sum", args, 1, {"attribute", "start"});
    Value total = a[1] ? *a[1] : Value::from_int(0);
    for (const Value& item : iterate(value))
      total = binary_operator("+", total, a[0] && !a[0]->is_none() ? lookup_attribute_path(item, *a[0], std::nullopt) : item);
    return total;
  }
  if (name == "sort") return filter_sort(value, args);
  if (name == "dictsort") return filter_dictsort(value, args);
  if (name == "min" || name == "max") return filter_min_max(name, value, args);
  if (name == "unique") return filter_unique(value, args);
  if (name == "reverse") {
    bind(name, args, 1, {});
    if (value.is_string()) {
      std::u32string cps = pystr::decode(value.text);
      std::reverse(cps.begin(), cps.end());
      return Value::from_string(pystr::encode(cps));
    }
    if (value.kind == Kind::List && value.sequence == Sequence::Generator) {
      ValueList items = value.items();
      std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));  // Jinja2 falls back to list(value).reverse()
    }
    return make_generator(reversed_items(value, name));
  }
  if (name == "indent") return filter_indent(value, args);
  throw EvalError("no filter named '" + name + "'");
}

bool apply_test(const std::string& name, const Value& value, const CallArgs& args) {
  auto one_arg = [&](const char* parameter) {
    auto a = bind(name, args, 1, {parameter});
    if (!a[0]) throw EvalError("the test '" + name + "' needs an argument");
    return *a[0];
  };
  if (name == "defined") return !value.is_undefined();
  if (name == "undefined") return value.is_undefined();
  if (name == "none") return value.is_none();
  if (name == "boolean") return value.kind == Kind::Bool;
  if (name == "false") return value.kind == Kind::Bool && !value.boolean;
  if (name == "true") return value.kind == Kind::Bool && value.boolean;
  if (name == "integer") return value.kind == Kind::Int;
  if (name == "float") return value.kind == Kind::Float;
  if (name == "string") return value.is_string();
  if (name == "mapping") return value.kind == Kind::Dict;
  if (name == "number") return value.is_number();
  if (name == "sequence")
    return value.is_string() || value.kind == Kind::Dict || value.is_undefined() ||
           (value.kind == Kind::List && value.sequence != Sequence::Generator);
  if (name == "iterable")
    return value.is_string() || value.kind == Kind::Dict || value.kind == Kind::List || value.is_undefined();
  if (name == "callable") return value.kind == Kind::Callable || value.kind == Kind::Loop;
  if (name == "escaped") return false;  // nothing here is markup
  if (name == "lower" || name == "upper") {
    std::string text = to_str(value);
    return name == "lower" ? pystr::is_lower(text) : pystr::is_upper(text);
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    Value divisor = name == "divisibleby" ? one_arg("num") : Value::from_int(2);
    Value remainder = binary_operator("%", value, divisor);
    bool zero = !truthy(remainder);
    return name == "odd" ? !zero : zero;
  }
  if (name == "filter" || name == "test") {
    if (!value.is_string()) return false;
    return (name == "filter" ? filter_support(value.text) : test_support(value.text)) == Support::Supported;
  }
  if (name == "sameas") {
    Value other = one_arg("other");
    if (value.kind == Kind::None || value.kind == Kind::Bool || other.kind == Kind::None || other.kind == Kind::Bool)
      return value.kind == other.kind && value.boolean == other.boolean;
    if (value.kind == Kind::List && other.kind == Kind::List) return value.list == other.list;
    if (value.kind == Kind::Dict && other.kind == Kind::Dict) return value.dict == other.dict;
    if (value.kind == Kind::Namespace && other.kind == Kind::Namespace) return value.ns == other.ns;
    throw EvalError("'sameas' (Python object identity) is only supported for None, booleans and containers");
  }
  if (name == "in") return contains(one_arg("seq"), value);
  if (name == "==" || name == "eq" || name == "equalto") return equals(value, one_arg("other"));
  if (name == "!=" || name == "ne") return !equals(value, one_arg("other"));
  if (name == ">" || name == "gt" || name == "greaterthan") return less_than(one_arg("other"), value);
  if (name == ">=" || name == "ge") {
    Value other = one_arg("other");
    return less_than(other, value) || equals(value, other);
  }
  if (name == "<" || name == "lt" || name == "lessthan") return less_than(value, one_arg("other"));
  if (name == "<=" || name == "le") {
    Value other = one_arg("other");
    return less_than(value, other) || equals(value, other);
  }
  throw EvalError("no test named '" + name + "'");
}

// ------------------------------------------------------------------ lookup

Value get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) fail_undefined(object);
  auto missing = [&] {
    return Value::undefined(
        (object.is_none() ? "'None'" : "'" + type_description(object) + "'") + " has no attribute '" + name + "'");
  };
  if (!name.empty() && name[0] == '_') return missing();  // the sandbox hides private attributes
  switch (object.kind) {
    case Kind::String:
      return str_attributes().count(name) ? bound_method(object, name) : missing();
    case Kind::Dict: {
      if (dict_attributes().count(name)) return bound_method(object, name);
      const Value* found = dict_find(object.entries(), Value::from_string(name));
      return found ? *found : missing();
    }
    case Kind::List:
      if (object.sequence == Sequence::List && list_attributes().count(name)) return bound_method(object, name);
      if (object.sequence == Sequence::Tuple && (name == "count" || name == "index")) return bound_method(object, name);
      return missing();
    case Kind::Namespace: {
      const Value* found = dict_find(object.ns->attributes, Value::from_string(name));
      return found ? *found : missing();
    }
    case Kind::Loop:
      return loop_attribute(object, name);
    default:
      return missing();
  }
}

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
      return Value::from_string(pystr::encode(std::u32string(1, cps[static_cast<std::size_t>(index)])));
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
    if (!(v->is_none() || v->is_integral()))
      return Value::undefined("slice indices must be integers or None");
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
  std::vector<std::size_t> indices;
  for (std::int64_t i = first; stride > 0 ? i < last : i > last; i += stride) indices.push_back(static_cast<std::size_t>(i));
  if (object.is_string()) {
    std::u32string cps = pystr::decode(object.text), out;
    for (std::size_t i : indices) out.push_back(cps[i]);
    return Value::from_string(pystr::encode(out));
  }
  ValueList out;
  for (std::size_t i : indices) out.push_back(object.items()[i]);
  return Value::from_list(std::move(out), object.sequence);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::Undefined: return false;  // Undefined iterates as empty
    case Kind::String:
      if (!item.is_string())
        throw EvalError("'in <string>' requires string as left operand, not " + python_type_name(item));
      return container.text.find(item.text) != std::string::npos;
    case Kind::List:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& v) { return equals(v, item); });
    case Kind::Dict: return dict_find(container.entries(), item) != nullptr;
    default:
      throw EvalError("argument of type '" + python_type_name(container) + "' is not iterable");
  }
}

// ------------------------------------------------------------------ operators

Value binary_operator(const std::string& op, const Value& left, const Value& right) {
  if (left.is_undefined()) fail_undefined(left);
  if (right.is_undefined()) fail_undefined(right);
  auto unsupported = [&]() -> EvalError {
    if (op == "+" && (left.is_string() || is_plain_sequence(left)) && left.kind != right.kind)
      return EvalError("can only concatenate " + python_type_name(left) + " (not \"" + python_type_name(right) + "\") to " +
                       python_type_name(left));
    return EvalError("unsupported operand type(s) for " + op + ": '" + python_type_name(left) + "' and '" +
                     python_type_name(right) + "'");
  };
  bool integral = left.is_integral() && right.is_integral();
  bool numeric = left.is_number() && right.is_number();
  if (op == "+") {
    if (integral) {
      std::int64_t r;
      if (__builtin_add_overflow(left.as_int(), right.as_int(), &r)) overflow();
      return Value::from_int(r);
    }
    if (numeric) return Value::from_float(left.as_float() + right.as_float());
    if (left.is_string() && right.is_string()) return Value::from_string(left.text + right.text);
    if (is_plain_sequence(left) && is_plain_sequence(right) && left.sequence == right.sequence) {
      ValueList items = left.items();
      items.insert(items.end(), right.items().begin(), right.items().end());
      return Value::from_list(std::move(items), left.sequence);
    }
    throw unsupported();
  }
  if (op == "-") {
    if (integral) {
      std::int64_t r;
      if (__builtin_sub_overflow(left.as_int(), right.as_int(), &r)) overflow();
      return Value::from_int(r);
    }
    if (numeric) return Value::from_float(left.as_float() - right.as_float());
    throw unsupported();
  }
  if (op == "*") {
    if (integral) {
      std::int64_t r;
      if (__builtin_mul_overflow(left.as_int(), right.as_int(), &r)) overflow();
      return Value::from_int(r);
    }
    if (numeric) return Value::from_float(left.as_float() * right.as_float());
    if ((left.is_string() || is_plain_sequence(left)) && right.is_integral()) return repeat(left, right.as_int());
    if ((right.is_string() || is_plain_sequence(right)) && left.is_integral()) return repeat(right, left.as_int());
    throw unsupported();
  }
  if (op == "/" || op == "//" || op == "%") {
    if (left.is_string() && op == "%") throw EvalError("printf-style string formatting ('%' on a string) is not supported");
    if (!numeric) throw unsupported();
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
  if (op == "**") {
    if (integral && right.as_int() >= 0) {
      std::int64_t result = 1, base = left.as_int();
      for (std::int64_t e = right.as_int(); e > 0; --e)
        if (__builtin_mul_overflow(result, base, &result)) overflow();
      return Value::from_int(result);
    }
    if (numeric) {
      if (left.as_float() == 0.0 && right.as_float() < 0) throw EvalError("0.0 cannot be raised to a negative power");
      return Value::from_float(std::pow(left.as_float(), right.as_float()));
    }
    throw unsupported();
  }
  throw EvalError("unknown operator '" + op + "'");
}

Value unary_minus(const Value& operand, bool negate) {
  if (operand.is_undefined()) fail_undefined(operand);
  if (operand.kind == Kind::Float) return Value::from_float(negate ? -operand.number : operand.number);
  if (operand.is_integral()) {
    if (negate && operand.as_int() == INT64_MIN) overflow();
    return Value::from_int(negate ? -operand.as_int() : operand.as_int());
  }
  throw EvalError(std::string("bad operand type for unary ") + (negate ? "-" : "+") + ": '" + python_type_name(operand) + "'");
}

}  // namespace kvchat::jinja
