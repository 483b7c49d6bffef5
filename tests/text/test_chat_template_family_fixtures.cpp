// The published chat templates of more model families (tests/fixtures/chat_templates/*.json, written by
// tests/reference/make_chat_template_fixtures.py with the real Jinja2 set up as transformers sets it up) must
// render here byte for byte as they did there, and fail where they failed there. One row per conversation, so a
// difference names its template and case.
//
// The cases this renderer does not reproduce yet are listed in kKnownGaps with the reason: they run and are
// checked like the others, as expected failures, so they stay in the report, and one that starts to pass fails
// the suite (an unexpected pass) until it is taken off the list.
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/template_rendering.h"
#include "common/test_paths.h"
#include "engine/text/chat_template.h"
#include "engine/text/chat_template_config.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_chat_template_family_fixtures {

using kvchat::ChatTemplate;
using kvchat::TemplateError;
using json = nlohmann::ordered_json;  // key order is what tojson and Python's dict repr print

namespace {

// Fewer files or cases than this means the fixtures went missing, not that there is less to check.
constexpr std::size_t kMinimumFiles = 6;
constexpr std::size_t kMinimumCasesPerFile = 10;

// "family/case", or "family/*" for every case of a template, with why this renderer differs there.
struct KnownGap {
  const char* label;
  const char* reason;
};
// Empty today: every case of every file renders as Jinja2 did. A gap found later goes here with its reason.
const std::vector<KnownGap> kKnownGaps = {};

bool matches(const std::string& pattern, const std::string& label) {
  if (pattern.size() > 2 && pattern.compare(pattern.size() - 2, 2, "/*") == 0)
    return label.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
  return pattern == label;
}

const char* known_gap(const std::string& label) {
  for (const KnownGap& gap : kKnownGaps)
    if (matches(gap.label, label)) return gap.reason;
  return nullptr;
}

std::filesystem::path fixture_folder() {
  return std::filesystem::path(kvchat::test::source_dir()) / "tests" / "fixtures" / "chat_templates";
}

std::vector<std::filesystem::path> fixture_files() {
  std::vector<std::filesystem::path> files;
  const std::filesystem::path folder = fixture_folder();
  if (!std::filesystem::is_directory(folder)) return files;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

json read_json(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  std::stringstream buffer;
  buffer << file.rdbuf();
  return json::parse(buffer.str());
}

// A fixture read once, with its template parsed once (or why it does not parse).
struct Fixture {
  json data;
  std::unique_ptr<ChatTemplate> chat_template;
  std::string parse_error;
};

const Fixture& fixture(const std::string& path) {
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  auto found = cache.find(path);
  if (found != cache.end()) return *found->second;
  auto loaded = std::make_unique<Fixture>();
  loaded->data = read_json(path);
  try {
    loaded->chat_template = std::make_unique<ChatTemplate>(loaded->data["template"].get<std::string>());
  } catch (const TemplateError& error) {
    loaded->parse_error = error.what();
  }
  return *cache.emplace(path, std::move(loaded)).first->second;
}

std::string difference(const std::string& expected, const std::string& actual) {
  std::size_t at = 0;
  while (at < expected.size() && at < actual.size() && expected[at] == actual[at]) ++at;
  const std::size_t from = at > 60 ? at - 60 : 0;
  std::ostringstream out;
  out << "first difference at byte " << at << " (expected " << expected.size() << " bytes, got " << actual.size()
      << ")\n   expected: ..." << kvchat::test::visible(expected.substr(from, 160)) << "\n   actual:   ..."
      << kvchat::test::visible(actual.substr(from, 160));
  return out.str();
}

// What went wrong with one case, or "" when it came out as Jinja2's did.
std::string check_case(const Fixture& fixture, const json& c) {
  const bool expect_error = c.value("error", false);
  if (!fixture.chat_template) return "the template does not parse: " + fixture.parse_error;
  const json& data = fixture.data;
  const json context =
      kvchat::chat_template_context(c["messages"], c["add_generation_prompt"].get<bool>(), data["special_tokens"],
                                    c.contains("tools") ? c["tools"] : json(nullptr),
                                    c.contains("extra_context") ? c["extra_context"] : json::object());
  // "2026-07-26T00:00:00": the day strftime_now was fixed to.
  const std::string today = data.value("fixed_date", std::string()).substr(0, 10);
  std::string actual;
  try {
    actual = fixture.chat_template->render(context, today);
  } catch (const TemplateError& error) {
    if (expect_error) return "";
    return std::string("unexpected TemplateError: ") + error.what();
  }
  if (expect_error)
    return "Jinja2 failed (" + c.value("error_message", std::string()) +
           ") but this rendered: " + kvchat::test::visible(actual.substr(0, 300));
  const std::string expected = c["rendered"].get<std::string>();
  return actual == expected ? "" : difference(expected, actual);
}

}  // namespace

class ChatTemplateFamilyFixtureTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  // The fixtures are all there, each with its template, where it came from, and enough conversations.
  void fixtures_are_complete() {
    const std::vector<std::filesystem::path> files = fixture_files();
    QVERIFY2(files.size() >= kMinimumFiles, qPrintable(QString("%1 fixture files in %2, expected at least %3")
                                                           .arg(files.size())
                                                           .arg(QString::fromStdString(fixture_folder().string()))
                                                           .arg(kMinimumFiles)));
    for (const auto& path : files) {
      const json& data = fixture(path.string()).data;
      const QString name = QString::fromStdString(path.filename().string());
      QVERIFY2(data.contains("source") && !data["source"].get<std::string>().empty(), qPrintable(name));
      QVERIFY2(data.contains("template") && !data["template"].get<std::string>().empty(), qPrintable(name));
      QVERIFY2(data["cases"].size() >= kMinimumCasesPerFile, qPrintable(name + ": too few cases"));
      bool rendered = false, failed = false;
      for (const json& c : data["cases"]) (c.value("error", false) ? failed : rendered) = true;
      QVERIFY2(rendered && failed, qPrintable(name + ": needs cases that render and cases that fail"));
    }
    // Every entry of the gap list names a case that exists: a gap left behind after its case was renamed
    // would hide nothing and mislead the reader.
    for (const KnownGap& gap : kKnownGaps) {
      bool matched = false;
      for (const auto& path : files) {
        const std::string family = path.stem().string();
        for (const json& c : fixture(path.string()).data["cases"])
          if (matches(gap.label, family + "/" + c["name"].get<std::string>())) matched = true;
      }
      QVERIFY2(matched, qPrintable(QString("known gap %1 names no case").arg(gap.label)));
    }
  }

  void renders_like_jinja2_data() {
    QTest::addColumn<QString>("path");
    QTest::addColumn<int>("index");
    for (const auto& path : fixture_files()) {
      const json& cases = fixture(path.string()).data["cases"];
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const std::string label = path.stem().string() + "/" + cases[i]["name"].get<std::string>();
        QTest::newRow(label.c_str()) << QString::fromStdString(path.string()) << static_cast<int>(i);
      }
    }
  }
  void renders_like_jinja2() {
    QFETCH(QString, path);
    QFETCH(int, index);
    const Fixture& loaded = fixture(path.toStdString());
    const json& c = loaded.data["cases"][static_cast<std::size_t>(index)];
    const std::string failure = check_case(loaded, c);
    if (const char* reason = known_gap(QTest::currentDataTag())) QEXPECT_FAIL("", reason, Continue);
    QVERIFY2(failure.empty(), failure.c_str());
  }
};

KVCHAT_TEST_APPLESS_MAIN(ChatTemplateFamilyFixtureTest)

}  // namespace text_test_chat_template_family_fixtures

#include "test_chat_template_family_fixtures.moc"
