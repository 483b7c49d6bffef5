#include "engine/text/jinja/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "engine/text/jinja/jinja_error.h"
#include "engine/text/jinja/jinja_pystr.h"
#include "engine/text/utf8.h"

namespace kvchat::jinja {

const char* describe(TokenType type) {
  switch (type) {
    case TokenType::Data: return "template data";
    case TokenType::VarBegin: return "begin of print statement";
    case TokenType::VarEnd: return "end of print statement";
    case TokenType::BlockBegin: return "begin of statement block";
    case TokenType::BlockEnd: return "end of statement block";
    case TokenType::Name: return "name";
    case TokenType::String: return "string";
    case TokenType::Integer: return "integer";
    case TokenType::Float: return "float";
    case TokenType::Operator: return "operator";
    case TokenType::Eof: return "end of template";
  }
  return "token";
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(const std::string& raw_source) : src_(normalize(raw_source)) {
    line_starts_.push_back(0);
    for (std::size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    std::size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      std::size_t tag = find_tag_start(pos);
      if (tag == std::string::npos) {
        emit(TokenType::Data, src_.substr(pos), pos);
        break;
      }
      char kind = src_[tag + 1];
      char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      std::size_t raw_end = kind == '%' ? match_raw_begin(tag) : std::string::npos;
      std::string text = apply_left_control(src_.substr(pos, tag - pos), sign, kind != '{', line_starting);
      if (!text.empty()) emit(TokenType::Data, std::move(text), pos);

      if (raw_end != std::string::npos) {
        pos = lex_raw_body(tag, raw_end);
      } else if (kind == '#') {
        pos = skip_comment(tag, tag + 2 + (sign ? 1 : 0));
      } else {
        pos = lex_tag(tag, kind == '%', tag + 2 + (sign ? 1 : 0));
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back(Token{TokenType::Eof, "", line_of(src_.size()), column_of(src_.size())});
    return std::move(tokens_);
  }

 private:
  static std::string normalize(const std::string& source) {
    std::string out;
    out.reserve(source.size());
    for (std::size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        out += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        out += source[i];
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
    return out;
  }

  int line_of(std::size_t pos) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    return static_cast<int>(it - line_starts_.begin());
  }

  // Tokens come in source order, so the column is counted on from the previous token's when both are
  // on one line: counting from the line start every time made a long one-line template quadratic.
  int column_of(std::size_t pos) const {
    std::size_t start = line_starts_[static_cast<std::size_t>(line_of(pos) - 1)];
    if (column_cursor_.pos < start || column_cursor_.pos > pos) column_cursor_ = {start, 1};
    std::string_view skipped = std::string_view(src_).substr(column_cursor_.pos, pos - column_cursor_.pos);
    column_cursor_ = {pos, column_cursor_.column + static_cast<int>(pystr::code_point_count(skipped))};
    return column_cursor_.column;
  }

  [[noreturn]] void fail(std::size_t pos, const std::string& message) const {
    throw TemplateError(std::to_string(line_of(pos)) + ":" + std::to_string(column_of(pos)) + ": " + message);
  }

  void emit(TokenType type, std::string value, std::size_t pos) {
    tokens_.push_back(Token{type, std::move(value), line_of(pos), column_of(pos)});
  }

  bool starts_with(std::size_t pos, const char* text) const { return src_.compare(pos, std::strlen(text), text) == 0; }

  // Python's \s, which includes the Unicode whitespace characters; returns the byte length or 0.
  std::size_t space_at(std::size_t pos) const {
    if (pos >= src_.size()) return 0;
    auto lead = static_cast<unsigned char>(src_[pos]);
    int length = utf8::sequence_length(lead);
    if (length == 0 || pos + static_cast<std::size_t>(length) > src_.size()) return 0;
    std::u32string cp = pystr::decode(std::string_view(src_).substr(pos, static_cast<std::size_t>(length)));
    return cp.size() == 1 && pystr::is_space(cp[0]) ? static_cast<std::size_t>(length) : 0;
  }

  std::size_t skip_spaces(std::size_t pos) const {
    while (std::size_t n = space_at(pos)) pos += n;
    return pos;
  }

  std::size_t find_tag_start(std::size_t pos) const {
    for (std::size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // The text before a tag: "-" strips all whitespace; otherwise lstrip_blocks removes spaces and
  // tabs between the line start and a block or comment tag when nothing else is on that line.
  std::string apply_left_control(std::string text, char sign, bool block_or_comment, bool line_starting) const {
    if (sign == '-') {
      std::string stripped = pystr::strip(text, std::nullopt, false, true);
      return stripped;
    }
    if (sign == '+' || !block_or_comment) return text;
    std::size_t newline = text.rfind('\n');
    std::size_t line_start = newline == std::string::npos ? 0 : newline + 1;
    if (line_start == 0 && !line_starting) return text;
    for (std::size_t i = line_start; i < text.size(); ++i)
      if (text[i] != ' ' && text[i] != '\t') return text;
    text.resize(line_start);
    return text;
  }

  // After "%}" (block) or "#}" (comment): "-" strips all following whitespace, "+" keeps it, and
  // otherwise trim_blocks removes one newline. Returns the position after the end marker.
  std::size_t after_block_end(std::size_t /*marker*/, bool minus, bool plus, std::size_t marker_end) const {
    if (plus) return marker_end;
    if (minus) return skip_spaces(marker_end);
    if (marker_end < src_.size() && src_[marker_end] == '\n') return marker_end + 1;
    return marker_end;
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%}) at `tag`: returns the end of that match or npos.
  std::size_t match_raw_begin(std::size_t tag) const {
    std::size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_spaces(p);
    if (!starts_with(p, "raw")) return std::string::npos;
    p = skip_spaces(p + 3);
    if (starts_with(p, "-%}")) return skip_spaces(p + 3);
    if (starts_with(p, "%}")) return p + 2;
    return std::string::npos;
  }

  std::size_t lex_raw_body(std::size_t tag, std::size_t body_start) {
    for (std::size_t p = src_.find("{%", body_start); p != std::string::npos; p = src_.find("{%", p + 1)) {
      std::size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_spaces(q);
      if (!starts_with(q, "endraw")) continue;
      q = skip_spaces(q + 6);
      std::size_t end;
      if (starts_with(q, "+%}"))
        end = after_block_end(q, false, true, q + 3);
      else if (starts_with(q, "-%}"))
        end = after_block_end(q, true, false, q + 3);
      else if (starts_with(q, "%}"))
        end = after_block_end(q, false, false, q + 2);
      else
        continue;
      bool line_starting = body_start > 0 && src_[body_start - 1] == '\n';
      std::string text = apply_left_control(src_.substr(body_start, p - body_start), sign, true, line_starting);
      if (!text.empty()) emit(TokenType::Data, std::move(text), body_start);
      return end;
    }
    fail(tag, "missing end of raw directive");
  }

  std::size_t skip_comment(std::size_t tag, std::size_t pos) {
    for (std::size_t p = pos; p < src_.size(); ++p) {
      if (starts_with(p, "+#}")) return after_block_end(p, false, true, p + 3);
      if (starts_with(p, "-#}")) return after_block_end(p, true, false, p + 3);
      if (starts_with(p, "#}")) return after_block_end(p, false, false, p + 2);
    }
    fail(tag, "missing end of comment tag");
  }

  std::size_t lex_tag(std::size_t tag, bool block, std::size_t pos) {
    emit(block ? TokenType::BlockBegin : TokenType::VarBegin, block ? "{%" : "{{", tag);
    std::vector<char> balancing;
    while (true) {
      if (balancing.empty()) {
        if (block) {
          if (starts_with(pos, "+%}"))
            return end_tag(TokenType::BlockEnd, pos, after_block_end(pos, false, true, pos + 3));
          if (starts_with(pos, "-%}"))
            return end_tag(TokenType::BlockEnd, pos, after_block_end(pos, true, false, pos + 3));
          if (starts_with(pos, "%}"))
            return end_tag(TokenType::BlockEnd, pos, after_block_end(pos, false, false, pos + 2));
        } else {
          if (starts_with(pos, "-}}")) return end_tag(TokenType::VarEnd, pos, skip_spaces(pos + 3));
          if (starts_with(pos, "}}")) return end_tag(TokenType::VarEnd, pos, pos + 2);
        }
      }
      if (pos >= src_.size())
        fail(tag, std::string("unexpected end of template: the tag opened here is never closed with '") +
                      (block ? "%}" : "}}") + "'");
      if (std::size_t n = space_at(pos)) {
        pos += n;
        continue;
      }
      char c = src_[pos];
      if (std::size_t end = match_float(pos)) {
        std::string text;
        for (std::size_t i = pos; i < end; ++i)
          if (src_[i] != '_') text += src_[i];
        emit(TokenType::Float, text, pos);
        pos = end;
      } else if (is_digit(c)) {
        pos = lex_integer(pos);
      } else if (is_name_start(c)) {
        std::size_t name_end = pos;
        while (name_end < src_.size() && is_name_char(src_[name_end])) ++name_end;
        emit(TokenType::Name, src_.substr(pos, name_end - pos), pos);
        pos = name_end;
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        pos = lex_operator(pos, balancing);
      }
    }
  }

  std::size_t end_tag(TokenType type, std::size_t at, std::size_t next) {
    emit(type, type == TokenType::BlockEnd ? "%}" : "}}", at);
    return next;
  }

  // \d+(_\d+)* at pos: returns the end or 0.
  std::size_t match_digits(std::size_t pos) const {
    if (pos >= src_.size() || !is_digit(src_[pos])) return 0;
    std::size_t p = pos;
    while (p < src_.size() && is_digit(src_[p])) ++p;
    while (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1])) {
      ++p;
      while (p < src_.size() && is_digit(src_[p])) ++p;
    }
    return p;
  }

  std::size_t match_exponent(std::size_t pos) const {
    if (pos >= src_.size() || (src_[pos] != 'e' && src_[pos] != 'E')) return 0;
    std::size_t p = pos + 1;
    if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
    return match_digits(p);
  }

  // Jinja2's float_re: (?<!\.)D((\.D)?e[+-]?D|\.D), D = \d+(_\d+)*.
  std::size_t match_float(std::size_t pos) const {
    if (pos > 0 && src_[pos - 1] == '.') return 0;
    std::size_t integer_end = match_digits(pos);
    if (!integer_end) return 0;
    if (integer_end < src_.size() && src_[integer_end] == '.') {
      if (std::size_t fraction_end = match_digits(integer_end + 1)) {
        if (std::size_t exponent_end = match_exponent(fraction_end)) return exponent_end;
        return fraction_end;
      }
    }
    if (std::size_t exponent_end = match_exponent(integer_end)) return exponent_end;
    return 0;
  }

  std::size_t lex_integer(std::size_t pos) {
    std::size_t p = pos;
    int base = 10;
    if (src_[p] == '0' && p + 1 < src_.size() && std::strchr("bBoOxX", src_[p + 1]) && src_[p + 1] != 0) {
      char b = static_cast<char>(src_[p + 1] | 0x20);
      base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
      p += 2;
    }
    std::string digits;
    while (p < src_.size()) {
      char c = src_[p];
      char lower = static_cast<char>(c | 0x20);
      bool ok = base == 16 ? (is_digit(c) || (lower >= 'a' && lower <= 'f'))
                           : (c >= '0' && c < static_cast<char>('0' + base));
      if (ok) {
        digits += c;
        ++p;
      } else if (c == '_' && !digits.empty()) {
        ++p;
      } else {
        break;
      }
      if (base == 10 && digits == "0") break;  // "0(_?0)*": a leading zero is a token of its own
    }
    if (digits.empty()) fail(pos, "invalid integer literal");
    try {
      emit(TokenType::Integer, std::to_string(std::stoll(digits, nullptr, base)), pos);
    } catch (const std::out_of_range&) {
      fail(pos, "integer literal " + digits + " is too large");
    }
    return p;
  }

  std::size_t lex_string(std::size_t pos) {
    char quote = src_[pos];
    std::size_t p = pos + 1;
    while (p < src_.size() && src_[p] != quote) p += src_[p] == '\\' ? 2 : 1;
    if (p >= src_.size()) fail(pos, "unexpected end of string: the string literal is never closed");
    emit(TokenType::String, decode_escapes(src_.substr(pos + 1, p - pos - 1), pos), pos);
    return p + 1;
  }

  // Python's "unicode-escape" decoding, which Jinja2 applies to string literals.
  std::string decode_escapes(const std::string& body, std::size_t pos) const {
    std::string out;
    for (std::size_t i = 0; i < body.size(); ++i) {
      if (body[i] != '\\' || i + 1 >= body.size()) {
        out += body[i];
        continue;
      }
      char e = body[++i];
      auto hex = [&](int count) {
        std::string digits = body.substr(i + 1, static_cast<std::size_t>(count));
        if (digits.size() != static_cast<std::size_t>(count) ||
            digits.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
          fail(pos, "truncated \\x/\\u escape in string literal");
        i += static_cast<std::size_t>(count);
        unsigned long value = std::stoul(digits, nullptr, 16);
        if (value > 0x10FFFF) fail(pos, "illegal Unicode character escape in string literal");
        utf8::append_code_point(out, static_cast<std::uint32_t>(value));
      };
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        case 'N': fail(pos, "\\N{...} escapes in string literals are not supported");
        default:
          if (e >= '0' && e <= '7') {
            unsigned value = static_cast<unsigned>(e - '0');
            for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
              value = value * 8 + static_cast<unsigned>(body[++i] - '0');
            utf8::append_code_point(out, value);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }

  std::size_t lex_operator(std::size_t pos, std::vector<char>& balancing) {
    static const char* const kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                             "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOperators) {
      if (!starts_with(pos, op)) continue;
      char c = op[0];
      if (op[1] == 0 && (c == '(' || c == '[' || c == '{')) {
        balancing.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (op[1] == 0 && (c == ')' || c == ']' || c == '}')) {
        if (balancing.empty()) fail(pos, std::string("unexpected '") + c + "'");
        if (balancing.back() != c)
          fail(pos, std::string("unexpected '") + c + "', expected '" + balancing.back() + "'");
        balancing.pop_back();
      }
      emit(TokenType::Operator, op, pos);
      return pos + std::strlen(op);
    }
    std::size_t length = std::max(1, utf8::sequence_length(static_cast<unsigned char>(src_[pos])));
    fail(pos, "unexpected char '" + src_.substr(pos, length) + "'");
  }

  // The last position whose column was computed (pos at a code point boundary of its line).
  struct ColumnCursor {
    std::size_t pos = 0;
    int column = 1;
  };

  std::string src_;
  std::vector<std::size_t> line_starts_;
  std::vector<Token> tokens_;
  mutable ColumnCursor column_cursor_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace kvchat::jinja
