// Jinja2's filters ({{ x | name(args) }}), dispatched through one table of name -> implementation.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/text/jinja/jinja_arguments.h"
#include "engine/text/jinja/jinja_budget.h"
#include "engine/text/jinja/jinja_builtins.h"
#include "engine/text/jinja/jinja_pystr.h"

namespace kvchat::jinja {

namespace {

// args.positional[0] is the filtered value itself, as Jinja2 passes it; `name` is the name the
// template used (an alias such as "d" shows in messages as written).
using FilterFn = Value (*)(const std::string& name, const Value& value, const CallArgs& args);

// ------------------------------------------------------------------ attribute paths

// make_attrgetter: "a.b.0" looks up item a, then b, then element 0 (environment.getitem).
Value lookup_attribute_path(const Value& item, const Value& attribute, const std::optional<Value>& fallback) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (const std::string& part : pystr::split(attribute.text, std::string("."), -1)) {
      // Digits are an index (Python's int(part)); past 18 digits no list is that long: keep it a key.
      bool digits = !part.empty() && part.size() <= 18 && part.find_first_not_of("0123456789") == std::string::npos;
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

// The item itself, or its attribute path when the filter was given a non-None `attribute`.
Value item_or_attribute(const Value& item, const std::optional<Value>& attribute) {
  return attribute && !attribute->is_none() ? lookup_attribute_path(item, *attribute, std::nullopt) : item;
}

Value ignore_case(const Value& value) {
  return value.is_string() ? Value::from_string(pystr::lower(value.text)) : value;
}

// ------------------------------------------------------------------ Python's float() and int() of a string

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

std::optional<std::int64_t> parse_python_int(const std::string& raw, std::int64_t base) {
  if (base < 2 || base > 36) return std::nullopt;  // Python raises ValueError, which int() turns into its default
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
  long long value = std::strtoll(cleaned.c_str(), &end, static_cast<int>(base));
  if (errno == ERANGE) fail_integer_overflow();
  return value;
}

// ------------------------------------------------------------------ sequences

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

Value filter_list(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  return Value::from_list(iterate(value));
}

Value filter_length(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  return Value::from_int(length_of(value));
}

Value filter_first(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  ValueList items = iterate(value);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value filter_last(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  ValueList items = reversed_items(value, name);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.front();
}

Value filter_reverse(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  if (value.is_string()) {
    std::u32string cps = pystr::decode(value.text);
    std::reverse(cps.begin(), cps.end());
    return string_like(value, pystr::encode(cps));  // value[::-1]
  }
  if (value.kind == Kind::List && value.sequence == Sequence::Generator) {
    ValueList items = value.items();
    std::reverse(items.begin(), items.end());
    return Value::from_list(std::move(items));  // Jinja2 falls back to list(value).reverse()
  }
  return make_generator(reversed_items(value, name));
}

Value filter_items(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  if (value.is_undefined()) return make_generator({});
  if (value.kind != Kind::Dict) throw EvalError("Can only get item pairs from a mapping.");
  return make_generator(dict_items_as_tuples(value.entries()));
}

Value filter_join(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"d", "attribute"});
  std::string separator = a[0] ? to_str(*a[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(value)) {
    std::string text = to_str(item_or_attribute(item, a[1]));
    check_size(saturating_add(out.size(), saturating_add(separator.size(), text.size())), "string");
    if (!first) out += separator;
    first = false;
    out += text;
  }
  return Value::from_string(std::move(out));
}

Value filter_sum(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"attribute", "start"});
  Value total = a[1] ? *a[1] : Value::from_int(0);
  for (const Value& item : iterate(value)) total = binary_operator("+", total, item_or_attribute(item, a[0]));
  return total;
}

// ------------------------------------------------------------------ select, map, sort

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

// select / reject / selectattr / rejectattr: `kKeep` is what the test must give for an item to stay.
template <bool kByAttribute, bool kKeep>
Value filter_select(const std::string& name, const Value& value, const CallArgs& args) {
  // Jinja2 starts with `if value:`: None, undefined or any falsy value is an empty generator, and
  // the arguments are not even looked at.
  if (!truthy(value)) return make_generator({});
  auto predicate = select_predicate(name, args, kByAttribute);
  ValueList kept;
  for (const Value& item : iterate(value))
    if (predicate(item) == kKeep) kept.push_back(item);
  return make_generator(std::move(kept));
}

Value filter_map(const std::string&, const Value& value, const CallArgs& args) {
  if (!truthy(value)) return make_generator({});  // as select: `if value:` comes first
  ValueList out;
  if (args.positional.size() == 1) {
    auto attribute =
        std::find_if(args.keyword.begin(), args.keyword.end(), [](const auto& k) { return k.first == "attribute"; });
    if (attribute == args.keyword.end()) throw EvalError("map requires a filter argument");
    std::optional<Value> fallback;
    for (const auto& [key, v] : args.keyword) {
      if (key == "default")
        fallback = v;
      else if (key != "attribute")
        throw EvalError("map(): unexpected keyword argument '" + key + "'");
    }
    for (const Value& item : iterate(value)) out.push_back(lookup_attribute_path(item, attribute->second, fallback));
    return make_generator(std::move(out));
  }
  const Value& filter = args.positional[1];
  if (!filter.is_string()) throw EvalError("map(): the filter name must be a string");
  if (filter_support(filter.text) != Support::Supported)
    throw EvalError("map(): no filter named '" + filter.text + "'");
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

Value filter_sort(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"reverse", "case_sensitive", "attribute"});
  bool reverse = bool_arg(a[0], false);
  bool case_sensitive = bool_arg(a[1], false);
  ValueList items = iterate(value);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    Value key = item_or_attribute(item, a[2]);
    keyed.emplace_back(case_sensitive ? key : ignore_case(key), item);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? less_than(y.first, x.first) : less_than(x.first, y.first);
  });
  ValueList out;
  for (auto& entry : keyed) out.push_back(std::move(entry.second));
  return Value::from_list(std::move(out));
}

Value filter_dictsort(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"case_sensitive", "by", "reverse"});
  if (value.kind != Kind::Dict) throw EvalError("dictsort: expected a mapping, got " + python_type_name(value));
  bool case_sensitive = bool_arg(a[0], false);
  std::string by = a[1] ? str_arg(name, a[1], "by") : "key";
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

// min and max: `kMin` picks the direction.
template <bool kMin>
Value filter_min_max(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"case_sensitive", "attribute"});
  bool case_sensitive = bool_arg(a[0], false);
  ValueList items = iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) {
    Value k = item_or_attribute(item, a[1]);
    return case_sensitive ? k : ignore_case(k);
  };
  std::size_t best = 0;
  for (std::size_t i = 1; i < items.size(); ++i) {
    bool better = kMin ? less_than(key(items[i]), key(items[best])) : less_than(key(items[best]), key(items[i]));
    if (better) best = i;
  }
  return items[best];
}

Value filter_unique(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"case_sensitive", "attribute"});
  bool case_sensitive = bool_arg(a[0], false);
  ValueList seen, out;
  for (const Value& item : iterate(value)) {
    Value k = item_or_attribute(item, a[1]);
    if (!case_sensitive) k = ignore_case(k);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) continue;
    seen.push_back(k);
    out.push_back(item);
  }
  return make_generator(std::move(out));
}

// ------------------------------------------------------------------ strings

Value filter_string(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  return string_like(value, to_str(value));  // soft_str: a Markup stays one
}

// Markup(value): str() of anything, flagged so that `+` escapes the plain strings added to it.
Value filter_safe(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  return Value::from_markup(to_str(value));
}

// upper, lower and capitalize: `kMap` is the pystr case mapping.
template <std::string (*kMap)(std::string_view)>
Value filter_case(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  return string_like(value, kMap(to_str(value)));  // Markup's upper/lower/capitalize return Markup
}

Value filter_title(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
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

Value filter_trim(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"chars"});
  return string_like(value, pystr::strip(to_str(value), optional_str_arg(name, a[0]), true, true));
}

Value filter_replace(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"old", "new", "count"});
  if (!a[0] || !a[1]) throw EvalError("replace() missing required arguments 'old' and 'new'");
  return Value::from_string(pystr::replace(to_str(value), to_str(*a[0]), to_str(*a[1]), int_arg(name, a[2], -1)));
}

// An indentation of `width` spaces (none for a negative width), its size checked before it is made.
std::string spaces(std::int64_t width) {
  std::size_t size = width > 0 ? static_cast<std::size_t>(width) : 0;
  check_size(size, "string");
  return std::string(size, ' ');
}

Value filter_indent(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"width", "first", "blank"});
  std::string indentation;
  if (a[0] && a[0]->is_string())
    indentation = a[0]->text;
  else
    indentation = spaces(int_arg(name, a[0], 4));
  bool first = bool_arg(a[1], false);
  bool blank = bool_arg(a[2], false);
  std::string text = to_str(value) + "\n";  // Jinja2 appends a newline so that splitlines keeps the last line
  std::vector<std::string> lines = pystr::splitlines(text);
  check_size(saturating_add(text.size(), saturating_multiply(lines.size(), indentation.size())), "string");
  std::string out;
  if (blank) {
    for (std::size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + indentation : "") + lines[i];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (std::size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : indentation + lines[i]);
  }
  return string_like(value, first ? indentation + out : out);
}

Value filter_tojson(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (bool_arg(a[0], false)) throw EvalError("tojson(ensure_ascii=True) is not supported");
  JsonFormat format;
  if (a[1] && !a[1]->is_none()) {
    if (a[1]->is_string())
      format.indent = a[1]->text;
    else
      format.indent = spaces(int_arg(name, a[1], 0));
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

// ------------------------------------------------------------------ values and numbers

Value filter_default(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"default_value", "boolean"});
  bool use_default = value.is_undefined() || (bool_arg(a[1], false) && !truthy(value));
  return use_default ? (a[0] ? *a[0] : Value::from_string("")) : value;
}

// int(x) of a finite float; converting one outside the int64 range is undefined in C++.
std::int64_t truncate_to_int(double x) {
  double whole = std::trunc(x);
  if (whole < -9223372036854775808.0 || whole >= 9223372036854775808.0) fail_integer_overflow();
  return static_cast<std::int64_t>(whole);
}

Value filter_int(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"default", "base"});
  Value fallback = a[0] ? *a[0] : Value::from_int(0);
  std::int64_t base = int_arg(name, a[1], 10);
  if (value.is_string()) {
    if (auto parsed = parse_python_int(value.text, base)) return Value::from_int(*parsed);
    if (auto as_float = parse_python_float(value.text); as_float && std::isfinite(*as_float))
      return Value::from_int(truncate_to_int(*as_float));
    return fallback;
  }
  if (value.is_integral()) return Value::from_int(value.as_int());
  if (value.kind == Kind::Float && std::isfinite(value.number)) return Value::from_int(truncate_to_int(value.number));
  return fallback;
}

Value filter_float(const std::string& name, const Value& value, const CallArgs& args) {
  auto a = bind(name, args, 1, {"default"});
  Value fallback = a[0] ? *a[0] : Value::from_float(0.0);
  if (value.is_number()) return Value::from_float(value.as_float());
  if (value.is_string())
    if (auto parsed = parse_python_float(value.text)) return Value::from_float(*parsed);
  return fallback;
}

Value filter_abs(const std::string& name, const Value& value, const CallArgs& args) {
  bind(name, args, 1, {});
  if (value.kind == Kind::Float) return Value::from_float(std::fabs(value.number));
  if (value.is_integral()) {
    if (value.as_int() == INT64_MIN) fail_integer_overflow();
    return Value::from_int(std::llabs(value.as_int()));
  }
  throw EvalError("bad operand type for abs(): '" + python_type_name(value) + "'");
}

// ------------------------------------------------------------------ the table

// Every filter Jinja2 has. nullptr: Jinja2 has it and this interpreter does not, so a template
// using it gets "not supported" at parse time rather than "no filter named".
const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", filter_abs},
      {"attr", nullptr},
      {"batch", nullptr},
      {"capitalize", filter_case<pystr::capitalize>},
      {"center", nullptr},
      {"count", filter_length},
      {"d", filter_default},
      {"default", filter_default},
      {"dictsort", filter_dictsort},
      {"e", nullptr},
      {"escape", nullptr},
      {"filesizeformat", nullptr},
      {"first", filter_first},
      {"float", filter_float},
      {"forceescape", nullptr},
      {"format", nullptr},
      {"groupby", nullptr},
      {"indent", filter_indent},
      {"int", filter_int},
      {"items", filter_items},
      {"join", filter_join},
      {"last", filter_last},
      {"length", filter_length},
      {"list", filter_list},
      {"lower", filter_case<pystr::lower>},
      {"map", filter_map},
      {"max", filter_min_max<false>},
      {"min", filter_min_max<true>},
      {"pprint", nullptr},
      {"random", nullptr},
      {"reject", filter_select<false, false>},
      {"rejectattr", filter_select<true, false>},
      {"replace", filter_replace},
      {"reverse", filter_reverse},
      {"round", nullptr},
      {"safe", filter_safe},
      {"select", filter_select<false, true>},
      {"selectattr", filter_select<true, true>},
      {"slice", nullptr},
      {"sort", filter_sort},
      {"string", filter_string},
      {"striptags", nullptr},
      {"sum", filter_sum},
      {"title", filter_title},
      {"tojson", filter_tojson},
      {"trim", filter_trim},
      {"truncate", nullptr},
      {"unique", filter_unique},
      {"upper", filter_case<pystr::upper>},
      {"urlencode", nullptr},
      {"urlize", nullptr},
      {"wordcount", nullptr},
      {"wordwrap", nullptr},
      {"xmlattr", nullptr},
  };
  return table;
}

}  // namespace

Support filter_support(const std::string& name) {
  auto found = filters().find(name);
  if (found == filters().end()) return Support::Unknown;
  return found->second ? Support::Supported : Support::KnownUnsupported;
}

Value apply_filter(const std::string& name, const Value& value, const CallArgs& args) {
  auto found = filters().find(name);
  if (found == filters().end() || !found->second) throw EvalError("no filter named '" + name + "'");
  return found->second(name, value, args);
}

}  // namespace kvchat::jinja
