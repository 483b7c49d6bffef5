// The linear substring search of the template interpreter against a plain quadratic search, on texts
// made of two letters (where borders and overlapping matches are everywhere) and needles long enough
// to take the Knuth–Morris–Pratt path as well as short ones.
#include <random>
#include <string>
#include <string_view>

#include <QtTest/QtTest>
#include "common/test_suite.h"

#include "engine/text/jinja/jinja_substring.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_substring_search {

using kvchat::jinja::SubstringSearch;

namespace {

constexpr std::size_t npos = std::string_view::npos;

std::size_t naive_find(std::string_view text, std::string_view needle, std::size_t from) {
  for (std::size_t i = from; i + needle.size() <= text.size(); ++i)
    if (text.compare(i, needle.size(), needle) == 0) return i;
  return npos;
}

std::size_t naive_rfind(std::string_view text, std::string_view needle, std::size_t end) {
  end = std::min(end, text.size());
  if (end < needle.size()) return npos;
  for (std::size_t i = end - needle.size() + 1; i-- > 0;)
    if (text.compare(i, needle.size(), needle) == 0) return i;
  return npos;
}

}  // namespace

class SubstringSearchTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void matches_a_plain_search() {
    std::mt19937 random(7);
    int checked = 0, found = 0;
    for (int round = 0; round < 400; ++round) {
      std::string text(200 + random() % 400, 'a');
      for (char& c : text) c = random() % 4 == 0 ? 'b' : 'a';
      // Needles from the text itself (so they occur, often overlapping), some with one byte changed.
      std::size_t length = round % 2 ? 65 + random() % 60 : 1 + random() % 64;
      std::size_t start = random() % (text.size() - length);
      std::string needle = text.substr(start, length);
      if (round % 3 == 0) needle[random() % length] ^= 3;  // 'a' <-> 'b'
      const SubstringSearch search(needle);
      for (std::size_t from : {std::size_t{0}, start, start + 1, text.size() / 2, text.size(), text.size() + 5}) {
        std::size_t expected = naive_find(text, needle, from);
        QCOMPARE(search.find(text, from), expected);
        QCOMPARE(search.rfind(text, from), naive_rfind(text, needle, from));
        ++checked;
        found += expected != npos;
      }
    }
    QVERIFY(found > checked / 4);  // the comparison covered matches, not only misses
  }

  void finds_every_occurrence_in_turn() {
    const std::string needle = std::string(70, 'a');
    const std::string text = std::string(300, 'a') + "b" + std::string(69, 'a') + "b" + std::string(140, 'a');
    const SubstringSearch search(needle);
    std::vector<std::size_t> starts;
    for (std::size_t at = search.find(text); at != npos; at = search.find(text, at + needle.size()))
      starts.push_back(at);
    QCOMPARE(starts, (std::vector<std::size_t>{0, 70, 140, 210, 371, 441}));
  }
};

KVCHAT_TEST_APPLESS_MAIN(SubstringSearchTest)

}  // namespace text_test_substring_search

#include "test_substring_search.moc"
