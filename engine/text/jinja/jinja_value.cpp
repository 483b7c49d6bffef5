#include "engine/text/jinja/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "engine/text/jinja/jinja_budget.h"
#include "engine/text/jinja/jinja_limits.h"
#include "engine/text/jinja/jinja_pystr.h"
#include "engine/text/utf8.h"

namespace kvchat::jinja {

Value Value::undefined(std::string reason) {
  Value v;
  v.kind = Kind::Undefined;
  v.text = std::move(reason);
  return v;
}

Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}

Value Value::from_bool(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.boolean = b;
  return v;
}

Value Value::from_int(std::int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.integer = i;
  return v;
}

Value Value::from_float(double f) {
  Value v;
  v.kind = Kind::Float;
  v.number = f;
  return v;
}

Value Value::from_string(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.text = std::move(s);
  return v;
}

Value Value::from_markup(std::string s) {
  Value v = from_string(std::move(s));
  v.markup = true;
  return v;
}

namespace {

// The nesting of a container holding items nested up to `deepest`; EvalError past the limit, before
// the container exists (so it is never printed, compared or freed by recursion that deep).
int container_nesting(int deepest) {
  if (deepest >= kMaxValueNesting)
    throw EvalError("lists and dicts nested more than " + std::to_string(kMaxValueNesting) + " levels deep");
  return deepest + 1;
}

}  // namespace

Value Value::from_list(ValueList items, Sequence sequence) {
  int deepest = 0;
  for (const Value& item : items) deepest = std::max(deepest, item.nesting);
  Value v;
  v.kind = Kind::List;
  v.sequence = sequence;
  v.nesting = container_nesting(deepest);
  v.list = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::from_dict(DictEntries entries) {
  int deepest = 0;
  for (const auto& [key, value] : entries) deepest = std::max({deepest, key.nesting, value.nesting});
  Value v;
  v.kind = Kind::Dict;
  v.nesting = container_nesting(deepest);
  v.dict = std::make_shared<const DictEntries>(std::move(entries));
  return v;
}

Value Value::from_callable(std::string name, std::function<Value(const CallArgs&)> call) {
  Value v;
  v.kind = Kind::Callable;
  v.callable = std::make_shared<const CallableData>(CallableData{std::move(name), std::move(call)});
  return v;
}

namespace {

// Checks the depth on the way down: from_list would refuse a too-deep result only after this
// recursion had already gone that deep.
Value from_json_at_depth(const nlohmann::ordered_json& json, int depth) {
  if (json.is_structured() && depth >= kMaxValueNesting)
    throw EvalError("JSON nested more than " + std::to_string(kMaxValueNesting) + " levels deep");
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::from_bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::from_int(json.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = json.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) throw EvalError("integer " + std::to_string(u) + " is too large");
      return Value::from_int(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::from_float(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::from_string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json_at_depth(item, depth + 1));
      return Value::from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictEntries entries;
      entries.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it)
        entries.emplace_back(Value::from_string(it.key()), from_json_at_depth(it.value(), depth + 1));
      return Value::from_dict(std::move(entries));
    }
    default: throw EvalError("unsupported JSON value (binary or discarded)");
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& json) { return from_json_at_depth(json, 0); }

std::string type_description(const Value& value) {
  switch (value.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "None";
    case Kind::Bool: return "bool object";
    case Kind::Int: return "int object";
    case Kind::Float: return "float object";
    case Kind::String: return value.markup ? "Markup object" : "str object";
    case Kind::List:
      switch (value.sequence) {
        case Sequence::List: return "list object";
        case Sequence::Tuple: return "tuple object";
        case Sequence::Generator: return "generator object";
        case Sequence::View: return "view object";
      }
      return "list object";
    case Kind::Dict: return "dict object";
    case Kind::Namespace: return "Namespace object";
    case Kind::Loop: return "LoopContext object";
    case Kind::Callable: return "function " + value.callable->name;
  }
  return "object";
}

void fail_undefined(const Value& value) { throw EvalError(value.text); }

void fail_integer_overflow() {
  throw EvalError("integer overflow (Python integers are unbounded; this interpreter uses 64 bits)");
}

bool truthy(const Value& value) {
  switch (value.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return value.boolean;
    case Kind::Int: return value.integer != 0;
    case Kind::Float: return value.number != 0.0;
    case Kind::String: return !value.text.empty();
    case Kind::List: return value.sequence == Sequence::Generator || !value.list->empty();
    case Kind::Dict: return !value.dict->empty();
    default: return true;
  }
}

const Value* dict_find(const DictEntries& entries, const Value& key) {
  for (const auto& entry : entries)
    if (equals(entry.first, key)) return &entry.second;
  return nullptr;
}

ValueList dict_items_as_tuples(const DictEntries& entries) {
  ValueList items;
  items.reserve(entries.size());
  for (const auto& [key, value] : entries) items.push_back(Value::from_list({key, value}, Sequence::Tuple));
  return items;
}

bool is_plain_sequence(const Value& v) {
  return v.kind == Kind::List && (v.sequence == Sequence::List || v.sequence == Sequence::Tuple);
}

bool equals(const Value& a, const Value& b) {
  charge_steps(1);  // `in`, unique, sort, dict keys: comparisons are where quadratic filters spend their time
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::None: return true;
    case Kind::String: return a.text == b.text;
    case Kind::List: {
      if (a.sequence != b.sequence) return false;
      if (a.sequence == Sequence::Generator || a.sequence == Sequence::View) return a.list == b.list;
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t i = 0; i < a.list->size(); ++i)
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& entry : *a.dict) {
        const Value* other = dict_find(*b.dict, entry.first);
        if (!other || !equals(entry.second, *other)) return false;
      }
      return true;
    }
    case Kind::Namespace: return a.ns == b.ns;
    case Kind::Loop: return a.loop == b.loop;
    case Kind::Callable: return a.callable == b.callable;
    default: return false;
  }
}

std::string python_type_name(const Value& v) {
  switch (v.kind) {
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return v.markup ? "Markup" : "str";
    case Kind::List:
      switch (v.sequence) {
        case Sequence::List: return "list";
        case Sequence::Tuple: return "tuple";
        case Sequence::Generator: return "generator";
        case Sequence::View: return "view";
      }
      return "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Loop: return "LoopContext";
    case Kind::Callable: return "function";
    case Kind::Undefined: return "Undefined";
  }
  return "object";
}

bool less_than(const Value& a, const Value& b) {
  charge_steps(1);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int();
    return a.as_float() < b.as_float();
  }
  if (a.is_string() && b.is_string()) return a.text < b.text;  // UTF-8 byte order = code point order
  if (a.kind == Kind::List && b.kind == Kind::List && a.sequence == b.sequence &&
      (a.sequence == Sequence::List || a.sequence == Sequence::Tuple)) {
    const auto& x = *a.list;
    const auto& y = *b.list;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw EvalError("'<' not supported between instances of '" + python_type_name(a) + "' and '" + python_type_name(b) +
                  "'");
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);
  // sci looks like "-1.2345e+16": split into sign, digits and the decimal exponent.
  bool negative = sci[0] == '-';
  std::size_t e = sci.find('e');
  std::string mantissa = sci.substr(negative ? 1 : 0, e - (negative ? 1 : 0));
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    // Python's repr switches to exponent notation below 1e-4 and from 1e16 on.
    if (exponent >= 0) {
      if (static_cast<int>(digits.size()) <= exponent + 1) {
        out += digits + std::string(static_cast<std::size_t>(exponent + 1) - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, static_cast<std::size_t>(exponent + 1)) + "." +
               digits.substr(static_cast<std::size_t>(exponent + 1));
      }
    } else {
      out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_text;
}

namespace {

std::string string_repr(const std::string& text) {
  bool has_single = text.find('\'') != std::string::npos;
  bool has_double = text.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : pystr::decode(text)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (pystr::is_printable(c)) {
      utf8::append_code_point(out, c);
    } else {
      char buffer[16];
      if (c <= 0xFF)
        std::snprintf(buffer, sizeof(buffer), "\\x%02x", static_cast<unsigned>(c));
      else if (c <= 0xFFFF)
        std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(buffer, sizeof(buffer), "\\U%08x", static_cast<unsigned>(c));
      out += buffer;
    }
  }
  out += quote;
  return out;
}

[[noreturn]] void fail_unprintable(const Value& value) {
  throw EvalError("cannot print a " + type_description(value) +
                  ": its Python text form is not reproduced (convert it with |list or |join first)");
}

}  // namespace

std::string to_repr(const Value& value) {
  switch (value.kind) {
    case Kind::String: return value.markup ? "Markup(" + string_repr(value.text) + ")" : string_repr(value.text);
    case Kind::List: {
      if (value.sequence == Sequence::Generator || value.sequence == Sequence::View) fail_unprintable(value);
      bool tuple = value.sequence == Sequence::Tuple;
      std::string out = tuple ? "(" : "[";
      for (std::size_t i = 0; i < value.list->size(); ++i) {
        if (i) out += ", ";
        out += to_repr((*value.list)[i]);
        check_size(out.size(), "string");  // a list holding the same big list many times prints huge
      }
      if (tuple && value.list->size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return out;
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& entry : *value.dict) {
        if (!first) out += ", ";
        first = false;
        out += to_repr(entry.first) + ": " + to_repr(entry.second);
        check_size(out.size(), "string");
      }
      return out + "}";
    }
    case Kind::Undefined: return "Undefined";
    default: return to_str(value);
  }
}

std::string to_str(const Value& value) {
  switch (value.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return value.boolean ? "True" : "False";
    case Kind::Int: return std::to_string(value.integer);
    case Kind::Float: return float_repr(value.number);
    case Kind::String: return value.text;
    case Kind::List:
    case Kind::Dict: return to_repr(value);
    default: fail_unprintable(value);
  }
}

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value escape_to_markup(const Value& value) {
  if (value.is_string() && value.markup) return value;
  return Value::from_markup(html_escape(to_str(value)));
}

Value string_like(const Value& like, std::string text) {
  return like.markup ? Value::from_markup(std::move(text)) : Value::from_string(std::move(text));
}

ValueList iterate(const Value& value) {
  // One step per item, charged before the items are made (a 16 MiB string is 16M one-character strings).
  switch (value.kind) {
    case Kind::Undefined: return {};
    case Kind::List: charge_steps(static_cast<std::int64_t>(value.list->size())); return *value.list;
    case Kind::Dict: {
      charge_steps(static_cast<std::int64_t>(value.dict->size()));
      ValueList keys;
      keys.reserve(value.dict->size());
      for (const auto& entry : *value.dict) keys.push_back(entry.first);
      return keys;
    }
    case Kind::String: {
      charge_steps(static_cast<std::int64_t>(pystr::code_point_count(value.text)));
      ValueList chars;
      for (char32_t c : pystr::decode(value.text)) {
        std::string one;
        utf8::append_code_point(one, c);
        chars.push_back(Value::from_string(std::move(one)));
      }
      return chars;
    }
    default: throw EvalError("'" + python_type_name(value) + "' object is not iterable");
  }
}

std::int64_t length_of(const Value& value) {
  switch (value.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<std::int64_t>(pystr::code_point_count(value.text));
    case Kind::List:
      if (value.sequence == Sequence::Generator) throw EvalError("object of type 'generator' has no len()");
      return static_cast<std::int64_t>(value.list->size());
    case Kind::Dict: return static_cast<std::int64_t>(value.dict->size());
    default: throw EvalError("object of type '" + python_type_name(value) + "' has no len()");
  }
}

namespace {

void json_string(std::string& out, const std::string& text) {
  out += '"';
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string json_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return float_repr(value);
}

std::string json_key(const Value& key) {
  switch (key.kind) {
    case Kind::String: return key.text;
    case Kind::Int: return std::to_string(key.integer);
    case Kind::Float: return json_float(key.number);
    case Kind::Bool: return key.boolean ? "true" : "false";
    case Kind::None: return "null";
    default: throw EvalError("keys must be str, int, float, bool or None, not " + python_type_name(key));
  }
}

void json_value(std::string& out, const Value& value, const JsonFormat& format, int level) {
  auto newline_indent = [&](int depth) {
    check_size(saturating_add(out.size(), saturating_multiply(static_cast<std::size_t>(depth), format.indent->size())),
               "string");
    std::string s = "\n";
    for (int i = 0; i < depth; ++i) s += *format.indent;
    return s;
  };
  switch (value.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += value.boolean ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(value.integer); return;
    case Kind::Float: out += json_float(value.number); return;
    case Kind::String: json_string(out, value.text); return;
    case Kind::List: {
      if (value.sequence == Sequence::Generator || value.sequence == Sequence::View) break;
      if (value.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      std::string separator = format.item_separator;
      if (format.indent) {
        out += newline_indent(level + 1);
        separator += newline_indent(level + 1);
      }
      for (std::size_t i = 0; i < value.list->size(); ++i) {
        if (i) out += separator;
        json_value(out, (*value.list)[i], format, level + 1);
        check_size(out.size(), "string");  // the same big list many times, or deep indentation
      }
      if (format.indent) out += newline_indent(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (value.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& entry : *value.dict) entries.push_back(&entry);
      if (format.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return less_than(a->first, b->first); });
      out += '{';
      std::string separator = format.item_separator;
      if (format.indent) {
        out += newline_indent(level + 1);
        separator += newline_indent(level + 1);
      }
      bool first = true;
      for (const auto* entry : entries) {
        if (!first) out += separator;
        first = false;
        json_string(out, json_key(entry->first));
        out += format.key_separator;
        json_value(out, entry->second, format, level + 1);
        check_size(out.size(), "string");
      }
      if (format.indent) out += newline_indent(level);
      out += '}';
      return;
    }
    default: break;
  }
  throw EvalError("Object of type " + python_type_name(value) + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& value, const JsonFormat& format) {
  std::string out;
  json_value(out, value, format, 0);
  return out;
}

}  // namespace kvchat::jinja
