#include "engine/text/jinja/jinja_pystr.h"

#include <locale.h>
#include <algorithm>
#include <clocale>
#include <cwctype>

#include "engine/text/jinja/jinja_budget.h"
#include "engine/text/jinja/jinja_substring.h"
#include "engine/text/jinja/jinja_value.h"
#include "engine/text/utf8.h"

namespace kvchat::jinja::pystr {

std::u32string decode(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    auto lead = static_cast<unsigned char>(text[i]);
    int length = utf8::sequence_length(lead);
    if (length == 0 || i + static_cast<std::size_t>(length) > text.size()) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    char32_t c = length == 1 ? lead : length == 2 ? (lead & 0x1F) : length == 3 ? (lead & 0x0F) : (lead & 0x07);
    bool ok = true;
    for (int k = 1; k < length; ++k) {
      auto byte = static_cast<unsigned char>(text[i + k]);
      if ((byte & 0xC0) != 0x80) {
        ok = false;
        break;
      }
      c = (c << 6) | (byte & 0x3F);
    }
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(c);
    i += static_cast<std::size_t>(length);
  }
  return out;
}

std::string encode(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) utf8::append_code_point(out, c);
  return out;
}

std::size_t code_point_count(std::string_view text) {
  std::size_t n = 0;
  for (char c : text)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

bool is_space(char32_t c) {
  if (c <= 0x20) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_printable(char32_t c) {
  // Assigned code points of the categories Python does not print (Cc, Cf, Cs, Co, Zl, Zp, Zs but
  // the space); unassigned code points are taken as printable.
  static const char32_t kNotPrintable[][2] = {
      {0x0, 0x1F},        {0x7F, 0xA0},       {0xAD, 0xAD},        {0x600, 0x605},     {0x61C, 0x61C},
      {0x6DD, 0x6DD},     {0x70F, 0x70F},     {0x890, 0x891},      {0x8E2, 0x8E2},     {0x1680, 0x1680},
      {0x180E, 0x180E},   {0x2000, 0x200F},   {0x2028, 0x202F},    {0x205F, 0x2064},   {0x2066, 0x206F},
      {0x3000, 0x3000},   {0xD800, 0xF8FF},   {0xFEFF, 0xFEFF},    {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD},
      {0x110CD, 0x110CD}, {0x13430, 0x13438}, {0x1BCA0, 0x1BCA3},  {0x1D173, 0x1D17A}, {0xE0001, 0xE0001},
      {0xE0020, 0xE007F}, {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD}};
  for (const auto& range : kNotPrintable)
    if (c >= range[0] && c <= range[1]) return false;
  return true;
}

std::string strip(std::string_view text, const std::optional<std::string>& chars, bool left, bool right) {
  std::u32string cps = decode(text);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strippable = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  std::size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  return encode(std::u32string_view(cps).substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view text, const std::optional<std::string>& separator,
                               std::int64_t max_split) {
  std::vector<std::string> parts;
  if (separator) {
    if (separator->empty()) throw EvalError("empty separator");
    charge_bytes(text.size());
    const SubstringSearch search(*separator);
    std::size_t start = 0;
    while (max_split < 0 || static_cast<std::int64_t>(parts.size()) < max_split) {
      std::size_t at = search.find(text, start);
      if (at == std::string_view::npos) break;
      parts.emplace_back(text.substr(start, at - start));
      start = at + separator->size();
    }
    parts.emplace_back(text.substr(start));
    return parts;
  }
  std::u32string cps = decode(text);
  std::size_t i = 0;
  while (true) {
    while (i < cps.size() && is_space(cps[i])) ++i;
    if (i >= cps.size()) break;
    if (max_split >= 0 && static_cast<std::int64_t>(parts.size()) == max_split) {
      // The rest, with its trailing whitespace stripped, is the last part.
      std::size_t end = cps.size();
      while (end > i && is_space(cps[end - 1])) --end;
      parts.push_back(encode(std::u32string_view(cps).substr(i, end - i)));
      break;
    }
    std::size_t j = i;
    while (j < cps.size() && !is_space(cps[j])) ++j;
    parts.push_back(encode(std::u32string_view(cps).substr(i, j - i)));
    i = j;
  }
  return parts;
}

std::vector<std::string> rsplit(std::string_view text, const std::optional<std::string>& separator,
                                std::int64_t max_split) {
  if (max_split < 0) return split(text, separator, max_split);
  std::vector<std::string> parts;
  if (separator) {
    if (separator->empty()) throw EvalError("empty separator");
    charge_bytes(text.size());
    const SubstringSearch search(*separator);
    std::size_t end = text.size();
    while (static_cast<std::int64_t>(parts.size()) < max_split) {
      std::size_t at = search.rfind(text, end);
      if (at == std::string_view::npos) break;
      parts.emplace_back(text.substr(at + separator->size(), end - at - separator->size()));
      end = at;
    }
    parts.emplace_back(text.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  std::u32string cps = decode(text);
  std::size_t end = cps.size();
  while (true) {
    while (end > 0 && is_space(cps[end - 1])) --end;
    if (end == 0) break;
    if (static_cast<std::int64_t>(parts.size()) == max_split) {
      std::size_t begin = 0;
      while (begin < end && is_space(cps[begin])) ++begin;
      parts.push_back(encode(std::u32string_view(cps).substr(begin, end - begin)));
      break;
    }
    std::size_t j = end;
    while (j > 0 && !is_space(cps[j - 1])) --j;
    parts.push_back(encode(std::u32string_view(cps).substr(j, end - j)));
    end = j;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> splitlines(std::string_view text) {
  std::u32string cps = decode(text);
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    char32_t c = cps[i];
    bool boundary = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                    c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!boundary) continue;
    lines.push_back(encode(std::u32string_view(cps).substr(start, i - start)));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) lines.push_back(encode(std::u32string_view(cps).substr(start)));
  return lines;
}

std::string replace(std::string_view text, std::string_view old_text, std::string_view new_text, std::int64_t count) {
  if (new_text.size() > old_text.size()) {
    // Each replacement grows the text: its final size is known before building it (a 16 MiB text with
    // '' replaced by a 16 MiB text would be 2^48 bytes).
    std::int64_t replaced = pystr::count(text, old_text);
    if (count >= 0) replaced = std::min(replaced, count);
    check_size(saturating_add(text.size(), saturating_multiply(static_cast<std::size_t>(replaced),
                                                               new_text.size() - old_text.size())),
               "string");
  }
  std::string out;
  std::int64_t done = 0;
  if (old_text.empty()) {
    // Python inserts `new` before every code point and at the end.
    std::u32string cps = decode(text);
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out.append(new_text);
        ++done;
      }
      utf8::append_code_point(out, c);
    }
    if (count < 0 || done < count) out.append(new_text);
    return out;
  }
  charge_bytes(text.size());
  const SubstringSearch search(old_text);
  std::size_t start = 0;
  while (count < 0 || done < count) {
    std::size_t at = search.find(text, start);
    if (at == std::string_view::npos) break;
    out.append(text.substr(start, at - start));
    out.append(new_text);
    start = at + old_text.size();
    ++done;
  }
  out.append(text.substr(start));
  return out;
}

std::int64_t find(std::string_view text, std::string_view needle) {
  charge_bytes(text.size());
  std::size_t at = needle.empty() ? 0 : SubstringSearch(needle).find(text);
  if (at == std::string_view::npos) return -1;
  return static_cast<std::int64_t>(code_point_count(text.substr(0, at)));
}

std::int64_t count(std::string_view text, std::string_view needle) {
  if (needle.empty()) return static_cast<std::int64_t>(code_point_count(text)) + 1;
  charge_bytes(text.size());
  const SubstringSearch search(needle);
  std::int64_t n = 0;
  for (std::size_t at = search.find(text); at != std::string_view::npos; at = search.find(text, at + needle.size()))
    ++n;
  return n;
}

namespace {

locale_t utf8_locale() {
  static locale_t locale = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    return l;
  }();
  return locale;
}

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  locale_t l = utf8_locale();
  return l ? static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), l)) : c;
}

char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  locale_t l = utf8_locale();
  return l ? static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), l)) : c;
}

bool is_cased(char32_t c) { return to_upper(c) != c || to_lower(c) != c; }

}  // namespace

std::string upper(std::string_view text) {
  std::u32string cps = decode(text);
  for (char32_t& c : cps) c = to_upper(c);
  return encode(cps);
}

std::string lower(std::string_view text) {
  std::u32string cps = decode(text);
  for (char32_t& c : cps) c = to_lower(c);
  return encode(cps);
}

std::string capitalize(std::string_view text) {
  std::u32string cps = decode(text);
  for (std::size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? to_upper(cps[i]) : to_lower(cps[i]);
  return encode(cps);
}

std::string title(std::string_view text) {
  std::u32string cps = decode(text);
  bool previous_cased = false;
  for (char32_t& c : cps) {
    bool cased = is_cased(c);
    c = previous_cased ? to_lower(c) : to_upper(c);
    previous_cased = cased;
  }
  return encode(cps);
}

bool is_lower(std::string_view text) {
  bool any_cased = false;
  for (char32_t c : decode(text)) {
    if (!is_cased(c)) continue;
    if (to_lower(c) != c) return false;
    any_cased = true;
  }
  return any_cased;
}

bool is_upper(std::string_view text) {
  bool any_cased = false;
  for (char32_t c : decode(text)) {
    if (!is_cased(c)) continue;
    if (to_upper(c) != c) return false;
    any_cased = true;
  }
  return any_cased;
}

}  // namespace kvchat::jinja::pystr
