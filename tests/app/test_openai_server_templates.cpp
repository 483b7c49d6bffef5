// The chat-template path of `kvchat-cli serve`, on a model in the Llama 3 layout with Llama 3's chat
// template (tests/common/tiny_llama3_chat_model.h): over raw HTTP a 3-turn conversation streams the
// same greedy text as it answers whole, later turns reuse the earlier ones' cache, and the first
// request's reply equals `kvchat-cli generate --messages` on the same conversation (same rendered prompt,
// same ids). Later requests continue the exact ids of the earlier replies rather than re-encoding their
// text (a re-encoding differs: a new text segment gets the tokenizer's prefix space, a sampled special
// token has no text), so their prompts are not a fresh render's. The official `openai` npm client gets
// the same texts. Text a user types never becomes a control token, in the server or in generate.
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>

#include "common/cli_runner.h"
#include "common/openai_npm_package.h"
#include "common/server_process.h"
#include "common/tiny_llama3_chat_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_openai_server_templates {

using kvchat::test::HttpReply;
using kvchat::test::ServerProcess;
using nlohmann::json;

namespace {

constexpr int kEotId = 516;  // <|eot_id|> in the fixture's tokenizer
const char* kModelId = "tiny-llama3-chat";
// The turns and length tests/app/openai_client.mjs uses, so its texts can be compared with these.
const std::vector<std::string> kUserTurns = {"Once upon a time", " The cat said", " Then the dog"};
constexpr int kMaxTokens = 24;

json message(const std::string& role, const std::string& text) { return {{"role", role}, {"content", text}}; }
json chat_request(const std::vector<json>& messages) {
  return {{"model", kModelId}, {"messages", messages}, {"temperature", 0}, {"max_tokens", kMaxTokens}};
}

std::string streamed_text(httplib::Client& client, json body, json* usage) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  std::string text;
  const int status =
      kvchat::test::post_stream(client, "/v1/chat/completions", body.dump(), {}, [&](const std::string& data) {
        if (data == "[DONE]") return true;
        const json chunk = json::parse(data);
        if (chunk.contains("usage") && !chunk["usage"].is_null()) *usage = chunk["usage"];
        if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content"))
          text += chunk["choices"][0]["delta"]["content"].get<std::string>();
        return true;
      });
  return status == 200 ? text : "status " + std::to_string(status);
}

// `kvchat-cli generate --messages` on `messages`, greedy, as JSON.
json generate(const QString& model, const QString& folder, const std::vector<json>& messages) {
  const QString path = folder + "/messages.json";
  kvchat::test::write_file_bytes(path.toStdString(), json(messages).dump());
  const auto result = kvchat::test::run_cli(
      {"generate", "--model", model, "--messages", path, "--max-new-tokens", QString::number(kMaxTokens), "--json"});
  if (result.exit_code != 0) return json{{"error", result.err}};
  return json::parse(result.out);
}

}  // namespace

class TestOpenAiServerTemplates : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir dir_;
  QString model_;
  ServerProcess server_;
  std::vector<std::string> raw_texts_;

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    model_ = QString::fromStdString(kvchat::test::make_tiny_llama3_chat_model(dir_.filePath("model").toStdString()));
    QVERIFY(server_.start({"--model", model_, "--model-id", kModelId, "--threads", "1"}));
  }

  void conversation_over_raw_http_equals_generate() {
    httplib::Client client = server_.client();
    std::vector<json> messages;
    std::vector<int> cached, prompt;
    for (const std::string& turn : kUserTurns) {
      messages.push_back(message("user", turn));
      const HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", chat_request(messages).dump());
      QCOMPARE(whole.status, 200);
      const json body = whole.json();
      const std::string text = body["choices"][0]["message"]["content"];
      QVERIFY2(!text.empty(), whole.body.c_str());
      json usage;
      QCOMPARE(streamed_text(client, chat_request(messages), &usage), text);
      QCOMPARE(usage["completion_tokens"].get<int>(), body["usage"]["completion_tokens"].get<int>());
      cached.push_back(body["usage"]["prompt_tokens_details"]["cached_tokens"]);
      prompt.push_back(body["usage"]["prompt_tokens"]);

      if (messages.size() == 1) {
        const json generated = generate(model_, dir_.path(), messages);
        QVERIFY2(!generated.contains("error"), generated.dump().c_str());
        QCOMPARE(generated["prompt_ids"].size(), std::size_t(prompt.back()));
        QCOMPARE(generated["generated_text"].get<std::string>(), text);
      }
      raw_texts_.push_back(text);
      messages.push_back(message("assistant", text));
    }
    QVERIFY2(cached[1] >= prompt[0] && cached[2] >= prompt[1] && cached[2] > cached[1],
             QString("cached %1 %2 %3, prompts %4 %5 %6")
                 .arg(cached[0])
                 .arg(cached[1])
                 .arg(cached[2])
                 .arg(prompt[0])
                 .arg(prompt[1])
                 .arg(prompt[2])
                 .toUtf8());
  }

  // "<|eot_id|>" typed by a user stays text: the prompt holds exactly the template's own <|eot_id|>s.
  void typed_control_tokens_stay_text() {
    const std::vector<json> messages = {message("system", "Be <|eot_id|> brief."), message("user", "Hi<|eot_id|>")};
    const json generated = generate(model_, dir_.path(), messages);
    QVERIFY2(!generated.contains("error"), generated.dump().c_str());
    const std::vector<int> ids = generated["prompt_ids"];
    QCOMPARE(std::count(ids.begin(), ids.end(), kEotId), std::ptrdiff_t(2));  // one per message, from the template
    httplib::Client client = server_.client();
    json request = chat_request(messages);
    const HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", request.dump());
    QCOMPARE(whole.status, 200);
    QCOMPARE(whole.json()["usage"]["prompt_tokens"].get<std::size_t>(), ids.size());
  }

  // The official client library on the same conversation (npm fetches it into the build folder;
  // without node, npm or the registry, skipped).
  void official_openai_npm_client() {
    QVERIFY2(raw_texts_.size() == kUserTurns.size(), "runs after the raw HTTP conversation");
    const QString package_dir = kvchat::test::openai_npm_package_dir();
    if (const QString unavailable = kvchat::test::install_openai_npm_package(); !unavailable.isEmpty())
      QSKIP(qPrintable(unavailable));
    QProcess node;
    const char* source = std::getenv("KVCHAT_SOURCE_DIR");
    node.start("node", {QString(source ? source : ".") + "/tests/app/openai_client.mjs", package_dir,
                        QString("http://127.0.0.1:%1/v1").arg(server_.port()), "unused-key", kModelId});
    if (!node.waitForStarted(30000)) QSKIP("node is not installed");
    QVERIFY(node.waitForFinished(300000));
    const std::string out = node.readAllStandardOutput().toStdString();
    QVERIFY2(node.exitCode() == 0, node.readAllStandardError().constData());
    const json result = json::parse(out);
    QCOMPARE(result["whole"]["texts"], json(raw_texts_));
    QCOMPARE(result["streamed"]["texts"], json(raw_texts_));
    for (const char* mode : {"whole", "streamed"}) {
      const json& cached = result[mode]["cached"];
      QVERIFY2(cached[1].get<int>() > 0 && cached[2].get<int>() > cached[1].get<int>(), out.c_str());
    }
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestOpenAiServerTemplates)

}  // namespace app_test_openai_server_templates

#include "test_openai_server_templates.moc"
