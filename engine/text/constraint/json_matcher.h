#pragma once
// Follows a reply byte by byte against a JsonGrammar: which bytes may come next, and whether the text so
// far is a whole reply. A pushdown automaton: each path through the grammar (a "thread", one per live
// alternative of an anyOf or enum) is a stack of frames, one per value being written; most of the time
// there is one thread.
//
// Whitespace between tokens of the JSON (not inside strings) is allowed in runs of at most
// kMaxWhitespaceRun bytes with one line break (room to indent pretty-printed JSON), so that a model cannot pad a
// constrained reply forever; numbers have at most 15 digits before and after the point and 3 in the exponent,
// for the same reason.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "engine/text/constraint/json_grammar.h"

namespace kvchat {

class JsonMatcher {
 public:
  static constexpr int kMaxWhitespaceRun = 10;
  static constexpr int kMaxThreads = 256;

  // `grammar` must outlive the matcher and its copies. A grammar of several branches starts with a thread each.
  explicit JsonMatcher(const JsonGrammar& grammar);
  // Copies keep the state only (not the scratch of advance()), reusing the destination's memory: the
  // token mask copies one state per byte it tries.
  JsonMatcher(const JsonMatcher& other) : grammar_(other.grammar_), threads_(other.threads_) {}
  JsonMatcher& operator=(const JsonMatcher& other) {
    grammar_ = other.grammar_;
    threads_ = other.threads_;
    return *this;
  }

  // Takes one more byte. False when the grammar does not allow it: the matcher is then dead().
  bool advance(std::uint8_t byte);
  bool advance(std::string_view bytes);

  bool dead() const { return threads_.empty(); }
  // The text so far is a whole reply (it may still go on, as a number may).
  bool complete() const;
  // When every path is inside a string's characters with nothing pending (no escape, no partial UTF-8
  // character): how many more code points the string may take. Any byte sequence of whole characters with no
  // quote, backslash or control character, that long or shorter, is then accepted. None otherwise.
  std::optional<std::int64_t> string_room() const;

 private:
  struct Frame {
    enum class Kind : std::uint8_t { Root, Value, Object, Array, String, Key, Number, Literal };
    Kind kind = Kind::Value;
    std::uint8_t stage = 0;
    std::uint8_t escape = 0;                         // String, Key: 0 none, 1 after '\', 2-5 reading \u's hex digits
    std::uint8_t utf8_pending = 0;                   // String, Key: continuation bytes still due
    std::uint8_t utf8_low = 0x80, utf8_high = 0xBF;  // the next continuation byte's range
    bool allow_whitespace = false;                   // Value: whitespace may come before it
    bool negative = false;                           // Number
    std::uint8_t integer_digits = 0, fraction_digits = 0, exponent_digits = 0;  // Number
    int node = -1;                        // the grammar node (-1: a String or Number without bounds); Root: the branch
    int child = -1;                       // Object: the node the current key's value follows
    std::int64_t count = 0;               // Object: next property; Array: items; String, Key: code points or bytes;
                                          // Literal: bytes matched; Root: bytes of the prefix or suffix matched
    std::uint64_t keys = 0;               // Key: the properties whose key still matches the bytes so far
    const std::string* text = nullptr;    // Literal
    double magnitude = 0.0, scale = 1.0;  // Number: |value| so far and the last fraction digit's weight

    bool operator==(const Frame& other) const;
  };
  struct Thread {
    std::vector<Frame> frames;
    int whitespace_run = 0;
    bool newline_in_run = false;
    bool operator==(const Thread& other) const {
      return frames == other.frames && whitespace_run == other.whitespace_run && newline_in_run == other.newline_in_run;
    }
  };

  // Feeds `byte` to `thread` (consumed), appending what it becomes to `out`: nothing when it dies, several
  // threads when an anyOf or enum branches. `depth` bounds branching into branches.
  void step(Thread& thread, std::uint8_t byte, std::vector<Thread>& out, int depth) const;
  // A value's first byte: 1 consumed, 0 refused or handed to branches (in `out`), -1 to be fed again (a number).
  int step_value(Thread& thread, std::uint8_t byte, std::vector<Thread>& out, int depth) const;
  bool step_object(Thread& thread, std::uint8_t byte) const;
  bool step_array(Thread& thread, std::uint8_t byte) const;
  bool step_key(Thread& thread, std::uint8_t byte) const;
  // Number: 1 consumed, 0 refused, -1 the number ended before `byte` (which goes to the parent).
  int step_number(Frame& frame, std::uint8_t byte) const;
  // Pops the finished top frame and moves its parent past it.
  void finish_top(Thread& thread) const;
  bool thread_can_end(Thread thread) const;
  bool number_can_end(const Frame& frame) const;
  bool number_feasible(const Frame& frame) const;
  bool properties_left(const Frame& object) const;  // another key may still come
  bool required_left(const Frame& object) const;    // a required key must still come
  // The listed keys that may come next: the next ones up to and including the first required one.
  std::uint64_t keys_in_turn(const Frame& object) const;

  const JsonGrammar* grammar_;
  std::vector<Thread> threads_, next_;
};

}  // namespace kvchat
