// The Jinja2 semantics chat templates depend on, each pinned by a small template whose output
// under Jinja2 3.1 (trim_blocks, lstrip_blocks, loopcontrols) is known.
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <nlohmann/json.hpp>

#include "common/template_rendering.h"
#include "engine/text/chat_template.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_chat_template_semantics {

using kvchat::ChatTemplate;
using kvchat::TemplateError;
using json = nlohmann::ordered_json;

namespace {

using kvchat::test::error_of;
using kvchat::test::render;

#define COMPARE_STR(actual, expected) QCOMPARE(QString::fromStdString(actual), QString::fromStdString(expected))

}  // namespace

class ChatTemplateSemanticsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void trim_blocks_removes_the_newline_after_a_block_tag() {
    COMPARE_STR(render("{% if true %}\nyes\n{% endif %}\nz"), "yes\nz");
  }

  void lstrip_blocks_removes_indentation_before_block_tags_only() {
    COMPARE_STR(render("  {% if true %}\n  yes\n  {% endif %}\n"), "  yes\n");
    COMPARE_STR(render("  {{ 'x' }}"), "  x");    // not before {{ }}
    COMPARE_STR(render("  {# note #}\nx"), "x");  // comments too
    COMPARE_STR(render("{%- if true %}\n\tA\n{%- endif %}"), "\tA");
  }

  void minus_and_plus_modifiers() {
    COMPARE_STR(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
    COMPARE_STR(render("x {{- ' d ' -}} y"), "x d y");
    COMPARE_STR(render("x\n  {%+ if true %}y{% endif +%}\nz"), "x\n  y\nz");
  }

  void source_newlines_are_normalised_and_one_trailing_newline_dropped() {
    COMPARE_STR(render("x\n\n"), "x\n");
    COMPARE_STR(render("a\r\nb\rc"), "a\nb\nc");
  }

  void set_in_a_loop_does_not_leak_but_namespace_does() {
    COMPARE_STR(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}"),
                "11,11,1");
    COMPARE_STR(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + 10 %}{{ ns.x }},"
                       "{% endfor %}{{ ns.x }}"),
                "11,21,21");
    COMPARE_STR(render("{% for i in [1] %}{% set inner = 5 %}{% endfor %}{{ inner is defined }}"), "False");
    COMPARE_STR(render("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");  // if has no scope
  }

  void negative_slicing_of_lists_and_strings() {
    json context = {{"xs", {1, 2, 3, 4, 5}}, {"s", "añb€"}};
    COMPARE_STR(render("{{ xs[-2:] }}|{{ xs[::-1] }}|{{ xs[1:-1] }}|{{ xs[::-2] }}", context),
                "[4, 5]|[5, 4, 3, 2, 1]|[2, 3, 4]|[5, 3, 1]");
    // Strings slice by code point, not by byte.
    COMPARE_STR(render("{{ s[::-1] }}|{{ s[-2:] }}|{{ s[-1] }}", context), "€bña|b€|€");
  }

  void undefined_and_none_behave_as_in_jinja2() {
    COMPARE_STR(render("[{{ nothing }}][{{ nothing | trim }}][{{ nothing | length }}][{{ nothing is defined }}]"
                       "[{{ none }}][{{ none | trim }}][{{ 'a' ~ nothing ~ 'b' }}][{{ d.missing is defined }}]",
                       {{"d", json::object()}}),
                "[][][0][False][None][None][ab][False]");
    COMPARE_STR(render("{{ 'Hi' if false }}|{{ ('x' if false) is defined }}"), "|False");
    // Using an undefined value, or adding None to a string, is an error.
    QVERIFY(!error_of("{{ nothing.attribute }}").empty());
    QVERIFY(!error_of("{{ messages[0].role }}", {{"messages", json::array()}}).empty());
    QVERIFY(!error_of("{{ 'a' + none }}").empty());
    QVERIFY(!error_of("{{ m['role'] + 'x' }}", {{"m", {{"content", "c"}}}}).empty());
    QVERIFY(!error_of("{{ c.startswith('x') }}", {{"c", nullptr}}).empty());
  }

  void tojson_keeps_key_order_and_does_not_escape_html() {
    json context = json::parse(R"({"d": {"z": 1, "a": [true, null, 2.5], "é": "x"}, "s": "<a href='x'>&</a>\n"})");
    COMPARE_STR(render("{{ d | tojson }}|{{ s | tojson }}", context),
                "{\"z\": 1, \"a\": [true, null, 2.5], \"é\": \"x\"}|\"<a href='x'>&</a>\\n\"");
    json nested = json::parse(R"({"d": {"b": {"c": [1, 2]}, "a": []}})");
    COMPARE_STR(render("{{ d | tojson(indent=2) }}", nested),
                "{\n  \"b\": {\n    \"c\": [\n      1,\n      2\n    ]\n  },\n  \"a\": []\n}");
  }

  // Integer edge cases that C++ would trap on or loop over: Python's answers, or a clear overflow error.
  void integer_edge_cases_give_python_results_or_a_clear_error() {
    COMPARE_STR(render("{{ (-9223372036854775807 - 1) % -1 }}|{{ 7 % -1 }}|{{ -7 % -1 }}"), "0|0|0");
    COMPARE_STR(render("{{ 1 ** 1000000000000 }}|{{ (-1) ** 1000000000001 }}|{{ 0 ** 1000000000000 }}"), "1|-1|0");
    COMPARE_STR(render("{{ 2 ** 62 }}|{{ (-2) ** 63 }}|{{ 3 ** 39 }}"),
                "4611686018427387904|-9223372036854775808|4052555153018976267");
    for (const char* source : {"{{ 2 ** 63 }}", "{{ 3 ** 40 }}", "{{ 4294967296 ** 2 }}", "{{ 10 ** 1000000000000 }}",
                               "{{ (-9223372036854775807 - 1) // -1 }}"})
      QVERIFY2(error_of(source).find("integer overflow") != std::string::npos, source);
  }

  void python_str_and_number_formatting() {
    COMPARE_STR(render("{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 2 ** 10 }}"),
                "3.5 3 -4 2 1e+16 0.30000000000000004 1024");
    COMPARE_STR(render("{{ [1, 'a', none, true, ('t',), {'k': 1.0}] }}"), "[1, 'a', None, True, ('t',), {'k': 1.0}]");
  }

  void loops_with_loop_variables_filters_else_and_loop_controls() {
    COMPARE_STR(render("{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.first }}"
                       "{{ '.' if loop.last }} {% endfor %}",
                       {{"xs", "abc"}}),
                "1/3! 2/3 3/3. ");
    COMPARE_STR(render("{% for x in xs if x is odd %}{{ x }}{% else %}none{% endfor %}|"
                       "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}",
                       {{"xs", {1, 2, 3}}}),
                "13|empty");
    COMPARE_STR(render("{% for x in xs %}{% if x == 2 %}{% continue %}{% elif x == 4 %}{% break %}{% endif %}"
                       "{{ x }}{% endfor %}",
                       {{"xs", {1, 2, 3, 4, 5}}}),
                "13");
  }

  void python_string_methods_and_unicode_whitespace() {
    json context = {{"c", "<think>\nx\n</think>\n\nanswer"}, {"w", "\u00a0\u3000 padded\u2028\x0b"}};
    COMPARE_STR(render("{{ c.split('</think>')[-1].lstrip('\\n') }}", context), "answer");
    COMPARE_STR(render("[{{ w | trim }}][{{ w.strip() }}]", context), "[padded][padded]");
  }

  void strftime_now_uses_the_fixed_date() {
    COMPARE_STR(render("{{ strftime_now('%d %b %Y') }}", json::object(), "2026-07-26"), "26 Jul 2026");
  }

  void raise_exception_is_a_template_error_with_its_message() {
    COMPARE_STR(error_of("{{ raise_exception('Roles must alternate') }}"), "Roles must alternate");
  }

  void unknown_filter_is_reported_with_its_position_when_parsed() {
    try {
      ChatTemplate("a\n{{ x | frobnicate }}");
      QFAIL("an unknown filter must not parse");
    } catch (const TemplateError& error) {
      COMPARE_STR(std::string(error.what()), "2:8: no filter named 'frobnicate'");
    }
  }

  void syntax_error_is_reported_with_its_position() {
    try {
      ChatTemplate("{% if x %}\n  {{ 1 + }}\n{% endif %}");
      QFAIL("a syntax error must not parse");
    } catch (const TemplateError& error) {
      QVERIFY2(std::string(error.what()).rfind("2:10: ", 0) == 0, error.what());
    }
    try {
      ChatTemplate("{% for m in messages %}{{ m }}");
      QFAIL("an unclosed for must not parse");
    } catch (const TemplateError& error) {
      QVERIFY2(std::string(error.what()).rfind("1:4: ", 0) == 0, error.what());
      QVERIFY2(std::string(error.what()).find("endfor") != std::string::npos, error.what());
    }
  }

  // transformers' chat-template environment adds {% generation %}: the body renders unchanged.
  void the_generation_tag_renders_its_body() {
    COMPARE_STR(render("a{% generation %}{% if true %}b{% endif %}{{ 'c' }}{% endgeneration %}d"), "abcd");
    COMPARE_STR(render("{% for x in [1, 2] %}{% generation %}{{ loop.index }}{% endgeneration %}{% endfor %}"), "12");
    try {
      ChatTemplate("{% generation %}open");
      QFAIL("an unclosed generation tag must not parse");
    } catch (const TemplateError& error) {
      QVERIFY2(std::string(error.what()).find("endgeneration") != std::string::npos, error.what());
    }
  }

  // transformers' environment has autoescape off, yet `safe` makes a markupsafe.Markup, and Markup's
  // + escapes the plain str on either side (functionary v3.1 renders its tool list that way).
  void safe_makes_markup_that_escapes_what_is_added_to_it() {
    json context = {{"s", "<a&\"'>"}, {"d", {{"k", "<v>"}}}};
    COMPARE_STR(render("{{ ('<' | safe) + '<' }}|{{ '<' + ('<' | safe) }}|{{ ('x' | safe) + s }}", context),
                "<&lt;|&lt;<|x&lt;a&amp;&#34;&#39;&gt;");
    // The sum is Markup again; Markup + Markup escapes nothing; tojson gives a plain str, so it is escaped.
    COMPARE_STR(
        render("{{ (('a' | safe) + '<') + '>' }}|{{ ('<' | safe) + ('>' | safe) }}|{{ ('f:' | safe) + d | tojson }}",
               context),
        "a&lt;&gt;|<>|f:{&#34;k&#34;: &#34;&lt;v&gt;&#34;}");
    // `~` is str concatenation with autoescape off: no escaping, and the result is a plain str.
    COMPARE_STR(render("{{ ('<' | safe) ~ '<' }}|{{ (('<' | safe) ~ '<') + '<' }}"), "<<|<<<");
    // safe on a non-string is Markup(str(value)); undefined gives an empty Markup.
    COMPARE_STR(
        render("{{ (1 | safe) + '<' }}|{{ (none | safe) + '&' }}|{{ (nothing | safe) + '>' }}|{{ ['a' | safe] }}"),
        "1&lt;|None&amp;|&gt;|[Markup('a')]");
    // What keeps Markup (upper, trim, string, *, indexing) and what does not (title, replace, join, ~).
    COMPARE_STR(render("{{ (' a ' | safe | upper | trim) + '<' }}|{{ (('a' | safe) * 2) + '<' }}|"
                       "{{ ('ab' | safe)[0] + '<' }}|{{ ('a' | safe | string) + '<' }}"),
                "A&lt;|aa&lt;|a&lt;|a&lt;");
    COMPARE_STR(render("{{ ('a' | safe | title) + '<' }}|{{ ('a' | safe | replace('a', 'b')) + '<' }}|"
                       "{{ (['a' | safe] | join) + '<' }}"),
                "A<|b<|a<");
    COMPARE_STR(render("{{ ('a' | safe) is escaped }}{{ 'a' is escaped }}{{ ('a' | safe) is string }}"
                       "{{ ('a' | safe) == 'a' }}"),
                "TrueFalseTrueTrue");
    // markupsafe 2.1's methods: upper keeps Markup; join escapes the items; split gives Markup parts;
    // strip escapes its argument before stripping, so '<' strips the characters of '&lt;'.
    COMPARE_STR(render("{{ ('a' | safe).upper() + '<' }}|{{ (', ' | safe).join(['<', 'b' | safe]) }}|"
                       "{{ ('a b' | safe).split() }}|{{ ('<a<' | safe).strip('<') }}"),
                "A&lt;|&lt;, b|[Markup('a'), Markup('b')]|<a<");
    COMPARE_STR(error_of("{{ ('a' | safe) + 1 }}"), "1:17: unsupported operand type(s) for +: 'Markup' and 'int'");
    QVERIFY(error_of("{{ 'a' + none }}").find("can only concatenate str (not \"NoneType\") to str") !=
            std::string::npos);
  }

  // select, reject, selectattr, rejectattr and map begin with `if value:`: a falsy value (None,
  // undefined, "", 0) is an empty sequence, whatever the arguments.
  void select_and_map_of_none_or_undefined_are_empty() {
    COMPARE_STR(render("{{ none | select | list }}{{ nothing | reject('odd') | list }}"
                       "{{ none | selectattr('type', 'equalto', 'x') | list }}{{ nothing | rejectattr('a') | list }}"
                       "{{ none | map('upper') | list }}{{ none | map(attribute='a') | list | length }}"
                       "{{ 0 | select('nosuchtest') | list }}"),
                "[][][][][]0[]");
    COMPARE_STR(render("{{ tools | selectattr('type', 'equalto', 'code') | list | length > 0 }}", {{"tools", nullptr}}),
                "False");
    QVERIFY(!error_of("{{ 5 | select | list }}").empty());  // a truthy non-iterable still fails
  }

  void macros_with_defaults_keywords_and_scoping() {
    COMPARE_STR(render("{% macro m(a, b=a ~ 'x', c='d') %}{{ a }}|{{ b }}|{{ c }}{% endmacro %}"
                       "{{ m(1) }};{{ m(1, c=3) }};{{ m(b=2, a=5) }}"),
                "1|1x|d;1|1x|3;5|2|d");
    // Defaults are evaluated at each call; the macro reads its defining scope as it is at call time.
    COMPARE_STR(render("{% macro m(a=x) %}{{ a }}{{ y }}{% endmacro %}{% set x = 1 %}{% set y = 'a' %}{{ m() }}"
                       "{% set x = 2 %}{% set y = 'b' %}{{ m() }}"),
                "1a2b");
    COMPARE_STR(render("{% for i in [1, 2] %}{% set y = i * 10 %}{% macro m() %}{{ i }}{{ y }}{% endmacro %}"
                       "{% set y = 7 %}{{ m() }}{% endfor %}"),
                "1727");
    // A parameter not given is undefined; a set inside the macro stays inside.
    COMPARE_STR(render("{% macro m(a) %}[{{ a }}]{{ a is defined }}{% set q = 1 %}{{ q }}{% endmacro %}"
                       "{{ m() }}{{ q is defined }}"),
                "[]False1False");
    COMPARE_STR(render("{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}"),
                "1|(2,)|{'k': 3}");
    COMPARE_STR(render("{% macro m(n) %}{% if n > 0 %}{{ n }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(3) }}"),
                "321");
    // The result is a plain str (no autoescape): adding to it escapes nothing.
    COMPARE_STR(render("{% macro m() %}<b>{% endmacro %}{{ m() + '<' }}|{{ m() is escaped }}"), "<b><|False");
    COMPARE_STR(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
                "1:35: macro 'm' takes not more than 1 argument(s)");
    COMPARE_STR(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}"),
                "1:35: macro 'm' takes no keyword argument 'a'");
    QVERIFY(error_of("{% macro m(a=1, b) %}{% endmacro %}").find("non-default argument follows default argument") !=
            std::string::npos);
  }

  void call_blocks_pass_their_body_as_caller() {
    COMPARE_STR(render("{% macro m() %}<{{ caller() }}>{% endmacro %}{% call m() %}in{% endcall %}"), "<in>");
    COMPARE_STR(render("{% macro m(x) %}<{{ caller(x) }}|{{ caller(x, 2) }}>{% endmacro %}"
                       "{% call(a, b=5) m(1) %}{{ a }}{{ b }}{% endcall %}"),
                "<15|12>");
    // The body sees the scope of the call block, not the macro's.
    COMPARE_STR(render("{% macro m() %}{% set v = 'macro' %}{{ caller() }}{% endmacro %}{% set v = 'outer' %}"
                       "{% call m() %}{{ v }}{% endcall %}"),
                "outer");
    COMPARE_STR(render("{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}"), "False");
    QVERIFY(error_of("{% macro m() %}x{% endmacro %}{% call m() %}in{% endcall %}")
                .find("two values for the special caller argument") != std::string::npos);
  }

  void filter_blocks_filter_their_rendered_body() {
    COMPARE_STR(render("{% filter upper %}ab{{ 'c' }}{% endfilter %}|{% filter upper | trim %}  ab  {% endfilter %}|"
                       "{% filter replace('a', 'b') %}aa{% endfilter %}"),
                "ABC|AB|bb");
    COMPARE_STR(render("{% filter upper %}{% set z = 1 %}{{ z }}{% endfilter %}{{ z is defined }}"), "1False");
  }

  // Unbounded recursion stops with an error instead of overflowing the C++ stack.
  void macro_recursion_is_bounded() {
    std::string message = error_of("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}");
    QVERIFY2(message.find("maximum recursion depth exceeded") != std::string::npos, message.c_str());
    // 150 levels are fine (Jinja2 itself, under Python's recursion limit, stops a little below 200).
    COMPARE_STR(render("{% macro m(n) %}{% if n > 0 %}{{ m(n - 1) }}{% else %}done{% endif %}{% endmacro %}"
                       "{{ m(150) }}"),
                "done");
  }

  void unsupported_constructs_fail_instead_of_rendering_differently() {
    QVERIFY(error_of("{% include 'x' %}").find("'include' tag is not supported") != std::string::npos);
    QVERIFY(error_of("{{ x | center }}").find("'center' is not supported") != std::string::npos);
    QVERIFY(error_of("{{ 'x'.zfill(3) }}").find("str.zfill") != std::string::npos);
    QVERIFY(error_of("{{ d.items() }}", {{"d", {{"a", 1}}}}).find("cannot print") != std::string::npos);
  }
};

KVCHAT_TEST_APPLESS_MAIN(ChatTemplateSemanticsTest)

}  // namespace text_test_chat_template_semantics

#include "test_chat_template_semantics.moc"
