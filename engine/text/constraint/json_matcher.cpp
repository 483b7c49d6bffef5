#include "engine/text/constraint/json_matcher.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace kvchat {
namespace {

using Node = JsonGrammarNode;

constexpr int kMaxBranchDepth = 32;    // anyOf inside anyOf (through $ref) before a value starts
constexpr int kMaxIntegerDigits = 15;  // digits before the point (and, for a bounded number, in all)
constexpr int kMaxFractionDigits = 15;
constexpr int kMaxExponentDigits = 3;

const std::string kTrue = "true", kFalse = "false", kNull = "null";

bool is_whitespace(std::uint8_t byte) { return byte == ' ' || byte == '\n' || byte == '\t' || byte == '\r'; }
bool is_digit(std::uint8_t byte) { return byte >= '0' && byte <= '9'; }
bool is_hex(std::uint8_t byte) {
  return is_digit(byte) || (byte >= 'a' && byte <= 'f') || (byte >= 'A' && byte <= 'F');
}

enum class StringByte { Content, Close, Refused };

// One byte of a JSON string's body (after its opening quote): escapes, UTF-8 well-formedness (no overlong
// forms, no surrogates, nothing past U+10FFFF), no control characters. `code_points` counts characters
// (an escape is one) and stays within `max_code_points`; null for a key, whose length is free.
template <typename Frame>
StringByte scan_string_byte(Frame& frame, std::uint8_t byte, std::int64_t* code_points, std::int64_t max_code_points) {
  if (frame.utf8_pending > 0) {
    if (byte < frame.utf8_low || byte > frame.utf8_high) return StringByte::Refused;
    --frame.utf8_pending;
    frame.utf8_low = 0x80;
    frame.utf8_high = 0xBF;
    return StringByte::Content;
  }
  if (frame.escape == 1) {
    if (byte == 'u') {
      frame.escape = 2;
      return StringByte::Content;
    }
    if (byte != '"' && byte != '\\' && byte != '/' && byte != 'b' && byte != 'f' && byte != 'n' && byte != 'r' &&
        byte != 't')
      return StringByte::Refused;
    frame.escape = 0;
    return StringByte::Content;
  }
  if (frame.escape >= 2) {
    // \uXXXX: 2-5 are the four digits; 6 is the second digit after a leading 'd', which must keep the code
    // unit out of the surrogates (a lone surrogate is text no strict JSON parser takes).
    if (!is_hex(byte)) return StringByte::Refused;
    if (frame.escape == 6) {
      if (!(byte >= '0' && byte <= '7')) return StringByte::Refused;
      frame.escape = 4;
      return StringByte::Content;
    }
    if (frame.escape == 2 && (byte == 'd' || byte == 'D')) {
      frame.escape = 6;
      return StringByte::Content;
    }
    frame.escape = frame.escape == 5 ? 0 : static_cast<std::uint8_t>(frame.escape + 1);
    return StringByte::Content;
  }
  if (byte == '"') return StringByte::Close;
  if (byte < 0x20) return StringByte::Refused;
  // A new character starts here.
  std::uint8_t pending = 0, low = 0x80, high = 0xBF;
  if (byte >= 0x80) {
    if (byte >= 0xC2 && byte <= 0xDF) {
      pending = 1;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      pending = 2;
      if (byte == 0xE0) low = 0xA0;
      if (byte == 0xED) high = 0x9F;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      pending = 3;
      if (byte == 0xF0) low = 0x90;
      if (byte == 0xF4) high = 0x8F;
    } else {
      return StringByte::Refused;
    }
  }
  if (code_points) {
    if (*code_points >= max_code_points) return StringByte::Refused;
    ++*code_points;
  }
  if (byte == '\\') frame.escape = 1;
  frame.utf8_pending = pending;
  frame.utf8_low = low;
  frame.utf8_high = high;
  return StringByte::Content;
}

// Whether some value of [low, high] meets the node's bounds (the ends are values the digits can reach).
bool interval_meets_bounds(const Node& node, double low, double high) {
  if (node.has_minimum && (node.exclusive_minimum ? high <= node.minimum : high < node.minimum)) return false;
  if (node.has_maximum && (node.exclusive_maximum ? low >= node.maximum : low > node.maximum)) return false;
  return true;
}

double power_of_ten(int exponent) {
  static const double powers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                  1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  return powers[exponent];
}

}  // namespace

bool JsonMatcher::Frame::operator==(const Frame& other) const {
  return kind == other.kind && stage == other.stage && escape == other.escape && utf8_pending == other.utf8_pending &&
         utf8_low == other.utf8_low && utf8_high == other.utf8_high && allow_whitespace == other.allow_whitespace &&
         negative == other.negative && integer_digits == other.integer_digits &&
         fraction_digits == other.fraction_digits && exponent_digits == other.exponent_digits && node == other.node &&
         child == other.child && count == other.count && keys == other.keys && text == other.text &&
         magnitude == other.magnitude && scale == other.scale;
}

JsonMatcher::JsonMatcher(const JsonGrammar& grammar) : grammar_(&grammar) {
  // One thread per branch of the grammar; its Root frame's node is the branch's index.
  for (int branch = 0; branch < grammar.branch_count(); ++branch) {
    Thread thread;
    Frame root;
    root.kind = Frame::Kind::Root;
    root.node = branch;
    thread.frames.push_back(root);
    if (grammar.branch(branch).prefix.empty()) {
      thread.frames.back().stage = 1;
      Frame value;
      value.node = grammar.branch(branch).root;
      thread.frames.push_back(value);
    }
    threads_.push_back(std::move(thread));
  }
}

bool JsonMatcher::advance(std::string_view bytes) {
  for (char byte : bytes)
    if (!advance(static_cast<std::uint8_t>(byte))) return false;
  return true;
}

bool JsonMatcher::advance(std::uint8_t byte) {
  next_.clear();
  for (Thread& thread : threads_) step(thread, byte, next_, 0);
  // Branches that met again (two enum values with a common start are still two; an anyOf of two equal
  // schemas is one) are kept once, so the threads stay few.
  threads_.clear();
  for (Thread& thread : next_) {
    if (std::find(threads_.begin(), threads_.end(), thread) != threads_.end()) continue;
    if (static_cast<int>(threads_.size()) == kMaxThreads) break;
    threads_.push_back(std::move(thread));
  }
  return !threads_.empty();
}

bool JsonMatcher::complete() const {
  return std::any_of(threads_.begin(), threads_.end(), [&](const Thread& thread) { return thread_can_end(thread); });
}

std::optional<std::int64_t> JsonMatcher::string_room() const {
  if (threads_.empty()) return std::nullopt;
  std::int64_t room = 0;
  for (const Thread& thread : threads_) {
    if (thread.frames.empty()) return std::nullopt;  // a whole reply: nothing more
    const Frame& top = thread.frames.back();
    if (top.escape != 0 || top.utf8_pending != 0) return std::nullopt;
    if (top.kind == Frame::Kind::String) {
      const std::int64_t max_length = top.node >= 0 ? grammar_->nodes[static_cast<std::size_t>(top.node)].max_length
                                                    : std::numeric_limits<std::int64_t>::max();
      room = std::max(room, max_length - top.count);
    } else if (top.kind == Frame::Kind::Key) {
      // A key whose object takes keys it does not list: any text; a listed key only: not free.
      const Frame& object = thread.frames[thread.frames.size() - 2];
      const Node& node = grammar_->nodes[static_cast<std::size_t>(object.node)];
      if (node.additional < 0 || required_left(object)) return std::nullopt;
      room = std::numeric_limits<std::int64_t>::max();
    } else {
      return std::nullopt;
    }
  }
  return room;
}

void JsonMatcher::step(Thread& thread, std::uint8_t byte, std::vector<Thread>& out, int depth) const {
  if (!is_whitespace(byte)) {
    thread.whitespace_run = 0;
    thread.newline_in_run = false;
  }
  const auto whitespace = [&] {
    if (byte == '\n' || byte == '\r') {
      if (thread.newline_in_run) return;
      thread.newline_in_run = true;
    }
    if (++thread.whitespace_run <= kMaxWhitespaceRun) out.push_back(std::move(thread));
  };
  while (!thread.frames.empty()) {
    Frame& top = thread.frames.back();
    switch (top.kind) {
      case Frame::Kind::Root: {
        const JsonGrammar::BranchView branch = grammar_->branch(top.node);
        const std::string& text = top.stage == 0 ? branch.prefix : branch.suffix;
        if (static_cast<std::size_t>(top.count) >= text.size() ||
            static_cast<std::uint8_t>(text[static_cast<std::size_t>(top.count)]) != byte)
          return;
        if (static_cast<std::size_t>(++top.count) == text.size()) {
          if (top.stage == 0) {
            top.stage = 1;
            Frame value;
            value.node = branch.root;
            thread.frames.push_back(value);
          } else {
            thread.frames.pop_back();
          }
        }
        out.push_back(std::move(thread));
        return;
      }
      case Frame::Kind::Value:
        if (is_whitespace(byte)) {
          if (top.allow_whitespace) whitespace();
          return;
        }
        switch (step_value(thread, byte, out, depth)) {
          case 1: out.push_back(std::move(thread)); return;
          case 0: return;
          default: continue;  // the frame became a number: it takes the byte
        }
      case Frame::Kind::Object:
        if (is_whitespace(byte)) {
          whitespace();
          return;
        }
        if (step_object(thread, byte)) out.push_back(std::move(thread));
        return;
      case Frame::Kind::Array: {
        if (is_whitespace(byte)) {
          whitespace();
          return;
        }
        const Node& node = grammar_->nodes[static_cast<std::size_t>(top.node)];
        if (byte == ']') {
          if (top.count < node.min_items) return;
          finish_top(thread);
          out.push_back(std::move(thread));
          return;
        }
        if ((top.stage == 0 && byte != ',') || (top.stage == 2 && byte == ',')) {
          if (top.count >= node.max_items) return;
          top.stage = 1;
          Frame value;
          value.node = node.items;
          value.allow_whitespace = true;
          thread.frames.push_back(value);
          if (byte == ',') {
            out.push_back(std::move(thread));
            return;
          }
          continue;  // the first item starts with this byte
        }
        return;
      }
      case Frame::Kind::Key:
        if (step_key(thread, byte)) out.push_back(std::move(thread));
        return;
      case Frame::Kind::String: {
        const std::int64_t max_length = top.node >= 0 ? grammar_->nodes[static_cast<std::size_t>(top.node)].max_length
                                                      : std::numeric_limits<std::int64_t>::max();
        switch (scan_string_byte(top, byte, &top.count, max_length)) {
          case StringByte::Refused: return;
          case StringByte::Close:
            if (top.node >= 0 && top.count < grammar_->nodes[static_cast<std::size_t>(top.node)].min_length) return;
            finish_top(thread);
            break;
          case StringByte::Content: thread.whitespace_run = 0; break;
        }
        out.push_back(std::move(thread));
        return;
      }
      case Frame::Kind::Number: {
        const int taken = step_number(top, byte);
        if (taken == 0) return;
        if (taken == 1) {
          out.push_back(std::move(thread));
          return;
        }
        finish_top(thread);  // the number ended before this byte: its parent takes it
        if (is_whitespace(byte)) {
          // A number's end is seen only at the byte after it, here whitespace: the parent's rules for it.
          if (thread.frames.empty() || thread.frames.back().kind == Frame::Kind::Root) return;
          whitespace();
          return;
        }
        continue;
      }
      case Frame::Kind::Literal: {
        if (static_cast<std::uint8_t>((*top.text)[static_cast<std::size_t>(top.count)]) != byte) return;
        if (static_cast<std::size_t>(++top.count) == top.text->size()) finish_top(thread);
        out.push_back(std::move(thread));
        return;
      }
    }
  }
}

int JsonMatcher::step_value(Thread& thread, std::uint8_t byte, std::vector<Thread>& out, int depth) const {
  Frame& frame = thread.frames.back();
  const Node& node = grammar_->nodes[static_cast<std::size_t>(frame.node)];
  const auto become = [&](Frame::Kind kind, int node_index) {
    frame.kind = kind;
    frame.node = node_index;
    frame.stage = 0;
    frame.count = 0;
  };
  const auto branch_literals = [&](const std::vector<const std::string*>& texts) {
    for (const std::string* text : texts) {
      Thread copy = thread;
      Frame& literal = copy.frames.back();
      literal.kind = Frame::Kind::Literal;
      literal.text = text;
      literal.count = 0;
      step(copy, byte, out, depth + 1);
    }
  };
  switch (node.kind) {
    case Node::Kind::Any:
      if (byte == '{') {
        become(Frame::Kind::Object, grammar_->any_object);
        return 1;
      }
      if (byte == '[') {
        become(Frame::Kind::Array, grammar_->any_array);
        return 1;
      }
      if (byte == '"') {
        become(Frame::Kind::String, -1);
        return 1;
      }
      if (byte == '-' || is_digit(byte)) {
        become(Frame::Kind::Number, -1);
        return -1;
      }
      if (byte == 't') branch_literals({&kTrue});
      if (byte == 'f') branch_literals({&kFalse});
      if (byte == 'n') branch_literals({&kNull});
      return 0;
    case Node::Kind::Object:
    case Node::Kind::Array:
    case Node::Kind::String:
      if (byte != (node.kind == Node::Kind::Object ? '{' : node.kind == Node::Kind::Array ? '[' : '"')) return 0;
      become(node.kind == Node::Kind::Object  ? Frame::Kind::Object
             : node.kind == Node::Kind::Array ? Frame::Kind::Array
                                              : Frame::Kind::String,
             frame.node);
      return 1;
    case Node::Kind::Number:
    case Node::Kind::Integer:
      if (byte != '-' && !is_digit(byte)) return 0;
      become(Frame::Kind::Number, frame.node);
      return -1;
    case Node::Kind::Boolean: branch_literals({&kTrue, &kFalse}); return 0;
    case Node::Kind::Null: branch_literals({&kNull}); return 0;
    case Node::Kind::Literals: {
      std::vector<const std::string*> texts;
      for (const std::string& literal : node.literals) texts.push_back(&literal);
      branch_literals(texts);
      return 0;
    }
    case Node::Kind::AnyOf:
      if (depth >= kMaxBranchDepth) return 0;
      for (int alternative : node.alternatives) {
        Thread copy = thread;
        copy.frames.back().node = alternative;
        step(copy, byte, out, depth + 1);
      }
      return 0;
  }
  return 0;
}

std::uint64_t JsonMatcher::keys_in_turn(const Frame& object) const {
  const Node& node = grammar_->nodes[static_cast<std::size_t>(object.node)];
  std::uint64_t keys = 0;
  for (std::size_t i = static_cast<std::size_t>(object.count); i < node.properties.size(); ++i) {
    keys |= std::uint64_t{1} << i;
    if (node.properties[i].required) break;
  }
  return keys;
}

bool JsonMatcher::required_left(const Frame& object) const {
  const Node& node = grammar_->nodes[static_cast<std::size_t>(object.node)];
  for (std::size_t i = static_cast<std::size_t>(object.count); i < node.properties.size(); ++i)
    if (node.properties[i].required) return true;
  return false;
}

bool JsonMatcher::properties_left(const Frame& object) const {
  const Node& node = grammar_->nodes[static_cast<std::size_t>(object.node)];
  return static_cast<std::size_t>(object.count) < node.properties.size() || node.additional >= 0;
}

// Object stages: 0 after '{', 1 after a key, 2 after a value, 3 after ','.
bool JsonMatcher::step_object(Thread& thread, std::uint8_t byte) const {
  Frame& object = thread.frames.back();
  if (byte == '}' && (object.stage == 0 || object.stage == 2)) {
    if (required_left(object)) return false;
    finish_top(thread);
    return true;
  }
  if (byte == '"' && (object.stage == 0 || object.stage == 3)) {
    if (!properties_left(object)) return false;
    const Node& node = grammar_->nodes[static_cast<std::size_t>(object.node)];
    // Every listed key is followed (one out of its turn is refused at the closing quote, while an unlisted key that
    // starts like it goes on).
    Frame key;
    key.kind = Frame::Kind::Key;
    key.keys = node.properties.size() >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << node.properties.size()) - 1;
    thread.frames.push_back(key);
    return true;
  }
  if (byte == ':' && object.stage == 1) {
    Frame value;
    value.node = object.child;
    value.allow_whitespace = true;
    object.stage = 2;  // where finish_top leaves it too
    thread.frames.push_back(value);
    return true;
  }
  if (byte == ',' && object.stage == 2) {
    if (!properties_left(object)) return false;
    object.stage = 3;
    return true;
  }
  return false;
}

bool JsonMatcher::step_key(Thread& thread, std::uint8_t byte) const {
  Frame& key = thread.frames.back();
  Frame& object = thread.frames[thread.frames.size() - 2];
  const Node& node = grammar_->nodes[static_cast<std::size_t>(object.node)];
  const bool free = node.additional >= 0 && !required_left(object);
  const StringByte kind = scan_string_byte(key, byte, nullptr, 0);
  if (kind == StringByte::Refused) return false;
  const auto offset = static_cast<std::size_t>(key.count);
  if (kind == StringByte::Content) {
    for (std::size_t i = 0; i < node.properties.size(); ++i) {
      const std::string& name = node.properties[i].key;
      if ((key.keys >> i & 1) && (name.size() <= offset || static_cast<std::uint8_t>(name[offset]) != byte))
        key.keys &= ~(std::uint64_t{1} << i);
    }
    ++key.count;
    thread.whitespace_run = 0;
    return free || (key.keys & keys_in_turn(object)) != 0;
  }
  // The closing quote: a listed key whose turn it is, else (when the object takes them) a key it does not list.
  // The turn of a listed key: it is the next one, or every one before it is optional.
  int chosen = -1;
  for (std::size_t i = static_cast<std::size_t>(object.count); i < node.properties.size(); ++i) {
    if ((key.keys >> i & 1) && node.properties[i].key.size() == offset) {
      chosen = static_cast<int>(i);
      break;
    }
    if (node.properties[i].required) break;
  }
  if (chosen < 0) {
    // A listed key out of its turn (again, or after a later one) is refused; an unlisted one needs `free`.
    for (std::size_t i = 0; i < node.properties.size(); ++i)
      if (node.properties[i].key.size() == offset && (key.keys >> i & 1)) return false;
    if (!free) return false;
    object.child = node.additional;
  } else {
    object.child = node.properties[static_cast<std::size_t>(chosen)].node;
    object.count = chosen + 1;
  }
  thread.frames.pop_back();
  thread.frames.back().stage = 1;
  return true;
}

int JsonMatcher::step_number(Frame& frame, std::uint8_t byte) const {
  const Node* node = frame.node >= 0 ? &grammar_->nodes[static_cast<std::size_t>(frame.node)] : nullptr;
  const bool integer = node && node->kind == Node::Kind::Integer;
  const bool bounded = node && (node->has_minimum || node->has_maximum);
  const int digit = is_digit(byte) ? byte - '0' : -1;
  const auto take = [&](std::uint8_t stage) {
    frame.stage = stage;
    return !bounded || number_feasible(frame) ? 1 : 0;
  };
  const auto end = [&] { return number_can_end(frame) ? -1 : 0; };
  // Stages: 0 start, 1 after '-', 2 a leading zero, 3 integer digits, 4 after '.', 5 fraction digits,
  // 6 after 'e', 7 after the exponent's sign, 8 exponent digits.
  switch (frame.stage) {
    case 0:
      if (byte == '-') {
        frame.negative = true;
        return take(1);
      }
      [[fallthrough]];
    case 1:
      if (digit < 0) return 0;
      frame.magnitude = digit;
      frame.integer_digits = 1;
      return take(digit == 0 ? 2 : 3);
    case 2:
    case 3:
      if (frame.stage == 3 && digit >= 0) {
        if (frame.integer_digits >= kMaxIntegerDigits) return 0;
        frame.magnitude = frame.magnitude * 10 + digit;
        ++frame.integer_digits;
        return take(3);
      }
      if (byte == '.' && !integer) return take(4);
      if ((byte == 'e' || byte == 'E') && !integer && !bounded) return take(6);
      return end();
    case 4:
    case 5:
      if (digit >= 0) {
        const int limit = bounded ? kMaxIntegerDigits - frame.integer_digits : kMaxFractionDigits;
        if (frame.fraction_digits >= limit) return 0;
        frame.magnitude = frame.magnitude * 10 + digit;
        ++frame.fraction_digits;
        return take(5);
      }
      if (frame.stage == 4) return 0;
      if ((byte == 'e' || byte == 'E') && !bounded) return take(6);
      return end();
    case 6:
      if (byte == '+' || byte == '-') return take(7);
      [[fallthrough]];
    case 7:
      if (digit < 0) return 0;
      frame.exponent_digits = 1;
      return take(8);
    case 8:
      if (digit >= 0) {
        if (frame.exponent_digits >= kMaxExponentDigits) return 0;
        ++frame.exponent_digits;
        return 1;
      }
      return end();
    default: return 0;
  }
}

// Whether the digits so far can still end in a number within the node's bounds. A bounded number has at most
// kMaxIntegerDigits digits in all; `magnitude` holds them as an integer (exactly), the value is magnitude /
// 10^fraction_digits. The values reachable from here form an interval whose ends are computed from the digits
// still allowed, so that every prefix taken can still end inside the bounds.
bool JsonMatcher::number_feasible(const Frame& frame) const {
  const Node& node = grammar_->nodes[static_cast<std::size_t>(frame.node)];
  const bool integer = node.kind == Node::Kind::Integer;
  const auto meets = [&](double low, double high) {  // magnitudes [low, high]
    return frame.negative ? interval_meets_bounds(node, -high, -low) : interval_meets_bounds(node, low, high);
  };
  // The largest fraction below one that `digits` more fraction digits can write.
  const auto below_one = [&](int digits) { return integer || digits <= 0 ? 0.0 : 1.0 - 1.0 / power_of_ten(digits); };
  const int total = kMaxIntegerDigits;
  switch (frame.stage) {
    case 1: return meets(0.0, power_of_ten(total) - 1.0);
    case 2: return meets(0.0, below_one(total - 1));
    case 3: {
      // `more` integer digits multiply it by ten each; a fraction adds less than one.
      const int digits = frame.integer_digits;
      for (int more = 0; digits + more <= total; ++more) {
        const double low = frame.magnitude * power_of_ten(more);
        const double high = (frame.magnitude + 1) * power_of_ten(more) - 1.0 + below_one(total - digits - more);
        if (meets(low, high)) return true;
      }
      return false;
    }
    case 4:
      if (frame.integer_digits >= total) return false;
      return meets(frame.magnitude, frame.magnitude + below_one(total - frame.integer_digits));
    case 5: {
      // r more fraction digits at most: from m / 10^f up to (m * 10^r + 10^r - 1) / 10^(f + r).
      const int remaining = total - frame.integer_digits - frame.fraction_digits;
      const double low = frame.magnitude / power_of_ten(frame.fraction_digits);
      const double high = (frame.magnitude * power_of_ten(remaining) + power_of_ten(remaining) - 1.0) /
                          power_of_ten(frame.fraction_digits + remaining);
      return meets(low, high);
    }
    default: return true;
  }
}

bool JsonMatcher::number_can_end(const Frame& frame) const {
  if (frame.stage != 2 && frame.stage != 3 && frame.stage != 5 && frame.stage != 8) return false;
  if (frame.node < 0) return true;
  const Node& node = grammar_->nodes[static_cast<std::size_t>(frame.node)];
  if (!node.has_minimum && !node.has_maximum) return true;
  // Division of two exact doubles rounds once: the value a JSON parser reads from these digits.
  const double magnitude = frame.magnitude / power_of_ten(frame.fraction_digits);
  const double value = frame.negative ? -magnitude : magnitude;
  if (node.has_minimum && (value < node.minimum || (node.exclusive_minimum && value == node.minimum))) return false;
  if (node.has_maximum && (value > node.maximum || (node.exclusive_maximum && value == node.maximum))) return false;
  return true;
}

void JsonMatcher::finish_top(Thread& thread) const {
  thread.frames.pop_back();
  if (thread.frames.empty()) return;
  Frame& parent = thread.frames.back();
  switch (parent.kind) {
    case Frame::Kind::Root:
      parent.stage = 2;
      parent.count = 0;
      if (grammar_->branch(parent.node).suffix.empty()) thread.frames.pop_back();
      break;
    case Frame::Kind::Object: parent.stage = 2; break;
    case Frame::Kind::Array:
      parent.stage = 2;
      ++parent.count;
      break;
    default: break;
  }
}

bool JsonMatcher::thread_can_end(Thread thread) const {
  while (!thread.frames.empty()) {
    const Frame& top = thread.frames.back();
    if (top.kind != Frame::Kind::Number || !number_can_end(top)) return false;
    finish_top(thread);
  }
  return true;
}

}  // namespace kvchat
