// Constrained decoding without a model: the schema compiler's refusals, the byte matcher against texts
// known valid or invalid and against an independent validator, and the token mask against a brute-force
// check of every token (a small vocabulary with every byte, and Llama 3's 128k-token vocabulary).
#include <random>
#include <string>
#include <vector>

#include <QtTest/QtTest>
#include "common/json_schema_testing.h"
#include "common/test_paths.h"
#include "common/test_suite.h"

#include "engine/text/constraint/json_grammar.h"
#include "engine/text/constraint/json_matcher.h"
#include "engine/text/constraint/token_constraint.h"
#include "engine/text/tokenizer.h"

namespace text_test_json_constraint {

using kvchat::ConstraintVocabulary;
using kvchat::JsonGrammar;
using kvchat::JsonMatcher;
using kvchat::SchemaError;
using kvchat::TokenConstraint;
using kvchat::TokenId;
using kvchat::test::ordered_json;

namespace {

// Whether the matcher takes all of `text` and may end there.
bool accepts(const JsonGrammar& grammar, const std::string& text) {
  JsonMatcher matcher(grammar);
  return matcher.advance(text) && matcher.complete();
}

std::string schema_error_path(const std::string& schema) {
  try {
    kvchat::compile_json_schema(std::string_view(schema));
  } catch (const SchemaError& error) {
    return error.path() + " | " + error.what();
  }
  return "(compiled)";
}

const char* const kPersonSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 5, "description": "annotations are ignored"},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    "height": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})";

// A random walk through the matcher, one byte at a time, leaning towards bytes that close what is open so
// that most walks end. Returns the text, or "" when the walk did not end within `limit` bytes.
// Three functions as branches: get_weather and get_time with object arguments, get (a prefix of both names) with
// an array of booleans.
JsonGrammar joined_functions() {
  std::vector<JsonGrammar> branches;
  for (const auto& [name, schema] : std::vector<std::pair<std::string, std::string>>{
           {"get_weather",
            R"({"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer",)"
            R"( "minimum": 1, "maximum": 7}}, "required": ["city"], "additionalProperties": false})"},
           {"get_time", R"({"type": "object", "properties": {"zone": {"type": "string", "maxLength": 5}},)"
                        R"( "required": ["zone"], "additionalProperties": false})"},
           {"get", R"({"type": "array", "items": {"type": "boolean"}, "maxItems": 3})"}}) {
    JsonGrammar branch = kvchat::compile_json_schema(std::string_view(schema));
    branch.prefix = "<function=" + name + ">";
    branch.suffix = "</function>";
    branches.push_back(std::move(branch));
  }
  return kvchat::join_grammars(branches);
}

std::string random_text(const JsonGrammar& grammar, std::mt19937& random, std::size_t limit = 4000) {
  JsonMatcher matcher(grammar);
  std::string text;
  while (text.size() < limit) {
    if (matcher.complete() && random() % 2 == 0) return text;
    std::vector<int> allowed, closing;
    for (int byte = 0; byte < 256; ++byte) {
      JsonMatcher copy = matcher;
      if (!copy.advance(static_cast<std::uint8_t>(byte))) continue;
      allowed.push_back(byte);
      if (std::string("\"]},0123456789tfn").find(static_cast<char>(byte)) != std::string::npos) closing.push_back(byte);
    }
    if (allowed.empty()) return matcher.complete() ? text : std::string();
    const std::vector<int>& from = !closing.empty() && random() % 3 != 0 ? closing : allowed;
    const int byte = from[random() % from.size()];
    matcher.advance(static_cast<std::uint8_t>(byte));
    text += static_cast<char>(byte);
  }
  return {};
}

// The tokens a brute-force check allows: each token's bytes fed to a copy of the matcher.
std::vector<bool> brute_force_allowed(const JsonMatcher& matcher, const std::vector<std::string>& tokens,
                                      const std::vector<bool>& usable) {
  std::vector<bool> allowed(tokens.size());
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    if (!usable[id] || tokens[id].empty()) continue;
    JsonMatcher copy = matcher;
    allowed[id] = copy.advance(tokens[id]);
  }
  return allowed;
}

// Walks `steps` tokens through `grammar` under the constraint, comparing its mask with the brute-force
// one at every step; returns the text written.
std::string compare_masks(const std::shared_ptr<const JsonGrammar>& grammar, const std::vector<std::string>& tokens,
                          const std::vector<bool>& usable, std::mt19937& random, int steps) {
  auto vocabulary = std::make_shared<const ConstraintVocabulary>(tokens, usable);
  TokenConstraint constraint(grammar, vocabulary);
  JsonMatcher shadow(*grammar);
  std::string text;
  for (int step = 0; step < steps && !(constraint.complete() && random() % 4 == 0); ++step) {
    const std::vector<std::uint64_t>& bits = constraint.allowed();
    const std::vector<bool> expected = brute_force_allowed(shadow, tokens, usable);
    std::vector<TokenId> allowed;
    for (std::size_t id = 0; id < tokens.size(); ++id) {
      const bool got = bits[id / 64] >> (id % 64) & 1;
      if (got != expected[id])
        qFatal("step %d after '%s': token %zu ('%s') allowed %d, brute force %d", step, text.c_str(), id,
               tokens[id].c_str(), int(got), int(expected[id]));
      if (got) allowed.push_back(static_cast<TokenId>(id));
    }
    if (allowed.empty()) break;
    const TokenId token = allowed[random() % allowed.size()];
    if (!constraint.accept(token)) qFatal("an allowed token was refused");
    shadow.advance(tokens[static_cast<std::size_t>(token)]);
    text += tokens[static_cast<std::size_t>(token)];
  }
  return text;
}

}  // namespace

class JsonConstraintTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void schemas_the_constraint_cannot_follow_are_refused_by_name() {
    QCOMPARE(schema_error_path("{\"type\": \"string\", \"pattern\": \"^a\"}"),
             std::string("/pattern | /pattern: the keyword 'pattern' is not supported by constrained decoding"));
    QCOMPARE(schema_error_path(
                 "{\"type\": \"object\", \"properties\": {\"a/b\": {\"type\": \"number\", \"multipleOf\": 2}}}"),
             std::string("/properties/a~1b/multipleOf | /properties/a~1b/multipleOf: the keyword 'multipleOf' is not "
                         "supported by constrained decoding"));
    QCOMPARE(schema_error_path("{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}"),
             std::string("/required | /required: required property 'b' is not in properties"));
    QCOMPARE(schema_error_path("{\"$ref\": \"#/$defs/missing\"}"),
             std::string("/$ref | /$ref: $ref '#/$defs/missing' does not name a definition of this schema"));
    QCOMPARE(schema_error_path("{\"type\": \"strin\"}"), std::string("/type | /type: unknown type 'strin'"));
    QCOMPARE(schema_error_path("{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}"),
             std::string(" | the bounds leave no number"));
    QCOMPARE(schema_error_path("{\"oneOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}"),
             std::string("/oneOf | /oneOf: only a single-branch oneOf is supported (use anyOf for alternatives)"));
    QVERIFY(schema_error_path("{\"type\": ").rfind(" | the schema is not valid JSON: ", 0) == 0);
    QCOMPARE(schema_error_path(kPersonSchema), std::string("(compiled)"));
    // Nested 100,000 deep: an error, not a stack overflow.
    std::string deep;
    for (int i = 0; i < 100000; ++i) deep += "{\"items\": ";
    deep += "{}" + std::string(100000, '}');
    QVERIFY(schema_error_path(deep).find("the schema nests deeper than 128 levels") != std::string::npos);
  }

  void the_matcher_takes_exactly_the_valid_texts() {
    const JsonGrammar person = kvchat::compile_json_schema(std::string_view(kPersonSchema));
    // Valid: required ones in order, optional ones left out or in, whitespace between tokens, escapes.
    QVERIFY(accepts(person, "{\"name\":\"Ann\",\"age\":42}"));
    QVERIFY(accepts(person, "{ \"name\" : \"Ann\" ,\n  \"age\" : 0, \"tags\": [\"a\", \"b\"] }"));
    QVERIFY(accepts(person, "{\"name\":\"\\u00e9t\\\"é!\",\"age\":150,\"height\":2.5}"));
    QVERIFY(accepts(person, "{\"name\":\"\",\"age\":7,\"tags\":[],\"height\":0.001}"));
    // Invalid.
    QVERIFY(!accepts(person, "{\"age\":42,\"name\":\"Ann\"}"));                            // out of order
    QVERIFY(!accepts(person, "{\"name\":\"Ann\"}"));                                       // age missing
    QVERIFY(!accepts(person, "{\"name\":\"Annabel\",\"age\":1}"));                         // longer than 5
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":151}"));                             // above maximum
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":-1}"));                              // below minimum
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":1,\"x\":1}"));                       // additionalProperties false
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":1.5}"));                             // not an integer
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":1,\"tags\":[\"a\",\"b\",\"a\"]}"));  // maxItems
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":1,\"tags\":[\"c\"]}"));              // not in the enum
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":01}"));                              // leading zero
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":1,\"height\":0}"));                  // exclusiveMinimum
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":1,\"height\":2.51}"));               // maximum
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":1,\"height\":1e0}"));  // a bounded number has no exponent
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"name\":\"B\",\"age\":1}"));  // a key twice
    QVERIFY(!accepts(person, " {\"name\":\"A\",\"age\":1}"));                // nothing before the value
    QVERIFY(!accepts(person, "{\"name\":\"A\",\"age\":1} "));                // nor after it

    const JsonGrammar object = kvchat::any_json_object_grammar();
    QVERIFY(accepts(object, "{\"a\":[1,2.5e3,-0.5,true,null,{\"b\":\"c\"}],\"a2\":{}}"));
    QVERIFY(accepts(object, "{}"));
    QVERIFY(!accepts(object, "[1]"));
    QVERIFY(!accepts(object, "\"text\""));
    QVERIFY(!accepts(object, "{\"a\":tru}"));
    QVERIFY(!accepts(object, "{\"a\":1,}"));
    QVERIFY(!accepts(object, "{\"a\" 1}"));
    QVERIFY(!accepts(object, "{\"a\":\"\\ud800\"}"));       // a lone surrogate escape
    QVERIFY(!accepts(object, "{\"a\":\"\x01\"}"));          // a control character
    QVERIFY(!accepts(object, "{\"a\":\"\xC0\xAF\"}"));      // an overlong UTF-8 form
    QVERIFY(!accepts(object, "{\"a\":\"\xED\xA0\x80\"}"));  // a surrogate in UTF-8
    QVERIFY(!accepts(object, "{\"a\":1.}"));
    QVERIFY(!accepts(object, "{\"a\":1234567890123456}"));  // 16 integer digits
    QVERIFY(accepts(object, "{\"a\":123456789012345}"));

    // Whitespace runs are bounded.
    QVERIFY(accepts(object, "{" + std::string(JsonMatcher::kMaxWhitespaceRun, ' ') + "}"));
    QVERIFY(!accepts(object, "{" + std::string(JsonMatcher::kMaxWhitespaceRun + 1, ' ') + "}"));
    // One line break a run: pretty-printed JSON, not blank lines.
    QVERIFY(accepts(object, "{\n  \"a\": [\n    1,\n    2\n  ]\n}"));
    QVERIFY(!accepts(object, "{\n\n  \"a\": 1}"));
    QVERIFY(!accepts(object, "{\"a\": 1\n \n}"));

    // Literal text around the value (a tool call's tags).
    JsonGrammar tagged = kvchat::compile_json_schema(std::string_view("{\"enum\": [1, \"two\", null]}"));
    tagged.prefix = "<call>";
    tagged.suffix = "</call>";
    QVERIFY(accepts(tagged, "<call>\"two\"</call>"));
    QVERIFY(accepts(tagged, "<call>1</call>"));
    QVERIFY(!accepts(tagged, "<call>2</call>"));
    QVERIFY(!accepts(tagged, "<call>1"));
    JsonMatcher partial(tagged);
    QVERIFY(partial.advance("<call>nu"));
    QVERIFY(!partial.complete());

    // Branches, each its own text around its own value (one per function whose name is outside the JSON).
    const JsonGrammar functions = joined_functions();
    QCOMPARE(functions.branch_count(), 3);
    QVERIFY(accepts(functions, "<function=get_time>{\"zone\": \"UTC\"}</function>"));
    QVERIFY(accepts(functions, "<function=get>[true]</function>"));
    QVERIFY(accepts(functions, "<function=get_weather>{\"city\": \"Paris\", \"days\": 3}</function>"));
    QVERIFY(!accepts(functions, "<function=get_time>{\"city\": \"Paris\", \"days\": 3}</function>"));
    QVERIFY(!accepts(functions, "<function=get_weather>{\"zone\": \"UTC\"}</function>"));
    QVERIFY(!accepts(functions, "<function=get>{\"zone\": \"UTC\"}</function>"));
    QVERIFY(!accepts(functions, "<function=get_date>{}</function>"));
    QVERIFY(!accepts(functions, "<function=get_time>{\"zone\": \"UTC\"}"));
    JsonMatcher shared_prefix(functions);
    QVERIFY(shared_prefix.advance("<function=get"));
    QVERIFY(!shared_prefix.complete());
    QVERIFY(shared_prefix.advance(">[tr"));
    QVERIFY(!JsonMatcher(shared_prefix).advance("_"));
  }

  void recursive_references_and_nullable_values() {
    const JsonGrammar tree = kvchat::compile_json_schema(
        std::string_view("{"
                         "      \"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {"
                         "        \"label\": {\"type\": [\"string\", \"null\"]},"
                         "        \"children\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/node\"}}}, "
                         "\"required\": [\"label\"]}},"
                         "      \"$ref\": \"#/$defs/node\"}"));
    QVERIFY(accepts(tree, "{\"label\":\"root\",\"children\":[{\"label\":null},{\"label\":\"x\",\"children\":[]}]}"));
    QVERIFY(!accepts(tree, "{\"label\":\"root\",\"children\":[{\"children\":[]}]}"));
    QVERIFY(!accepts(tree, "{\"label\":3}"));
  }

  // Every text a random walk completes parses as JSON and is valid for an independent validator.
  void texts_the_matcher_completes_are_valid_for_random_schemas() {
    std::mt19937 random(20261206);
    int completed = 0;
    for (int schema_index = 0; schema_index < 60; ++schema_index) {
      const ordered_json schema = kvchat::test::random_schema(random);
      const JsonGrammar grammar = kvchat::compile_json_schema(schema);
      for (int walk = 0; walk < 5; ++walk) {
        const std::string text = random_text(grammar, random);
        if (text.empty()) continue;
        ++completed;
        ordered_json value;
        try {
          value = ordered_json::parse(text);
        } catch (const std::exception& error) {
          QFAIL(qPrintable(QString::fromStdString("not JSON: " + text + " for " + schema.dump())));
        }
        const std::string violation = kvchat::test::schema_violation(schema, value);
        if (!violation.empty())
          QFAIL(qPrintable(QString::fromStdString(violation + ": " + text + " for " + schema.dump())));
      }
    }
    QVERIFY2(completed >= 250, qPrintable(QString::number(completed)));
  }

  // The trie walk and the plain-string shortcut allow exactly the tokens whose bytes the matcher takes.
  void the_token_mask_equals_a_brute_force_check() {
    std::vector<std::string> tokens;
    for (int byte = 0; byte < 256; ++byte) tokens.emplace_back(1, static_cast<char>(byte));
    for (const char* fragment :
         {"{\"", "\":",   "\", \"", "\"}",   "name",     " \"",  "true",      "null",  "false",    "123",
          ".5",  "\n",    "\\n",    "\\\"",  "é",        "\xC3", "\xA9\"",    "  ",    "},{",      "[]",
          "\"]", "\":\"", "red",    "green", "\"red\"",  "dark", " \\\"blue", "\\u00", "e9",       "-0",
          "0.",  "1e",    "tags",   "age",   "\"age\":", "ok0",  "score1\":", "日本",  "\xE6\x97", "\t\n"})
      tokens.emplace_back(fragment);
    std::mt19937 random(7);
    for (int i = 0; i < 400; ++i) {  // random fragments of JSON-ish characters
      static const std::string alphabet = "abc{}[]\":, 0123456789.-e\\n\xC3\xA9";
      std::string token;
      for (int length = 1 + static_cast<int>(random() % 6); length > 0; --length)
        token += alphabet[random() % alphabet.size()];
      tokens.push_back(token);
    }
    std::vector<bool> usable(tokens.size(), true);
    usable[300] = false;      // a special token is never allowed
    tokens.emplace_back("");  // an id without bytes
    usable.push_back(true);

    std::vector<std::shared_ptr<const JsonGrammar>> grammars = {
        std::make_shared<const JsonGrammar>(kvchat::compile_json_schema(std::string_view(kPersonSchema))),
        std::make_shared<const JsonGrammar>(kvchat::any_json_object_grammar()),
        std::make_shared<const JsonGrammar>(joined_functions())};
    for (int i = 0; i < 12; ++i)
      grammars.push_back(
          std::make_shared<const JsonGrammar>(kvchat::compile_json_schema(kvchat::test::random_schema(random))));
    int walks = 0;
    for (const auto& grammar : grammars)
      for (int walk = 0; walk < 3; ++walk, ++walks) compare_masks(grammar, tokens, usable, random, 60);
    QCOMPARE(walks, 45);

    // A whole reply takes nothing more: no token is allowed after it.
    auto vocabulary = std::make_shared<const ConstraintVocabulary>(tokens, usable);
    TokenConstraint whole(grammars[1], vocabulary);
    QVERIFY(whole.accept(static_cast<TokenId>('{')));
    QVERIFY(whole.accept(static_cast<TokenId>('}')));
    QVERIFY(whole.complete());
    for (std::uint64_t word : whole.allowed()) QCOMPARE(word, std::uint64_t{0});
  }

  // The same on a real 128k-token vocabulary (byte-level BPE, whose tokens hold partial UTF-8 characters).
  void the_token_mask_on_llama3s_vocabulary() {
    const std::string directory = kvchat::test::shared_path("fixtures/tokenizers/llama3");
    if (!QFileInfo::exists(QString::fromStdString(directory + "/tokenizer.json"))) QSKIP("no Llama 3 tokenizer");
    const kvchat::Tokenizer tokenizer = kvchat::Tokenizer::from_directory(directory);
    const std::vector<std::string> tokens = tokenizer.token_bytes();
    QCOMPARE(static_cast<int>(tokens.size()), tokenizer.vocab_size());
    QCOMPARE(tokens[static_cast<std::size_t>(tokenizer.encode(" hello", false).at(0))], std::string(" hello"));
    std::vector<bool> usable(tokens.size());
    for (std::size_t id = 0; id < tokens.size(); ++id) usable[id] = !tokenizer.is_special(static_cast<TokenId>(id));
    std::mt19937 random(11);
    const auto person =
        std::make_shared<const JsonGrammar>(kvchat::compile_json_schema(std::string_view(kPersonSchema)));
    const std::string text = compare_masks(person, tokens, usable, random, 12);
    QVERIFY2(!text.empty(), "no token was allowed");
  }
};

KVCHAT_TEST_APPLESS_MAIN(JsonConstraintTest)

}  // namespace text_test_json_constraint

#include "test_json_constraint.moc"
