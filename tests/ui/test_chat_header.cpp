// The chat header, offscreen over stories260K: the chat's system prompt shown at the top of the transcript (one
// line, or the whole text expanded; updated when it changes; hidden for a chat without one), and the chat's
// generation settings chosen from the header or Ctrl+Shift+G: a chat on "Precise" replies at temperature 0
// while another follows the global temperature.
#include <QtTest>
#include "common/test_suite.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QToolButton>

#include "common/chat_fixture.h"
#include "ui/chat_generation_dialog.h"
#include "ui/chat_view.h"
#include "ui/elided_label.h"
#include "ui/main_window.h"
#include "ui/message_input.h"
#include "ui/message_widget.h"
#include "ui/system_prompt_block.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_chat_header {

using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::ui::MainWindow;

class ChatHeaderTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void cleanup();
  void the_system_prompt_is_shown_above_the_transcript();
  void a_chat_on_the_precise_preset_replies_greedily();
  void stop_text_lines_read_escapes();
  void a_preset_of_ones_own_is_refused_in_place_and_deleted();
  void a_chat_set_to_json_replies_in_json_and_a_bad_schema_is_refused_in_place();

 private:
  void open_window(const ChatSettings& settings) {
    QVERIFY(fixture_->open(settings));
    window_ = std::make_unique<MainWindow>(controller());
    window_->show();
    QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
    QApplication::setActiveWindow(window_.get());
    QVERIFY(QTest::qWaitForWindowActive(window_.get()));
  }
  void type_and_send(const QString& text) {
    QTest::keyClicks(window_->messageInput(), text);
    QTest::keyClick(window_->messageInput(), Qt::Key_Return);
    QVERIFY(fixture_->waitIdle());
  }
  ChatController* controller() const { return fixture_->controller(); }

  std::unique_ptr<kvchat::test::ChatFixture> fixture_ = std::make_unique<kvchat::test::ChatFixture>();
  std::unique_ptr<MainWindow> window_;
};

void ChatHeaderTest::cleanup() {
  window_.reset();
  fixture_ = std::make_unique<kvchat::test::ChatFixture>();
}

void ChatHeaderTest::the_system_prompt_is_shown_above_the_transcript() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  const qint64 chat = controller()->currentConversationId();
  kvchat::ui::SystemPromptBlock* block = window_->systemPromptBlock();
  QVERIFY(block->isHidden());  // no system prompt: nothing above the messages

  QTest::mouseClick(window_->findChild<QPushButton*>("systemPromptButton"), Qt::LeftButton);
  auto* dialog = window_->findChild<QDialog*>("systemPromptDialog");
  QVERIFY(dialog && dialog->isVisible());
  dialog->findChild<QPlainTextEdit*>("systemPromptEditor")->setPlainText("You tell short stories.\nAbout cats only.");
  dialog->accept();
  QVERIFY(block->isVisible());
  QCOMPARE(block->prompt(), QStringLiteral("You tell short stories.\nAbout cats only."));
  QVERIFY(!block->isExpanded());
  QCOMPARE(block->shownText(), QStringLiteral("You tell short stories. About cats only."));
  QCOMPARE(block->findChild<kvchat::ui::ElidedLabel*>("systemPromptLine")->toolTip(),
           QStringLiteral("You tell short stories.\nAbout cats only."));
  // Above the transcript.
  QVERIFY(block->mapTo(window_.get(), QPoint(0, 0)).y() < window_->chatView()->mapTo(window_.get(), QPoint(0, 0)).y());

  QTest::mouseClick(block->findChild<QToolButton*>("systemPromptToggle"), Qt::LeftButton);
  QVERIFY(block->isExpanded());
  auto* full = block->findChild<QLabel*>("systemPromptFullText");
  QVERIFY(full->isVisible());
  QCOMPARE(full->text(), QStringLiteral("You tell short stories.\nAbout cats only."));
  QCOMPARE(block->shownText(), QStringLiteral("You tell short stories.\nAbout cats only."));

  // Changed elsewhere: the block follows.
  controller()->setSystemPrompt(chat, QStringLiteral("Answer in one line."));
  QCOMPARE(full->text(), QStringLiteral("Answer in one line."));
  // A long prompt is cut on one line when collapsed, whole in its tooltip.
  const QString long_prompt = QString("Tell a story about a cat. ").repeated(30).trimmed();
  controller()->setSystemPrompt(chat, long_prompt);
  QTest::mouseClick(block->findChild<QToolButton*>("systemPromptToggle"), Qt::LeftButton);
  QVERIFY(!block->isExpanded());
  QVERIFY(block->shownText().endsWith(QChar(0x2026)));
  QVERIFY(long_prompt.startsWith(block->shownText().chopped(1)));

  // Another chat without a system prompt hides it; back again, it shows.
  window_->findChild<QPushButton*>("newChatButton")->click();
  QVERIFY(block->isHidden());
  controller()->selectConversation(chat);
  QVERIFY(block->isVisible());
  QCOMPARE(block->prompt(), long_prompt);
}

void ChatHeaderTest::a_chat_on_the_precise_preset_replies_greedily() {
  ChatSettings settings = kvchat::test::greedy_chat_settings(12);
  settings.temperature = 0.8;
  settings.seed = 3;
  open_window(settings);
  type_and_send("Once upon a time");
  const qint64 global_chat = controller()->currentConversationId();
  QPushButton* header = window_->generationSettingsButton();
  QCOMPARE(header->text(), QStringLiteral("Global settings"));

  window_->findChild<QPushButton*>("newChatButton")->click();
  const qint64 precise_chat = controller()->currentConversationId();
  QVERIFY(precise_chat != global_chat);
  // Keyboard: Ctrl+Shift+G opens the chat's settings.
  QTest::keyClick(window_->messageInput(), Qt::Key_G, Qt::ControlModifier | Qt::ShiftModifier);
  auto* dialog = window_->findChild<kvchat::ui::ChatGenerationDialog*>("chatGenerationDialog");
  QVERIFY(dialog && dialog->isVisible());
  auto* follow = dialog->findChild<QCheckBox*>("followGlobalCheck");
  QVERIFY(follow->isChecked());
  auto* presets = dialog->findChild<QComboBox*>("presetCombo");
  QStringList names;
  for (int i = 0; i < presets->count(); ++i) names << presets->itemText(i);
  QCOMPARE(names, (QStringList{"Precise", "Balanced", "Creative", "Custom"}));
  QCOMPARE(presets->currentText(), QStringLiteral("Custom"));  // the global values match no preset
  follow->setFocus();
  QTest::keyClick(follow, Qt::Key_Space);
  QVERIFY(!follow->isChecked());
  presets->setFocus();
  QTest::keyClick(presets, Qt::Key_Home);
  QCOMPARE(presets->currentText(), QStringLiteral("Precise"));
  QCOMPARE(dialog->findChild<QDoubleSpinBox*>("temperatureSpin")->value(), 0.0);
  QCOMPARE(dialog->findChild<QSpinBox*>("topKSpin")->value(), 0);
  QTest::keyClick(dialog, Qt::Key_Return);  // OK
  QVERIFY(!window_->findChild<kvchat::ui::ChatGenerationDialog*>("chatGenerationDialog") || !dialog->isVisible());
  QCOMPARE(header->text(), QStringLiteral("Preset: Precise"));
  QCOMPARE(controller()->chatGenerationSettings(precise_chat)->name, QStringLiteral("Precise"));

  type_and_send("Once upon a time");
  const auto precise_reply = controller()->currentMessages().last();
  QCOMPARE(precise_reply.settings.value("temperature").toDouble(), 0.0);
  QCOMPARE(precise_reply.settings.value("preset").toString(), QStringLiteral("Precise"));
  controller()->selectConversation(global_chat);
  QCOMPARE(header->text(), QStringLiteral("Global settings"));
  type_and_send("Tom saw a dog");
  QCOMPARE(controller()->currentMessages().last().settings.value("temperature").toDouble(), 0.8);

  // Its own stop texts make it "Own settings".
  controller()->selectConversation(precise_chat);
  header->click();
  dialog = window_->findChild<kvchat::ui::ChatGenerationDialog*>("chatGenerationDialog");
  QVERIFY(dialog && dialog->isVisible());
  dialog->findChild<QPlainTextEdit*>("stopTextsEdit")->setPlainText("The end");
  QCOMPARE(dialog->findChild<QComboBox*>("presetCombo")->currentText(), QStringLiteral("Custom"));
  dialog->accept();
  QCOMPARE(header->text(), QStringLiteral("Own settings"));
  QCOMPARE(controller()->chatGenerationSettings(precise_chat)->stop_texts, QStringList{"The end"});
  QCOMPARE(controller()->chatGenerationSettings(precise_chat)->temperature, 0.0);
}

void ChatHeaderTest::stop_text_lines_read_escapes() {
  using kvchat::ui::ChatGenerationDialog;
  QCOMPARE(ChatGenerationDialog::stop_texts_from_lines("\\n\\n\n\nUser:\na\\\\nb"),
           (QStringList{"\n\n", "User:", "a\\nb"}));
  QCOMPARE(ChatGenerationDialog::lines_from_stop_texts({"\n\n", "User:", "a\\nb"}),
           QStringLiteral("\\n\\n\nUser:\na\\\\nb"));
}

// A built-in name is refused inside the dialog; a preset of the user's can be chosen and deleted there.
void ChatHeaderTest::a_preset_of_ones_own_is_refused_in_place_and_deleted() {
  open_window(kvchat::test::greedy_chat_settings(8));
  window_->generationSettingsButton()->click();
  auto* dialog = window_->findChild<kvchat::ui::ChatGenerationDialog*>("chatGenerationDialog");
  QVERIFY(dialog && dialog->isVisible());
  dialog->findChild<QCheckBox*>("followGlobalCheck")->setChecked(false);
  auto* name = dialog->findChild<QLineEdit*>("presetNameEdit");
  auto* problem = dialog->findChild<QLabel*>("presetProblemLabel");
  auto* remove = dialog->findChild<QPushButton*>("deletePresetButton");
  auto* presets = dialog->findChild<QComboBox*>("presetCombo");
  QVERIFY(!remove->isEnabled());
  int errors = 0;
  connect(controller(), &ChatController::errorOccurred, this, [&errors] { ++errors; });
  name->setText(QStringLiteral("precise"));
  dialog->findChild<QPushButton*>("savePresetButton")->click();
  QVERIFY(problem->isVisible());
  QCOMPARE(problem->text(), QStringLiteral("\u201cPrecise\u201d is a built-in preset: choose another name."));
  QCOMPARE(errors, 0);  // said in the dialog, not in the transcript behind it
  QVERIFY(controller()->userPresets().isEmpty());

  dialog->findChild<QDoubleSpinBox*>("temperatureSpin")->setValue(0.3);
  name->setText(QStringLiteral("Calm"));
  QTest::keyClick(name, Qt::Key_Return);
  QVERIFY(!problem->isVisible());
  QCOMPARE(controller()->userPresets().size(), 1);
  QCOMPARE(presets->currentText(), QStringLiteral("Calm"));
  QVERIFY(remove->isEnabled());
  presets->setCurrentIndex(presets->findText(QStringLiteral("Balanced")));
  QVERIFY(!remove->isEnabled());  // a built-in one cannot be deleted
  presets->setCurrentIndex(presets->findText(QStringLiteral("Calm")));
  remove->click();
  QVERIFY(controller()->userPresets().isEmpty());
  QCOMPARE(presets->findText(QStringLiteral("Calm")), -1);
  QCOMPARE(presets->currentText(), QStringLiteral("Custom"));
  QCOMPARE(dialog->findChild<QDoubleSpinBox*>("temperatureSpin")->value(), 0.3);  // the values stay
  dialog->reject();
}

namespace {

const char* const kAnswerSchema =
    R"({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}}, "required": ["answer"],)"
    R"( "additionalProperties": false})";

}  // namespace

// Chat > Generation settings: "JSON matching a schema" with a schema the constraint cannot take keeps the dialog
// open and says why; a good schema is saved, the header says the replies are JSON, and the next reply shown is
// a JSON object valid against it. Free text switches the schema box off.
void ChatHeaderTest::a_chat_set_to_json_replies_in_json_and_a_bad_schema_is_refused_in_place() {
  open_window(kvchat::test::greedy_chat_settings(80));
  QPushButton* header = window_->generationSettingsButton();
  header->click();
  auto* dialog = window_->findChild<kvchat::ui::ChatGenerationDialog*>("chatGenerationDialog");
  QVERIFY(dialog && dialog->isVisible());
  auto* format = dialog->findChild<QComboBox*>("replyFormatCombo");
  auto* schema = dialog->findChild<QPlainTextEdit*>("replySchemaEdit");
  auto* problem = dialog->findChild<QLabel*>("replyFormatProblemLabel");
  QCOMPARE(format->currentText(), QStringLiteral("Free text"));
  QVERIFY(!schema->isEnabled());
  format->setCurrentIndex(2);
  QCOMPARE(format->currentText(), QStringLiteral("JSON matching a schema"));
  QVERIFY(schema->isEnabled());
  schema->setPlainText(R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}})");
  dialog->findChild<QDialogButtonBox*>()->button(QDialogButtonBox::Ok)->click();
  QVERIFY(dialog->isVisible());
  QVERIFY(problem->isVisible());
  QCOMPARE(problem->text(),
           QStringLiteral("This schema cannot be used: /properties/code/pattern: the keyword 'pattern' "
                          "is not supported by constrained decoding"));
  QCOMPARE(controller()->chatReplyFormat(controller()->currentConversationId()).kind,
           kvchat::app::ReplyFormat::Kind::Text);

  schema->setPlainText(QString::fromLatin1(kAnswerSchema));
  dialog->findChild<QDialogButtonBox*>()->button(QDialogButtonBox::Ok)->click();
  QVERIFY(!dialog->isVisible());
  QCOMPARE(header->text(), QStringLiteral("Global settings \u00b7 JSON replies"));

  type_and_send("Once upon a time");
  const QString shown = window_->chatView()->messageWidgets().last()->text();
  const QJsonDocument reply = QJsonDocument::fromJson(shown.toUtf8());
  QVERIFY2(reply.isObject(), qPrintable(shown));
  QCOMPARE(reply.object().keys(), QStringList{"answer"});
  QVERIFY(reply.object().value("answer").isString());
  QVERIFY(reply.object().value("answer").toString().size() <= 20);

  // Opened again: the schema as saved; back to free text.
  header->click();
  dialog = window_->findChild<kvchat::ui::ChatGenerationDialog*>("chatGenerationDialog");
  QVERIFY(dialog && dialog->isVisible());
  format = dialog->findChild<QComboBox*>("replyFormatCombo");
  QCOMPARE(format->currentIndex(), 2);
  QCOMPARE(dialog->findChild<QPlainTextEdit*>("replySchemaEdit")->toPlainText(), QString::fromLatin1(kAnswerSchema));
  format->setCurrentIndex(0);
  QVERIFY(!dialog->findChild<QPlainTextEdit*>("replySchemaEdit")->isEnabled());
  dialog->accept();
  QCOMPARE(header->text(), QStringLiteral("Global settings"));
}

KVCHAT_TEST_MAIN(ChatHeaderTest)

}  // namespace ui_test_chat_header

#include "test_chat_header.moc"
