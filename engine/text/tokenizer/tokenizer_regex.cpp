#include "engine/text/tokenizer/tokenizer_regex.h"

#include <pcre2.h>

#include "engine/text/tokenizer/tokenizer_error.h"

namespace kvchat::tokenization {

// Frees a compiled pattern. Outside the anonymous namespace: Regex::Compiled, a member of the public class,
// holds one.
struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};

namespace {

// Unicode White_Space (PropList.txt), written for use inside a character class.
constexpr const char* kWhiteSpaceClassBody =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

struct MatchResources {
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchResources() {
    context = pcre2_match_context_create(nullptr);
    // The default 32 KiB JIT stack is too small for backtracking over very long whitespace runs.
    jit_stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchResources() {
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
    if (context) pcre2_match_context_free(context);
  }
};

MatchResources& thread_match_resources() {
  thread_local MatchResources resources;
  return resources;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct Regex::Compiled {
  std::unique_ptr<pcre2_code, CodeDeleter> code;
  std::string pattern;
};

std::string translate_pattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char next = pattern[i + 1];
      ++i;
      if (next == 's') {
        if (in_class) {
          out += kWhiteSpaceClassBody;
        } else {
          out += "[";
          out += kWhiteSpaceClassBody;
          out += "]";
        }
      } else if (next == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceClassBody;
        out += "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern) {
  auto compiled = std::make_shared<Compiled>();
  compiled->pattern = pattern;
  std::string translated = translate_pattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!code) {
    throw TokenizerError("invalid regex pattern '" + pattern + "': " + pcre2_message(error_code) + " at offset " +
                         std::to_string(error_offset));
  }
  compiled->code.reset(code);
  // JIT is an optimisation only: when unavailable the interpreter gives the same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  compiled_ = std::move(compiled);
}

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  pcre2_code* code = compiled_->code.get();
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  MatchResources& resources = thread_match_resources();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(), resources.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw TokenizerError("regex '" + compiled_->pattern + "' failed at byte " + std::to_string(start) + ": " +
                           pcre2_message(rc));
    }
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    std::size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one whole character so the next search starts on a boundary.
      if (begin >= text.size()) break;
      std::size_t step = 1;
      while (begin + step < text.size() && (static_cast<unsigned char>(text[begin + step]) & 0xC0) == 0x80) ++step;
      start = begin + step;
    }
  }
  return matches;
}

}  // namespace kvchat::tokenization
