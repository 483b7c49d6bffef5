// Hostile chat templates (a model folder comes from a stranger): deep nesting, runaway loops and
// allocations, integer edge cases. Each must fail quickly with an error naming the limit, never crash,
// hang or take the machine's memory. The address space is capped at 2 GiB so that a regression fails
// with bad_alloc here instead of swapping.
#include <sys/resource.h>

#include <string>

#include <QtTest/QtTest>

#include <nlohmann/json.hpp>

#include "common/address_space_limit.h"
#include "common/template_rendering.h"
#include "common/test_suite.h"
#include "engine/text/chat_template.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_template_limits {

using kvchat::ChatTemplate;
using kvchat::TemplateError;
using json = nlohmann::ordered_json;

namespace {

using kvchat::test::error_of;
using kvchat::test::render;

std::string repeated(const std::string& text, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += text;
  return out;
}

const std::string kTooDeepExpression =
    "expression nested too deeply (more than 256 levels of brackets, operators, filters or attribute lookups)";
const std::string kTooDeepStatements =
    "statements nested too deeply (more than 256 levels of blocks such as if, for, macro or set)";
const std::string kTooManySteps =
    "render budget exceeded: more than 10000000 evaluation steps (expressions, statements, loop iterations, "
    "comparisons, items built)";

std::string too_big(const std::string& what, const std::string& bytes) {
  return "render budget exceeded: a " + what + " of " + bytes + " bytes is over the limit of 16777216 bytes";
}

#define COMPARE_STR(actual, expected) QCOMPARE(QString::fromStdString(actual), QString::fromStdString(expected))

}  // namespace

class TemplateLimitsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void deep_brackets_fail_when_parsed() {
    COMPARE_STR(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"),
                "1:260: " + kTooDeepExpression);
    COMPARE_STR(error_of("{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}"),
                "1:260: " + kTooDeepExpression);
    COMPARE_STR(error_of("{{ " + repeated("-", 100000) + "1 }}"), "1:260: " + kTooDeepExpression);
    COMPARE_STR(error_of("{{ " + repeated("not ", 100000) + "1 }}"), "1:1028: " + kTooDeepExpression);
    // Nesting real templates use is fine.
    COMPARE_STR(render("{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}"), "1");
    COMPARE_STR(render("{{ " + std::string(200, '[') + std::string(200, ']') + " | length }}"), "1");
  }

  // Chains of binary operators, filters and lookups build trees as deep as they are long; the
  // evaluator recurses over them, so they count toward the same limit.
  void long_chains_fail_when_parsed() {
    COMPARE_STR(error_of("{{ 'a'" + repeated(" ~ 'a'", 10000) + " }}"), "1:1538: " + kTooDeepExpression);
    COMPARE_STR(error_of("{{ x" + repeated(" | trim", 10000) + " }}"), "1:1793: " + kTooDeepExpression);
    COMPARE_STR(error_of("{{ x" + repeated(".a", 10000) + " }}"), "1:515: " + kTooDeepExpression);
    COMPARE_STR(error_of("{{ 1" + repeated(" + 1", 10000) + " }}"), "1:1026: " + kTooDeepExpression);
    COMPARE_STR(render("{{ 'a'" + repeated(" ~ 'a'", 199) + " }}"), std::string(200, 'a'));
  }

  void deep_statements_fail_when_parsed() {
    COMPARE_STR(error_of(repeated("{% for i in x %}", 20000) + repeated("{% endfor %}", 20000)),
                "1:4100: " + kTooDeepStatements);
    COMPARE_STR(error_of(repeated("{% if true %}", 20000) + repeated("{% endif %}", 20000)),
                "1:3332: " + kTooDeepStatements);
    COMPARE_STR(error_of(repeated("{% macro m() %}", 20000) + repeated("{% endmacro %}", 20000)),
                "1:3844: " + kTooDeepStatements);
    COMPARE_STR(render(repeated("{% if true %}", 200) + "x" + repeated("{% endif %}", 200)), "x");
  }

  // Each template is bounded by the parser; macros calling themselves stack deep trees on each other.
  void macros_stacking_deep_expressions_fail_when_rendered() {
    std::string source = "{% macro m(n) %}{% if n > 0 %}{{ m(n - 1)" + repeated(" ~ 'a'", 200) +
                         " }}{% endif %}{% endmacro %}{{ m(100) }}";
    COMPARE_STR(error_of(source),
                "1:1207: evaluation nested too deeply (more than 1024 statements and expressions at once, "
                "macro calls included)");
  }

  void nested_loops_run_out_of_steps() {
    COMPARE_STR(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
                "1:46: " + kTooManySteps);
    // Quadratic work inside one filter counts too: 10^5 distinct items compared with each other.
    COMPARE_STR(error_of("{{ range(100000) | unique | list | length }}"), "1:20: " + kTooManySteps);
  }

  void growing_strings_and_lists_fail_before_allocating() {
    COMPARE_STR(error_of("{{ 'x' * 10**12 }}"), "1:8: " + too_big("string", "1000000000000"));
    COMPARE_STR(error_of("{{ [1] * 10**9 }}"), "1:8: " + too_big("list", "152000000000"));
    COMPARE_STR(error_of("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
                         "{% endfor %}{{ ns.s | length }}"),
                "1:76: " + too_big("string", "33554432"));
    COMPARE_STR(error_of("{{ [1, [2]] | tojson(indent=10**9) }}"), "1:15: " + too_big("string", "1000000000"));
    COMPARE_STR(error_of("{{ 'a\\nb' | indent(10**12) }}"), "1:13: " + too_big("string", "1000000000000"));
    COMPARE_STR(error_of("{% set s = 'x' * 2**24 %}{{ s | replace('', s) }}"),
                "1:33: " + too_big("string", "281475010265088"));
    // A list holding the same list many times prints as the product of the two.
    COMPARE_STR(error_of("{% set l = [1] * 100000 %}{{ [l] * 100 }}"), "1:34: " + too_big("string", "16800111"));
  }

  // Lists and dicts built inside each other at one level per loop step: printing, comparing or freeing
  // the result would recurse once per level.
  void deeply_nested_values_fail_when_built() {
    const std::string too_deep = "lists and dicts nested more than 256 levels deep";
    COMPARE_STR(error_of("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
                         "{% endfor %}{{ ns.l }}"),
                "1:73: " + too_deep);
    COMPARE_STR(error_of("{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = {'k': ns.d} %}"
                         "{% endfor %}{{ ns.d == ns.d }}"),
                "1:73: " + too_deep);
    // 255 levels are fine (one more for the outer list of the last step).
    COMPARE_STR(render("{% set ns = namespace(l=[]) %}{% for i in range(254) %}{% set ns.l = [ns.l] %}{% endfor %}"
                       "{{ ns.l | tojson | length }}"),
                "510");
    json deep = json::array();
    for (int i = 0; i < 100000; ++i) {
      json outer = json::array();
      outer.push_back(std::move(deep));
      deep = std::move(outer);
    }
    json context = json::object();
    context["messages"] = std::move(deep);  // moved: nlohmann::json copies recursively
    COMPARE_STR(error_of("{{ messages }}", context), "template context: JSON nested more than 256 levels deep");
  }

  // Namespaces are mutable: a chain of 60,000, each holding the next, is freed without recursing once
  // per link; a render makes at most 65,536.
  void namespace_chains_are_freed_and_bounded() {
    COMPARE_STR(render("{% set h = namespace(head=none) %}{% for i in range(60000) %}"
                       "{% set h.head = namespace(next=h.head) %}{% endfor %}{% set h.self = h %}done"),
                "done");
    COMPARE_STR(error_of("{% set h = namespace(head=none) %}{% for i in range(70000) %}"
                         "{% set h.head = namespace(next=h.head) %}{% endfor %}"),
                "1:87: more than 65536 namespace() objects");
  }

  // Substring search is linear in the text (a needle matching everywhere but at its end made the
  // library search quadratic: ~10^13 comparisons here), and each search is charged to the budget.
  void substring_search_is_linear_and_counted() {
    const std::string setup = "{% set a = 'a' * 8000000 %}{% set b = 'a' * 4000000 ~ 'b' %}";
    COMPARE_STR(render(setup + "{{ b in a }}|{{ a.find(b) }}|{{ a.count(b) }}|{{ a.split(b) | length }}|"
                               "{{ a.rsplit(b, 1) | length }}|{{ a.replace(b, 'x') | length }}"),
                "False|-1|0|1|1|8000000");
    COMPARE_STR(error_of(setup + "{% for i in range(1000) %}{{ 'b' in a }}{% endfor %}"), "1:90: " + kTooManySteps);
  }

  // Found by fuzzing: a float literal past a double's range ended the process (std::stod threw out of
  // the parser). As in Python: inf, or 0.0 below the range. An attribute path of 30 digits is a key.
  void float_literals_out_of_range_are_inf_or_zero() {
    COMPARE_STR(render("{{ 1e408 }}|{{ -1e408 }}|{{ 1e-400 }}|{{ 1.5e3 }}"), "inf|-inf|0.0|1500.0");
    COMPARE_STR(render("{% for x in [1e408] %}{{ x > 1e300 }}{% endfor %}"), "True");
    COMPARE_STR(render("{{ [{'a': 1}] | map(attribute='999999999999999999999999999999') | list | length }}"), "1");
  }

  void output_is_bounded() {
    COMPARE_STR(error_of("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"),
                "1:36: " + too_big("rendered output", "16778000"));
  }

  // Python's results, or a clear error where they do not fit in 64 bits; never undefined behaviour.
  void integer_edge_cases() {
    const std::string min = "(-9223372036854775807 - 1)";
    COMPARE_STR(render("{{ range(" + min + ", 9223372036854775807, 4611686018427387904) | list }}"),
                "[-9223372036854775808, -4611686018427387904, 0, 4611686018427387904]");
    COMPARE_STR(render("{{ range(9223372036854775806, 9223372036854775807, 10) | list }}"), "[9223372036854775806]");
    COMPARE_STR(render("{{ range(9223372036854775807, " + min + ", " + min + ") | list }}"),
                "[9223372036854775807, -1]");
    COMPARE_STR(error_of("{{ range(" + min + ", 9223372036854775807) }}"),
                "1:9: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    COMPARE_STR(render("{{ [1, 2, 3][::" + min + "] }}|{{ 'abc'[::" + min +
                       "] }}|{{ [1, 2, 3][1::9223372036854775807] }}"
                       "|{{ [1, 2, 3][" +
                       min + ":9223372036854775807:-1] }}|{{ [1, 2, 3][-9223372036854775807:2] }}"),
                "[3]|c|[2]|[]|[1, 2]");
    COMPARE_STR(render("{{ 'ab' * -5 }}|{{ [1] * " + min + " }}|{{ '' * 10**15 }}|{{ [] * 10**15 }}"), "|[]||[]");
    COMPARE_STR(render("{{ '10' | int(base=99) }}|{{ 7 // -2 }}|{{ " + min + " // 1 }}"), "10|-4|-9223372036854775808");
    const std::string overflow = "integer overflow (Python integers are unbounded; this interpreter uses 64 bits)";
    COMPARE_STR(error_of("{{ -" + min + " }}"), "1:4: " + overflow);
    COMPARE_STR(error_of("{{ " + min + " * -1 }}"), "1:31: " + overflow);
    COMPARE_STR(error_of("{{ 3037000500 * 3037000500 }}"), "1:15: " + overflow);
    COMPARE_STR(error_of("{{ 1e300 | int }}"), "1:12: " + overflow);
  }

  // Parsing is linear: a template of 200,000 statements on one line (quadratic column counting took
  // minutes at this size) parses and renders.
  void a_long_template_parses_and_renders() {
    std::string source = repeated("{% if true %}x{% endif %}", 200000);
    COMPARE_STR(render(source), std::string(200000, 'x'));
  }

  // The real templates stay far from every limit (test_chat_template_fixtures renders them all).
  void a_typical_template_renders() {
    json context = {{"messages", json::array()}};
    for (int i = 0; i < 500; ++i)
      context["messages"].push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "hi"}});
    std::string source =
        "{% for m in messages %}{% if m.role == 'user' %}<u>{{ m.content | trim }}</u>{% else %}<a>{{ m.content }}</a>"
        "{% endif %}{% endfor %}";
    COMPARE_STR(render(source, context).substr(0, 20), "<u>hi</u><a>hi</a><u");
  }
};

namespace {

int template_limits_main(int argc, char** argv) {
  kvchat::test::limit_address_space(rlim_t{2} << 30);  // 2 GiB of address space
  TemplateLimitsTest test;
  return QTest::qExec(&test, argc, argv);
}

}  // namespace

KVCHAT_TEST_CUSTOM_MAIN(template_limits_main)

}  // namespace text_test_template_limits

#include "test_template_limits.moc"
