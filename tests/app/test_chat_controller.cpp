// ChatController with a real store, real settings file and the engine thread on stories260K (greedy):
// send/stream/save, stop keeps the partial reply, regenerate, edit-and-resend, conversation management,
// the context cut marker, the cache gauge, export.
#include <QtTest>
#include "common/test_suite.h"

#include <QDir>
#include <QFile>
#include <QJsonObject>
#include <QSettings>
#include <QSignalSpy>
#include <QTemporaryDir>

#include <memory>

#include "app/chat/chat_controller.h"
#include "app/store/chat_history.h"
#include "app/store/message_stats_json.h"
#include "common/chat_fixture.h"
#include "common/test_paths.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_chat_controller {

using kvchat::KvCacheMode;
using kvchat::StopReason;
using kvchat::app::BackendHost;
using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::app::MessageRecord;

namespace {

ChatSettings greedy_settings() {
  ChatSettings settings;
  settings.temperature = 0.0;
  settings.repetition_penalty = 1.0;
  settings.max_new_tokens = 40;
  settings.model_path = kvchat::test::stories_model_directory();
  settings.threads = 1;
  return settings;
}

}  // namespace

class ChatControllerTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void init();
  void cleanup();
  void send_streams_and_saves_the_reply();
  void stop_keeps_the_partial_reply();
  void regenerate_keeps_the_replaced_reply_as_an_alternative();
  void edit_last_message_reuses_the_common_prefix();
  void conversations_new_rename_delete();
  void context_cut_leaves_a_marker();
  void export_writes_the_conversation();
  void closing_mid_reply_saves_it();
  void opened_model_directory_is_remembered();
  void the_long_context_setting_opens_the_model_again();

 private:
  void make_controller(const ChatSettings& settings);
  bool wait_idle();
  QList<MessageRecord> messages() const { return controller_->currentMessages(); }

  std::unique_ptr<QTemporaryDir> dir_;
  std::unique_ptr<QSettings> ini_;
  std::unique_ptr<ChatController> controller_;
};

void ChatControllerTest::init() {
  dir_ = std::make_unique<QTemporaryDir>();
  ini_ = std::make_unique<QSettings>(dir_->filePath("kvchat.ini"), QSettings::IniFormat);
}

void ChatControllerTest::cleanup() {
  controller_.reset();
  ini_.reset();
  dir_.reset();
}

void ChatControllerTest::make_controller(const ChatSettings& settings) {
  settings.save(*ini_);
  ini_->sync();
  controller_ = std::make_unique<ChatController>(dir_->filePath("chats.sqlite3"), ini_.get());
  QSignalSpy loaded(&controller_->backendHost(), &BackendHost::modelLoaded);
  controller_->loadModel(QString());
  QVERIFY(loaded.wait(60000));
}

bool ChatControllerTest::wait_idle() {
  return QTest::qWaitFor([&] { return !controller_->isGenerating(); }, 120000);
}

void ChatControllerTest::send_streams_and_saves_the_reply() {
  make_controller(greedy_settings());
  QString streamed;
  connect(controller_.get(), &ChatController::replyTextAppended, this,
          [&](qint64, qint64, const QString& chunk) { streamed += chunk; });
  QSignalSpy generating(controller_.get(), &ChatController::generatingChanged);
  QVERIFY(controller_->send("Once upon a time"));
  QVERIFY(controller_->isGenerating());
  QVERIFY(wait_idle());
  QCOMPARE(generating.count(), 2);

  const auto records = messages();
  QCOMPARE(records.size(), 2);
  QCOMPARE(records[0].role, kvchat::app::MessageRole::User);
  QCOMPARE(records[0].text, QStringLiteral("Once upon a time"));
  QCOMPARE(records[1].role, kvchat::app::MessageRole::Assistant);
  QVERIFY(records[1].complete);
  QVERIFY(!records[1].text.isEmpty());
  QCOMPARE(records[1].text, streamed);
  QCOMPARE(records[1].model, QStringLiteral("stories260K"));
  QCOMPARE(records[1].settings.value("temperature").toDouble(), 0.0);
  const auto stats = kvchat::app::stats_from_json(records[1].stats);
  QCOMPARE(stats.generated_tokens, 40);
  QCOMPARE(stats.stop_reason, StopReason::MaxTokens);

  QVERIFY(controller_->lastReplyStats());
  QCOMPARE(controller_->lastReplyStats()->generated_tokens, 40);
  const auto gauge = controller_->cacheGauge();
  QCOMPARE(gauge.conversation_tokens, stats.cache_tokens);
  QCOMPARE(gauge.conversation_bytes, stats.cache_bytes);
  QCOMPARE(gauge.total_bytes, stats.cache_bytes);
  QCOMPARE(gauge.context_limit, 512);  // stories260K's max_position_embeddings
  QCOMPARE(gauge.prefilled_tokens, stats.prompt_tokens);
  QCOMPARE(controller_->conversations().first().title, QStringLiteral("Once upon a time"));
}

void ChatControllerTest::stop_keeps_the_partial_reply() {
  ChatSettings settings = greedy_settings();
  settings.max_new_tokens = 480;
  settings.kv_cache_enabled = false;  // slow on purpose (every token recomputes the chat): time to stop it
  make_controller(settings);
  QString streamed;
  connect(controller_.get(), &ChatController::replyTextAppended, this, [&](qint64, qint64, const QString& chunk) {
    streamed += chunk;
    controller_->stop();
  });
  QVERIFY(controller_->send("Once upon a time"));
  QVERIFY(wait_idle());
  const auto records = messages();
  QCOMPARE(records.size(), 2);
  QVERIFY(records[1].complete);
  QCOMPARE(records[1].text, streamed);
  const auto stats = kvchat::app::stats_from_json(records[1].stats);
  QCOMPARE(stats.stop_reason, StopReason::Stopped);
  QVERIFY(stats.generated_tokens < 480);
  QCOMPARE(stats.cache_mode, KvCacheMode::Off);

  // The chat goes on from the partial reply.
  QVERIFY(controller_->send("Lily smiled"));
  QVERIFY(wait_idle());
  QCOMPARE(messages().size(), 4);
  QVERIFY(messages()[3].complete);
}

void ChatControllerTest::regenerate_keeps_the_replaced_reply_as_an_alternative() {
  make_controller(greedy_settings());
  QVERIFY(controller_->send("Tom had a red ball"));
  QVERIFY(wait_idle());
  const auto before = messages();
  QVERIFY(controller_->regenerate());
  QVERIFY(wait_idle());
  const auto after = messages();
  QCOMPARE(after.size(), 3);
  QCOMPARE(after[0].id, before[0].id);
  QCOMPARE(after[1].id, before[1].id);  // kept, hidden
  QVERIFY(kvchat::app::is_hidden_alternative(after[1]));
  QVERIFY(!kvchat::app::is_hidden_alternative(after[2]));
  QCOMPARE(after[2].text, before[1].text);  // greedy: the same reply again
  const auto stats = kvchat::app::stats_from_json(after[2].stats);
  QVERIFY2(stats.reused_tokens >= stats.prompt_tokens - 1, "the prompt is still cached");
  QCOMPARE(kvchat::app::reply_alternatives(after, after[2].id), (QList<qint64>{after[1].id, after[2].id}));
  // The model is given the shown reply only.
  QCOMPARE(controller_->engineMessages(controller_->currentConversationId()).size(), size_t{2});

  // Switching back shows (and sends) the first one.
  ChatSettings sampled = controller_->settings();
  sampled.max_new_tokens = 5;  // a third, different reply
  controller_->applySettings(sampled);
  QVERIFY(controller_->regenerate());
  QVERIFY(wait_idle());
  const auto three = messages();
  QCOMPARE(kvchat::app::reply_alternatives(three, three[3].id).size(), 3);
  QSignalSpy reset(controller_.get(), &ChatController::messagesReset);
  QVERIFY(controller_->showAlternative(three[1].id));
  QCOMPARE(reset.count(), 1);
  const auto shown = messages();
  QVERIFY(!kvchat::app::is_hidden_alternative(shown[1]));
  QVERIFY(kvchat::app::is_hidden_alternative(shown[2]));
  QVERIFY(kvchat::app::is_hidden_alternative(shown[3]));
  const auto engine = controller_->engineMessages(controller_->currentConversationId());
  QCOMPARE(QString::fromStdString(engine.back().content), before[1].text);
  QVERIFY(!controller_->showAlternative(shown[0].id));  // a user message has no alternatives
}

void ChatControllerTest::edit_last_message_reuses_the_common_prefix() {
  make_controller(greedy_settings());
  QVERIFY(controller_->send("Once upon a time"));
  QVERIFY(wait_idle());
  const auto first_stats = kvchat::app::stats_from_json(messages()[1].stats);
  QVERIFY(controller_->send("Lily went to the park"));
  QVERIFY(wait_idle());
  QCOMPARE(messages().size(), 4);

  QVERIFY(controller_->editLastUserMessage("Tom ran home"));
  QVERIFY(wait_idle());
  const auto records = messages();
  QCOMPARE(records.size(), 4);
  QCOMPARE(records[2].role, kvchat::app::MessageRole::User);
  QCOMPARE(records[2].text, QStringLiteral("Tom ran home"));
  const auto stats = kvchat::app::stats_from_json(records[3].stats);
  // Everything before the edited message stays cached (the first turn's prompt and every token of its
  // reply, the last one fed by the second turn); only the edit is prefilled.
  QCOMPARE(first_stats.stop_reason, StopReason::MaxTokens);
  QCOMPARE(stats.reused_tokens, first_stats.prompt_tokens + first_stats.generated_tokens);
  QVERIFY(stats.prefilled_tokens < 10);
}

void ChatControllerTest::conversations_new_rename_delete() {
  make_controller(greedy_settings());
  const qint64 first = controller_->newConversation();
  QVERIFY(controller_->send("Once upon a time"));
  QVERIFY(wait_idle());
  const qint64 second = controller_->newConversation();
  QCOMPARE(controller_->currentConversationId(), second);
  QVERIFY(controller_->currentMessages().isEmpty());
  QCOMPARE(controller_->conversations().first().id, second);  // most recent first

  controller_->renameConversation(first, "  Stories  ");
  QCOMPARE(controller_->conversation(first)->title, QStringLiteral("Stories"));
  controller_->selectConversation(first);
  QCOMPARE(controller_->currentMessages().size(), 2);
  QVERIFY(controller_->cacheGauge().conversation_tokens > 0);

  // Deleting the conversation being generated stops the turn and writes nothing more.
  QVERIFY(controller_->send("Lily smiled"));
  controller_->deleteConversation(first);
  QVERIFY(!controller_->isGenerating());
  QVERIFY(!controller_->conversation(first));
  QCOMPARE(controller_->currentConversationId(), second);
  QCOMPARE(controller_->cacheGauge().total_bytes, qint64(0));
  QTest::qWait(200);  // late signals of the deleted turn arrive and are dropped
  QCOMPARE(controller_->conversations().size(), 1);
  QVERIFY(controller_->send("The dog"));
  QVERIFY(wait_idle());
  QCOMPARE(controller_->currentMessages().size(), 2);
}

void ChatControllerTest::context_cut_leaves_a_marker() {
  ChatSettings settings = greedy_settings();
  settings.context_limit = 96;
  settings.context_overflow = kvchat::app::ContextOverflowPolicy::DropOldestTurns;
  settings.max_new_tokens = 24;
  make_controller(settings);
  const char* lines[] = {"Once upon a time", "Lily went to the park", "Tom saw a big dog", "The sun was hot",
                         "They ate cake"};
  for (const char* line : lines) {
    QVERIFY(controller_->send(line));
    QVERIFY(wait_idle());
  }
  const auto records = messages();
  const MessageRecord* marker = nullptr;
  for (const auto& record : records)
    if (record.role == kvchat::app::MessageRole::Marker) marker = &record;
  QVERIFY2(marker, "the chat outgrew 96 tokens: a cut must be recorded");
  const qint64 first_kept = marker->settings.value(kvchat::app::kMarkerContextStartKey).toInteger();
  QVERIFY(first_kept > records.first().id);
  // What the engine gets now starts at the cut.
  const auto engine = controller_->engineMessages(controller_->currentConversationId());
  const auto in_context = kvchat::app::messages_in_context(records);
  QCOMPARE(static_cast<int>(engine.size()), static_cast<int>(in_context.size()));
  QVERIFY(in_context.first().id >= first_kept);
  QCOMPARE(QString::fromStdString(engine.front().content), in_context.first().text);
  // Every reply was produced (none refused).
  for (const auto& record : records)
    if (record.role == kvchat::app::MessageRole::Assistant) QVERIFY(!record.stats.contains("error"));
}

void ChatControllerTest::export_writes_the_conversation() {
  make_controller(greedy_settings());
  QVERIFY(controller_->send("Once upon a time"));
  QVERIFY(wait_idle());
  const QString path = dir_->filePath("chat.md");
  controller_->exportConversation(controller_->currentConversationId(), path, kvchat::app::ExportFormat::Markdown);
  QFile file(path);
  QVERIFY(file.open(QIODevice::ReadOnly));
  const QString text = QString::fromUtf8(file.readAll());
  QVERIFY(text.contains("Once upon a time"));
  QVERIFY(text.contains(messages()[1].text.left(30)));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, controller_->exportConversation(987654, dir_->filePath("x.md"),
                                                                                  kvchat::app::ExportFormat::Markdown));
}

void ChatControllerTest::closing_mid_reply_saves_it() {
  ChatSettings settings = greedy_settings();
  settings.max_new_tokens = 480;
  settings.kv_cache_enabled = false;  // slow on purpose
  make_controller(settings);
  QSignalSpy chunks(controller_.get(), &ChatController::replyTextAppended);
  QVERIFY(controller_->send("Once upon a time"));
  QVERIFY(chunks.wait(60000));
  const qint64 conversation = controller_->currentConversationId();
  controller_.reset();  // as when the window closes mid-reply

  kvchat::app::ConversationStore store(dir_->filePath("chats.sqlite3"), kvchat::app::StoreOpenMode::ReadOnly);
  const auto records = store.messages(conversation);
  QCOMPARE(records.size(), 2);
  QVERIFY(records[1].complete);
  QVERIFY(!records[1].text.isEmpty());
  QCOMPARE(records[1].stats.value("stop_reason").toString(), QStringLiteral("stopped"));
}

KVCHAT_TEST_GUILESS_MAIN(ChatControllerTest)
// File > Open model directory: a directory that loads becomes the settings' model (the next start
// opens it); one that fails leaves both the loaded model and the setting as they were.
void ChatControllerTest::opened_model_directory_is_remembered() {
  make_controller(greedy_settings());
  const QString copy = dir_->filePath("my-model");
  QVERIFY(QDir().mkpath(copy));
  for (const char* file :
       {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    QVERIFY(QFile::copy(QString::fromStdString(kvchat::test::shared_path(std::string("models/stories260K/") + file)),
                        copy + "/" + file));

  const QString configured = greedy_settings().model_path;
  QSignalSpy failed(&controller_->backendHost(), &BackendHost::modelLoadFailed);
  controller_->loadModel(dir_->filePath("no-such-model"), /*remember=*/true);
  QVERIFY(failed.wait(60000));
  ini_->sync();
  QCOMPARE(ChatSettings::load(*ini_).model_path, configured);

  QSignalSpy loaded(&controller_->backendHost(), &BackendHost::modelLoaded);
  controller_->loadModel(copy, /*remember=*/true);
  QVERIFY(loaded.wait(60000));
  ini_->sync();
  QCOMPARE(ChatSettings::load(*ini_).model_path, copy);

  // A plain reload (not chosen by the user) changes nothing.
  controller_->loadModel(QString::fromStdString(kvchat::test::shared_path("models/stories260K")));
  QVERIFY(loaded.wait(60000));
  ini_->sync();
  QCOMPARE(ChatSettings::load(*ini_).model_path, copy);
}

// The long context decides a LongRoPE model's RoPE factors, so every cached key: turning it on or off opens the
// model again (here stories260K, which has no LongRoPE and opens as it is); other settings do not.
void ChatControllerTest::the_long_context_setting_opens_the_model_again() {
  make_controller(greedy_settings());
  QSignalSpy loading(&controller_->backendHost(), &BackendHost::modelLoading);
  QSignalSpy loaded(&controller_->backendHost(), &BackendHost::modelLoaded);
  ChatSettings settings = controller_->settings();
  settings.temperature = 0.5;
  controller_->applySettings(settings);
  QCOMPARE(loading.count(), 0);
  settings.long_context = true;
  controller_->applySettings(settings);
  QCOMPARE(loading.count(), 1);
  QVERIFY(loaded.wait(60000));
  QVERIFY(controller_->backendHost().isModelLoaded());
  ini_->sync();
  QCOMPARE(ChatSettings::load(*ini_).long_context, true);
  settings.long_context = false;
  controller_->applySettings(settings);
  QCOMPARE(loading.count(), 2);
  QVERIFY(loaded.wait(60000));
}

}  // namespace app_test_chat_controller

#include "test_chat_controller.moc"
