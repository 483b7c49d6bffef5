// A chat's own generation settings on stories260K: a chat on the "Precise" preset samples greedily while
// another follows the global settings, a stop text cuts the stored reply exactly, the settings survive
// reopening the database and go with the chat's JSON export; user presets are saved in the settings file.
#include <QtTest>
#include "common/test_suite.h"

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QSignalSpy>

#include "app/chat/generation_preset.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "common/chat_fixture.h"
#include "common/json_schema_testing.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_chat_generation_settings {

using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::app::GenerationPreset;
using kvchat::app::MessageRecord;
using kvchat::test::ChatFixture;
using kvchat::test::greedy_chat_settings;

class ChatGenerationSettingsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void a_precise_chat_samples_greedily_while_another_follows_the_global_settings();
  void a_stop_text_cuts_the_stored_reply_exactly();
  void user_presets_are_kept_and_built_in_names_refused();
  void unreadable_chat_settings_fall_back_to_the_global_ones();
  void a_json_chat_replies_valid_against_its_schema();
};

namespace {

GenerationPreset preset_named(const QString& name) {
  for (const GenerationPreset& preset : kvchat::app::built_in_presets())
    if (preset.name == name) return preset;
  return {};
}

// Sends `text` in a new chat and returns its reply as saved.
MessageRecord reply_in_new_chat(ChatFixture& fixture, const QString& text,
                                const std::optional<GenerationPreset>& own = std::nullopt) {
  ChatController* controller = fixture.controller();
  const qint64 chat = controller->newConversation();
  if (own) controller->setChatGenerationSettings(chat, own);
  [&] { QVERIFY(controller->send(text)); }();
  [&] { QVERIFY(fixture.waitIdle()); }();
  return controller->currentMessages().last();
}

}  // namespace

void ChatGenerationSettingsTest::a_precise_chat_samples_greedily_while_another_follows_the_global_settings() {
  ChatFixture fixture;
  ChatSettings settings = greedy_chat_settings(24);
  settings.temperature = 1.5;
  settings.seed = 7;
  QVERIFY(fixture.open(settings));
  ChatController* controller = fixture.controller();

  const MessageRecord precise = reply_in_new_chat(fixture, "Once upon a time", preset_named("Precise"));
  const MessageRecord global = reply_in_new_chat(fixture, "Once upon a time");
  // What each turn was given, as its reply records it.
  QCOMPARE(precise.settings.value("temperature").toDouble(), 0.0);
  QCOMPARE(precise.settings.value("top_k").toInt(), 0);
  QCOMPARE(precise.settings.value("top_p").toDouble(), 1.0);
  QCOMPARE(precise.settings.value("min_p").toDouble(), 0.0);
  QCOMPARE(precise.settings.value("preset").toString(), QStringLiteral("Precise"));
  QCOMPARE(precise.settings.value("max_new_tokens").toInt(), 24);  // the preset leaves max tokens to the global one
  QCOMPARE(global.settings.value("temperature").toDouble(), 1.5);
  QCOMPARE(global.settings.value("top_k").toInt(), 40);
  QVERIFY(!global.settings.contains("preset"));
  QCOMPARE(controller->turnSettings(precise.conversation_id).temperature, 0.0);
  QCOMPARE(controller->turnSettings(global.conversation_id).temperature, 1.5);

  // And what the engine did with it: the Precise chat's reply is the greedy one, which a chat following
  // global settings of temperature 0 gets too; at 1.5 the reply differs.
  ChatSettings greedy = controller->settings();
  greedy.temperature = 0.0;
  controller->applySettings(greedy);
  const MessageRecord greedy_global = reply_in_new_chat(fixture, "Once upon a time");
  QCOMPARE(greedy_global.settings.value("temperature").toDouble(), 0.0);
  QVERIFY(!precise.text.isEmpty());
  QCOMPARE(precise.text, greedy_global.text);
  QVERIFY2(global.text != precise.text, qPrintable(global.text));

  // Back to the global settings: the chat follows them again.
  controller->setChatGenerationSettings(precise.conversation_id, std::nullopt);
  QVERIFY(!controller->chatGenerationSettings(precise.conversation_id));
  QCOMPARE(fixture.controller()->conversation(precise.conversation_id)->generation_settings, QJsonObject());
}

void ChatGenerationSettingsTest::a_stop_text_cuts_the_stored_reply_exactly() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(40)));
  ChatController* controller = fixture.controller();
  const MessageRecord whole = reply_in_new_chat(fixture, "Once upon a time");
  // A stop text from the middle of the greedy reply: the same reply with it stops just before it.
  const QString stop = whole.text.mid(whole.text.size() / 2, 4);
  QVERIFY2(stop.size() == 4 && whole.text.indexOf(stop) > 0, qPrintable(whole.text));
  const QString expected = whole.text.left(whole.text.indexOf(stop));
  QCOMPARE(whole.text,
           QStringLiteral(", there was a little girl named Lily. She loved to play outside in the park. One "
                          "day, she saw a big, red ball."));
  QCOMPARE(stop, QStringLiteral(" out"));
  QCOMPARE(expected, QStringLiteral(", there was a little girl named Lily. She loved to play"));

  GenerationPreset own = preset_named("Precise");
  own.stop_texts = QStringList{QStringLiteral("never in a story \u00e9"), stop};
  const qint64 chat = controller->newConversation();
  controller->setChatGenerationSettings(chat, own);
  QString streamed;
  connect(controller, &ChatController::replyTextAppended, this,
          [&](qint64, qint64, const QString& chunk) { streamed += chunk; });
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  const MessageRecord cut = controller->currentMessages().last();
  QCOMPARE(cut.text, expected);
  QCOMPARE(streamed, expected);  // the window never showed the stop text either
  QCOMPARE(cut.stats.value("stop_reason").toString(), QStringLiteral("eos"));
  QCOMPARE(cut.stats.value(kvchat::app::kReplyStopTextKey).toBool(), true);
  QVERIFY(!kvchat::app::is_continuable_reply(cut));
  QVERIFY(cut.token_ids.empty());  // the ids went past the cut: the next prompt encodes the text
  QCOMPARE(cut.settings.value("stop").toArray(), QJsonArray::fromStringList(own.stop_texts));
  QCOMPARE(cut.settings.value("preset").toString(), QStringLiteral("Precise"));
  // The chat goes on from the text kept.
  const auto engine = controller->engineMessages(chat);
  QCOMPARE(QString::fromStdString(engine.back().content), expected);

  // Exported with the chat.
  const QString export_path = fixture.path("chat.json");
  controller->exportConversation(chat, export_path, kvchat::app::ExportFormat::Json);
  QFile exported(export_path);
  QVERIFY(exported.open(QIODevice::ReadOnly));
  const QJsonObject root = QJsonDocument::fromJson(exported.readAll()).object();
  QCOMPARE(root.value("generation_settings").toObject(), own.to_json());
  QCOMPARE(root.value("generation_settings").toObject().value("stop").toArray().at(1).toString(), stop);

  // Reopened: the chat keeps its settings, the other chat has none.
  QVERIFY(fixture.restart());
  const std::optional<GenerationPreset> reopened = fixture.controller()->chatGenerationSettings(chat);
  QVERIFY(reopened);
  QCOMPARE(reopened->name, QStringLiteral("Precise"));
  QCOMPARE(reopened->temperature, 0.0);
  QCOMPARE(reopened->stop_texts, own.stop_texts);
  QVERIFY(!fixture.controller()->chatGenerationSettings(whole.conversation_id));
}

void ChatGenerationSettingsTest::user_presets_are_kept_and_built_in_names_refused() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(8)));
  ChatController* controller = fixture.controller();
  QSignalSpy errors(controller, &ChatController::errorOccurred);
  GenerationPreset mine = preset_named("Creative");
  mine.name = QStringLiteral("  Short stories ");
  mine.max_new_tokens = 64;
  mine.stop_texts = QStringList{QStringLiteral("The end")};
  QVERIFY(controller->saveUserPreset(mine));
  GenerationPreset clash = mine;
  clash.name = QStringLiteral("precise");
  QVERIFY(!controller->saveUserPreset(clash));
  QCOMPARE(errors.count(), 1);
  QCOMPARE(errors.first().first().toString(),
           QStringLiteral("\u201cPrecise\u201d is a built-in preset: choose another name."));
  QVERIFY(fixture.restart());
  const QList<GenerationPreset> presets = fixture.controller()->presets();
  QStringList names;
  for (const GenerationPreset& preset : presets) names << preset.name;
  QCOMPARE(names, (QStringList{"Precise", "Balanced", "Creative", "Short stories"}));
  QCOMPARE(presets[3].max_new_tokens, 64);
  QCOMPARE(presets[3].stop_texts, QStringList{QStringLiteral("The end")});
  QCOMPARE(presets[3].temperature, 1.1);
  fixture.controller()->removeUserPreset(QStringLiteral("Short stories"));
  QCOMPARE(fixture.controller()->presets().size(), 3);
}

void ChatGenerationSettingsTest::unreadable_chat_settings_fall_back_to_the_global_ones() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(8)));
  const qint64 chat = fixture.controller()->newConversation();
  fixture.close();
  {
    kvchat::app::ConversationStore store(fixture.databasePath());
    store.set_generation_settings(chat, QJsonObject{{"preset", "Odd"}, {"temperature", "hot"}});
  }
  QVERIFY(fixture.restart());
  QVERIFY(!fixture.controller()->chatGenerationSettings(chat));
  QCOMPARE(fixture.controller()->turnSettings(chat).temperature, 0.0);
  bool thrown = false;
  try {
    GenerationPreset::from_json(QJsonObject{{"temperature", "hot"}});
  } catch (const std::invalid_argument& error) {
    thrown = true;
    QCOMPARE(QString::fromUtf8(error.what()), QStringLiteral("generation settings: 'temperature' is not a number"));
  }
  QVERIFY(thrown);
}

namespace {

// Three properties in an order that is not alphabetical: the reply writes them in the schema's order.
const char* const kPersonSchema =
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},)"
    R"( "age": {"type": "integer", "minimum": 0, "maximum": 120}, "mood": {"enum": ["happy", "sad"]}},)"
    R"( "required": ["name", "age", "mood"], "additionalProperties": false})";

}  // namespace

// A chat set to reply in JSON against a schema: its replies, greedy and sampled, parse, are valid against the
// schema and keep its property order, and record the format in their settings; the format stays with the chat
// (a reopened store, its JSON export) and shows on the chat's settings button. A schema the constraint cannot
// take is refused saying why, and nothing changes. Continue is refused for a JSON reply cut short. Back to free
// text, the reply is the unconstrained greedy one.
void ChatGenerationSettingsTest::a_json_chat_replies_valid_against_its_schema() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(160)));
  ChatController* controller = fixture.controller();
  const MessageRecord free_text = reply_in_new_chat(fixture, "Once upon a time");

  kvchat::app::ReplyFormat format;
  format.kind = kvchat::app::ReplyFormat::Kind::JsonSchema;
  format.schema = QString::fromLatin1(kPersonSchema);
  const qint64 chat = controller->newConversation();
  QCOMPARE(controller->setChatReplyFormat(chat, format), QString());
  QCOMPARE(controller->chatReplyFormat(chat), format);
  const auto schema = kvchat::test::ordered_json::parse(kPersonSchema);
  for (const double temperature : {0.0, 1.3}) {
    ChatSettings settings = controller->settings();
    settings.temperature = temperature;
    settings.seed = 11;
    controller->applySettings(settings);
    QVERIFY(controller->send("Once upon a time"));
    QVERIFY(fixture.waitIdle());
    const MessageRecord reply = controller->currentMessages().last();
    const auto value = kvchat::test::ordered_json::parse(reply.text.toStdString(), nullptr, false);
    QVERIFY2(!value.is_discarded(), qPrintable(reply.text));
    QCOMPARE(QString::fromStdString(kvchat::test::schema_violation(schema, value)), QString());
    std::vector<std::string> keys;
    for (const auto& item : value.items()) keys.push_back(item.key());
    QCOMPARE(keys, (std::vector<std::string>{"name", "age", "mood"}));
    QCOMPARE(reply.stats.value("stop_reason").toString(), QStringLiteral("eos"));
    QCOMPARE(reply.settings.value("reply_format").toObject(), format.to_json());
  }

  // Refused, saying why; the chat keeps its format.
  kvchat::app::ReplyFormat refused = format;
  refused.schema = QStringLiteral(R"({"type": "string", "pattern": "^a"})");
  QCOMPARE(controller->setChatReplyFormat(chat, refused),
           QStringLiteral("/pattern: the keyword 'pattern' is not supported by constrained decoding"));
  refused.schema = QStringLiteral("{\"type\": ");
  QVERIFY(controller->setChatReplyFormat(chat, refused).startsWith(QStringLiteral("the schema is not valid JSON: ")));
  QCOMPARE(controller->chatReplyFormat(chat), format);

  // Kept with the chat: the store, its JSON export.
  {
    kvchat::app::ConversationStore reader(fixture.databasePath(), kvchat::app::StoreOpenMode::ReadOnly);
    QCOMPARE(reader.conversation(chat)->reply_format, format.to_json());
  }
  const QString export_path = fixture.path("json-chat.json");
  controller->exportConversation(chat, export_path, kvchat::app::ExportFormat::Json);
  QFile exported(export_path);
  QVERIFY(exported.open(QIODevice::ReadOnly));
  QCOMPARE(QJsonDocument::fromJson(exported.readAll()).object().value("reply_format").toObject(), format.to_json());

  // A JSON reply cut short by max tokens cannot be continued into whole JSON: refused, the reply kept as it was.
  ChatSettings short_replies = controller->settings();
  short_replies.temperature = 0.0;
  short_replies.max_new_tokens = 3;
  controller->applySettings(short_replies);
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  const MessageRecord cut = controller->currentMessages().last();
  QCOMPARE(cut.stats.value("stop_reason").toString(), QStringLiteral("max_tokens"));
  QVERIFY(cut.text.startsWith(QLatin1Char('{')));
  QVERIFY(kvchat::app::is_continuable_reply(cut));
  QVERIFY(!controller->continuableReply());
  QSignalSpy errors(controller, &ChatController::errorOccurred);
  QVERIFY(!controller->continueReply());
  QCOMPARE(errors.size(), 1);
  QCOMPARE(errors[0][0].toString(), QStringLiteral("A reply in JSON cannot be continued: regenerate it (or raise max "
                                                   "tokens) to get a whole JSON reply."));
  QCOMPARE(controller->currentMessages().last().text, cut.text);

  // Free text again: the reply is the unconstrained greedy one.
  short_replies.max_new_tokens = 160;
  controller->applySettings(short_replies);
  QCOMPARE(controller->setChatReplyFormat(chat, {}), QString());
  QCOMPARE(controller->conversation(chat)->reply_format, QJsonObject());
  const qint64 free_chat = controller->newConversation();
  Q_UNUSED(free_chat);
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  QCOMPARE(controller->currentMessages().last().text, free_text.text);
  QVERIFY(!controller->currentMessages().last().settings.contains("reply_format"));
}

KVCHAT_TEST_GUILESS_MAIN(ChatGenerationSettingsTest)

}  // namespace app_test_chat_generation_settings

#include "test_chat_generation_settings.moc"
