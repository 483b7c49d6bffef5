// A GGUF file through the desktop app's chat path, end to end, on stories260K-Q8_0.gguf (greedy): the turn
// runner's reply ids equal a greedy generation of the engine's own Session on the same file, the
// controller loads the file from the settings (model_path), reports its architecture, quantization type and
// sizes, streams and saves the same reply, and remembers a file opened by the user like a directory.
#include <QtTest>
#include "common/test_suite.h"

#include <QFileInfo>
#include <QSettings>
#include <QSignalSpy>
#include <QTemporaryDir>

#include <memory>
#include <string>
#include <vector>

#include "app/chat/chat_controller.h"
#include "app/chat/chat_turn_runner.h"
#include "app/store/message_stats_json.h"
#include "common/test_paths.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_gguf_chat {

using kvchat::GenerationResult;
using kvchat::KvCacheMode;
using kvchat::StopReason;
using kvchat::TokenId;
using kvchat::app::BackendHost;
using kvchat::app::ChatController;
using kvchat::app::ChatSettings;

namespace {

const char* kPrompt = "Once upon a time";
constexpr int kMaxNewTokens = 40;

QString gguf_path() { return QString::fromStdString(kvchat::test::shared_path("fixtures/gguf/stories260K-Q8_0.gguf")); }
QString hf_directory() { return QString::fromStdString(kvchat::test::shared_path("models/stories260K")); }

ChatSettings greedy_settings(const QString& model_path) {
  ChatSettings settings;
  settings.temperature = 0.0;
  settings.repetition_penalty = 1.0;
  settings.max_new_tokens = kMaxNewTokens;
  settings.model_path = model_path;
  settings.threads = 1;
  return settings;
}

}  // namespace

class GgufChatTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase();
  void init();
  void cleanup();
  void turn_runner_reply_ids_equal_the_engines_greedy_ids();
  void controller_chats_on_the_gguf_file_from_the_settings();
  void opened_gguf_file_is_remembered();

 private:
  void make_controller(const ChatSettings& settings);

  kvchat::LoadedModel reference_;
  std::vector<TokenId> prompt_;
  GenerationResult expected_;  // the engine's greedy continuation of kPrompt on the file
  std::unique_ptr<QTemporaryDir> dir_;
  std::unique_ptr<QSettings> ini_;
  std::unique_ptr<ChatController> controller_;
};

void GgufChatTest::initTestCase() {
  reference_ = kvchat::load_model(gguf_path().toStdString());
  QCOMPARE(reference_.format, std::string("gguf"));
  QVERIFY(reference_.tokenizer);
  prompt_ = reference_.tokenizer->encode(kPrompt, /*add_special_tokens=*/true, /*parse_special=*/false);
  QCOMPARE(prompt_, (std::vector<TokenId>{1, 403, 407, 261, 378}));  // the file's SPM tokenizer, BOS first
  kvchat::Session session(reference_.model, KvCacheMode::Contiguous);
  kvchat::GenerationConfig config;
  config.max_new_tokens = kMaxNewTokens;
  expected_ = session.generate(prompt_, config);
  QVERIFY(!expected_.generated.empty());
}

void GgufChatTest::init() {
  dir_ = std::make_unique<QTemporaryDir>();
  ini_ = std::make_unique<QSettings>(dir_->filePath("kvchat.ini"), QSettings::IniFormat);
}

void GgufChatTest::cleanup() {
  controller_.reset();
  ini_.reset();
  dir_.reset();
}

void GgufChatTest::make_controller(const ChatSettings& settings) {
  settings.save(*ini_);
  ini_->sync();
  controller_ = std::make_unique<ChatController>(dir_->filePath("chats.sqlite3"), ini_.get());
  QSignalSpy loaded(&controller_->backendHost(), &BackendHost::modelLoaded);
  controller_->loadModel(QString());
  QVERIFY(loaded.wait(60000));
}

// The engine worker runs every turn through ChatTurnRunner: its ids are the reply's ids.
void GgufChatTest::turn_runner_reply_ids_equal_the_engines_greedy_ids() {
  const kvchat::LoadedModel model = kvchat::load_model(gguf_path().toStdString());
  const kvchat::app::ChatTurnRunner runner(model);
  kvchat::Session session(model.model, KvCacheMode::Contiguous);
  kvchat::app::TurnOptions options;
  options.generation.max_new_tokens = kMaxNewTokens;
  options.generation.sampling.temperature = 0.0f;
  std::string streamed;
  const kvchat::app::TurnOutcome outcome =
      runner.run(session, {{"user", kPrompt}}, options, nullptr,
                 [&](const kvchat::app::ReplyProgress& progress) { streamed.append(progress.chunk); });
  QCOMPARE(outcome.prompt_ids, prompt_);
  QCOMPARE(outcome.generated_ids, expected_.generated);
  QCOMPARE(outcome.reply, reference_.tokenizer->decode(expected_.generated, true));
  QCOMPARE(streamed, outcome.reply);
}

void GgufChatTest::controller_chats_on_the_gguf_file_from_the_settings() {
  make_controller(greedy_settings(gguf_path()));
  const auto& info = controller_->backendHost().modelInfo();
  QCOMPARE(info.path, gguf_path());
  QCOMPARE(info.name, QStringLiteral("stories260K-Q8_0.gguf"));
  QCOMPARE(info.architecture, QStringLiteral("llama"));
  QCOMPARE(info.format, QStringLiteral("gguf"));
  QCOMPARE(info.weight_format, QStringLiteral("Q8_0"));
  QCOMPARE(info.file_bytes, QFileInfo(gguf_path()).size());
  QCOMPARE(info.weight_bytes, static_cast<qint64>(reference_.model->weight_bytes()));
  QCOMPARE(info.layers, 5);
  QCOMPARE(info.context_length, 512);
  QVERIFY(!info.has_chat_template);

  QString streamed;
  connect(controller_.get(), &ChatController::replyTextAppended, this,
          [&](qint64, qint64, const QString& chunk) { streamed += chunk; });
  QVERIFY(controller_->send(kPrompt));
  QVERIFY(QTest::qWaitFor([&] { return !controller_->isGenerating(); }, 120000));

  const auto records = controller_->currentMessages();
  QCOMPARE(records.size(), 2);
  QCOMPARE(records[1].role, kvchat::app::MessageRole::Assistant);
  QVERIFY(records[1].complete);
  const QString expected_text = QString::fromStdString(reference_.tokenizer->decode(expected_.generated, true));
  QCOMPARE(records[1].text, expected_text);
  QCOMPARE(streamed, expected_text);
  QCOMPARE(records[1].model, QStringLiteral("stories260K-Q8_0.gguf"));
  QCOMPARE(records[1].settings.value("model_path").toString(), gguf_path());
  const auto stats = kvchat::app::stats_from_json(records[1].stats);
  QCOMPARE(stats.prompt_tokens, static_cast<int>(prompt_.size()));
  QCOMPARE(stats.generated_tokens, static_cast<int>(expected_.generated.size()));
  QCOMPARE(stats.stop_reason, expected_.stats.stop_reason);
}

// File > Open model file: a .gguf file that loads becomes the settings' model_path, as a directory does.
void GgufChatTest::opened_gguf_file_is_remembered() {
  make_controller(greedy_settings(hf_directory()));
  QCOMPARE(controller_->backendHost().modelInfo().format, QStringLiteral("safetensors"));
  QCOMPARE(controller_->backendHost().modelInfo().weight_format, QStringLiteral("f32"));

  QSignalSpy failed(&controller_->backendHost(), &BackendHost::modelLoadFailed);
  const QString not_gguf = dir_->filePath("broken.gguf");
  {
    QFile file(not_gguf);
    QVERIFY(file.open(QIODevice::WriteOnly));
    file.write("not a model");
  }
  controller_->loadModel(not_gguf, /*remember=*/true);
  QVERIFY(failed.wait(60000));
  QVERIFY(failed.first().at(1).toString().contains("GGUF"));
  ini_->sync();
  QCOMPARE(ChatSettings::load(*ini_).model_path, hf_directory());
  QCOMPARE(controller_->backendHost().modelInfo().format, QStringLiteral("safetensors"));  // the old model stays

  QSignalSpy loaded(&controller_->backendHost(), &BackendHost::modelLoaded);
  controller_->loadModel(gguf_path(), /*remember=*/true);
  QVERIFY(loaded.wait(60000));
  QCOMPARE(controller_->backendHost().modelInfo().weight_format, QStringLiteral("Q8_0"));
  ini_->sync();
  QCOMPARE(ChatSettings::load(*ini_).model_path, gguf_path());
}

KVCHAT_TEST_GUILESS_MAIN(GgufChatTest)

}  // namespace app_test_gguf_chat

#include "test_gguf_chat.moc"
