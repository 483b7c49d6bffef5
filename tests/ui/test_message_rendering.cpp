// How message text is shown, on ChatView/MessageWidget alone (no model): long words never widen the
// transcript, single line breaks are kept, raw HTML is text and nothing a message names is loaded, code blocks
// have their own Copy button, a failed reply shows its error once, a reply cut short says so and offers
// Continue.
#include <QtTest>
#include "common/test_suite.h"

#include <QClipboard>
#include <QDesktopServices>
#include <QDir>
#include <QGuiApplication>
#include <QImage>
#include <QJsonArray>
#include <QJsonObject>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QScrollBar>
#include <QTemporaryDir>
#include <QTextDocument>
#include <QToolButton>

#include "app/store/chat_history.h"
#include "app/store/markdown_text.h"
#include "ui/chat_view.h"
#include "ui/code_block_widget.h"
#include "ui/markdown_blocks.h"
#include "ui/message_body.h"
#include "ui/message_list_model.h"
#include "ui/message_text_view.h"
#include "ui/message_widget.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_message_rendering {

using kvchat::app::MessageRecord;
using kvchat::ui::ChatView;
using kvchat::ui::MessageSegment;
using kvchat::ui::MessageWidget;

namespace {

MessageRecord record(qint64 id, const QString& role, const QString& text) {
  MessageRecord message;
  message.id = id;
  message.conversation_id = 1;
  message.role = kvchat::app::parse_message_role(role).value();
  message.text = text;
  return message;
}

QString rendered(MessageWidget* widget) { return widget->body()->renderedText(); }

// Shows the view at a fixed size and lets the layouts settle.
void show_view(ChatView& view, int width, int height) {
  view.resize(width, height);
  view.show();
  QVERIFY(QTest::qWaitForWindowExposed(&view));
  QTest::qWait(50);
  QCoreApplication::processEvents();
}

}  // namespace

class MessageRenderingTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void long_words_and_code_lines_never_widen_the_transcript();
  void the_end_of_a_long_reply_can_be_scrolled_into_view();
  void single_line_breaks_are_kept();
  void raw_html_is_shown_as_text();
  void no_image_named_by_a_message_is_loaded();
  void code_blocks_have_their_own_copy_button_and_monospace();
  void message_segments_split_at_fences();
  void a_replys_thinking_is_folded_and_expandable();
  void a_failed_reply_shows_its_error_once();
  void a_reply_cut_short_says_so_and_offers_continue();
  void a_huge_message_is_shown_cut_but_copied_whole();
  void regenerated_replies_are_switchable_alternatives();
  void the_time_a_message_was_written_shows_on_hover();
  void a_link_shows_its_address_and_opens_only_when_confirmed();
  void tool_calls_and_results_are_shown();
};

void MessageRenderingTest::long_words_and_code_lines_never_widen_the_transcript() {
  ChatView view;
  const QString word(500, QLatin1Char('w'));
  const QString url = QStringLiteral("https://example.com/") + QString(240, QLatin1Char('a'));
  const QString code_line = QStringLiteral("int x = ") + QString(300, QLatin1Char('1')) + QStringLiteral(";");
  view.model()->setMessages({record(1, "user", word),
                             record(2, "assistant", url + "\n\n```cpp\n" + code_line + "\n```\n\nDone."),
                             record(3, "user", "short")});
  show_view(view, 600, 400);
  const int viewport = view.viewport()->width();
  QCOMPARE(view.widget()->width(), viewport);
  QCOMPARE(view.horizontalScrollBar()->maximum(), 0);
  const auto widgets = view.messageWidgets();
  QCOMPARE(widgets.size(), 3);
  for (MessageWidget* widget : widgets) {
    QVERIFY2(widget->geometry().right() < viewport,
             qPrintable(QStringLiteral("message %1 is %2 px wide in a %3 px view")
                            .arg(widget->messageId())
                            .arg(widget->width())
                            .arg(viewport)));
    // The copy button stays on screen.
    auto* copy = widget->findChild<QToolButton*>("copyButton");
    QVERIFY(copy);
    QVERIFY(copy->mapTo(view.widget(), QPoint(copy->width(), 0)).x() <= viewport);
  }
  // Nothing is cut off inside a bubble either: every prose view's text fits its width (it wrapped).
  for (MessageWidget* widget : widgets)
    for (auto* prose : widget->body()->proseViews()) {
      QVERIFY2(prose->document()->idealWidth() <= prose->viewport()->width() + 1,
               qPrintable(QStringLiteral("message %1: text %2 px wide in a %3 px view")
                              .arg(widget->messageId())
                              .arg(prose->document()->idealWidth())
                              .arg(prose->viewport()->width())));
      QVERIFY(prose->mapTo(widget, QPoint(prose->width(), 0)).x() <= widget->width());
    }
  // The 500-character word wraps onto several lines; the code line scrolls inside its block.
  auto* prose = widgets[0]->body()->proseViews().first();
  QVERIFY(prose->document()->lineCount() > 1 || prose->document()->size().height() > 3 * prose->fontMetrics().height());
  const auto blocks = widgets[1]->body()->codeBlocks();
  QCOMPARE(blocks.size(), 1);
  QCOMPARE(blocks[0]->code(), code_line);
  QVERIFY(blocks[0]->view()->horizontalScrollBar()->maximum() > 0);
  QVERIFY(blocks[0]->geometry().right() < widgets[1]->width());
}

void MessageRenderingTest::the_end_of_a_long_reply_can_be_scrolled_into_view() {
  ChatView view;
  QString reply;
  for (int i = 0; i < 40; ++i) reply += QStringLiteral("Paragraph %1 with a few words.\n\n").arg(i);
  reply += "```\n" + QString(300, QLatin1Char('x')) + "\n```\n\nTHE END";
  view.model()->setMessages({record(1, "user", "tell me"), record(2, "assistant", reply)});
  show_view(view, 500, 300);
  view.verticalScrollBar()->setValue(view.verticalScrollBar()->maximum());
  QCoreApplication::processEvents();
  MessageWidget* widget = view.messageWidget(2);
  auto* last = widget->body()->proseViews().last();
  QVERIFY(last->document()->toPlainText().contains("THE END"));
  // The last line's bottom lies inside the viewport once scrolled to the end.
  const QPoint bottom = last->mapTo(view.viewport(), QPoint(0, last->height()));
  QVERIFY2(
      bottom.y() <= view.viewport()->height(),
      qPrintable(QStringLiteral("end of reply at %1, viewport %2").arg(bottom.y()).arg(view.viewport()->height())));
  QVERIFY(bottom.y() > 0);
}

void MessageRenderingTest::single_line_breaks_are_kept() {
  ChatView view;
  view.model()->setMessages({record(1, "assistant", "Roses are red,\nviolets are blue.\n\nNew paragraph\n- a\n- b")});
  const QString text = rendered(view.messageWidget(1));
  QVERIFY2(text.startsWith("Roses are red,\nviolets are blue.\nNew paragraph"), qPrintable(text));
  QVERIFY(view.messageWidget(1)->body()->isMarkdown());
  QCOMPARE(view.messageWidget(1)->text(),
           QStringLiteral("Roses are red,\nviolets are blue.\n\nNew paragraph\n- a\n- b"));
  QCOMPARE(kvchat::ui::with_hard_line_breaks("a\nb\n\nc"), QStringLiteral("a  \nb\n\nc"));
}

void MessageRenderingTest::raw_html_is_shown_as_text() {
  ChatView view;
  const QString html = "Say <b>bold</b> and <font size=7>big</font>\n\n<div>block</div>";
  view.model()->setMessages({record(1, "assistant", html), record(2, "user", "<i>mine</i> **not bold**")});
  const QString reply = rendered(view.messageWidget(1));
  QVERIFY2(reply.contains("<b>bold</b>"), qPrintable(reply));
  QVERIFY(reply.contains("<font size=7>big</font>"));
  QVERIFY(reply.contains("<div>block</div>"));
  auto* document = view.messageWidget(1)->body()->proseViews().first()->document();
  QTextCursor cursor(document);
  cursor.setPosition(reply.indexOf("bold") + 1);
  QVERIFY(cursor.charFormat().fontWeight() <= QFont::Normal);
  QCOMPARE(rendered(view.messageWidget(2)), QStringLiteral("<i>mine</i> **not bold**"));
  QVERIFY(!view.messageWidget(2)->body()->isMarkdown());
}

void MessageRenderingTest::no_image_named_by_a_message_is_loaded() {
  QTemporaryDir dir;
  const QString image_path = dir.filePath("big.png");
  QImage image(400, 400, QImage::Format_RGB32);
  image.fill(Qt::red);
  QVERIFY(image.save(image_path));
  ChatView view;
  view.model()->setMessages({record(1, "assistant", QStringLiteral("![x](file://%1)").arg(image_path)),
                             record(2, "assistant", QStringLiteral("![y](%1)").arg(image_path)),
                             record(3, "assistant", QStringLiteral("<img src=\"%1\">").arg(image_path))});
  show_view(view, 600, 400);
  // A loaded 400x400 image would make the reply at least 400 px tall.
  for (qint64 id : {1, 2, 3}) {
    MessageWidget* widget = view.messageWidget(id);
    QVERIFY2(widget->body()->height() < 100,
             qPrintable(QStringLiteral("message %1 body is %2 px tall").arg(id).arg(widget->body()->height())));
  }
  QCOMPARE(rendered(view.messageWidget(2)), QStringLiteral("[image not loaded: %1]").arg(image_path));
}

void MessageRenderingTest::code_blocks_have_their_own_copy_button_and_monospace() {
  ChatView view;
  view.model()->setMessages({record(1, "assistant", "Here:\n\n```python\nprint('hi')\nx = 1\n```\nand after.")});
  show_view(view, 600, 400);
  MessageWidget* widget = view.messageWidget(1);
  const auto blocks = widget->body()->codeBlocks();
  QCOMPARE(blocks.size(), 1);
  QCOMPARE(blocks[0]->language(), QStringLiteral("python"));
  QCOMPARE(blocks[0]->code(), QStringLiteral("print('hi')\nx = 1"));
  QVERIFY(QFontInfo(blocks[0]->view()->document()->defaultFont()).fixedPitch());
  QSignalSpy copied(blocks[0], &kvchat::ui::CodeBlockWidget::copied);
  blocks[0]->copyButton()->click();
  QCOMPARE(copied.count(), 1);
  QCOMPARE(copied.first().first().toString(), QStringLiteral("print('hi')\nx = 1"));
  QCOMPARE(QGuiApplication::clipboard()->text(), QStringLiteral("print('hi')\nx = 1"));
  QCOMPARE(widget->body()->proseViews().size(), 2);
  QCOMPARE(blocks[0]->copyButton()->focusPolicy(), Qt::NoFocus);
}

void MessageRenderingTest::message_segments_split_at_fences() {
  using Kind = MessageSegment::Kind;
  const auto segments = kvchat::ui::split_message_segments("a\n~~~~ sh\nls\n```\n~~~~\nb\n```js\nopen");
  QCOMPARE(segments.size(), 4);
  QCOMPARE(segments[0], (MessageSegment{Kind::Prose, "a", ""}));
  QCOMPARE(segments[1], (MessageSegment{Kind::Code, "ls\n```", "sh"}));  // only a fence of its own kind closes it
  QCOMPARE(segments[2], (MessageSegment{Kind::Prose, "b", ""}));
  QCOMPARE(segments[3], (MessageSegment{Kind::Code, "open", "js"}));  // still streaming: runs to the end
  QCOMPARE(kvchat::ui::split_message_segments("    ```\nnot a fence").size(), 1);
}

// A reasoning model's <think>…</think> opening: folded under its button while it streams and once done, opened
// and closed by the button; the answer shows as any reply. The user's own words are never folded.
void MessageRenderingTest::a_replys_thinking_is_folded_and_expandable() {
  const auto split = kvchat::app::split_thinking(" <think>\nadd them\n</think>\n\n**4**");
  QVERIFY(split.has_thinking && split.closed);
  QCOMPARE(split.thinking, QStringLiteral("add them"));
  QCOMPARE(split.answer, QStringLiteral("**4**"));
  QVERIFY(!kvchat::app::split_thinking("no <think> here").has_thinking);

  ChatView view;
  view.model()->setMessages({record(1, "user", "<think>typed</think> 2+2?"), record(2, "assistant", "<think>\nadd")});
  show_view(view, 600, 400);
  QCOMPARE(view.messageWidget(1)->body()->thinkingToggle(), nullptr);
  kvchat::ui::MessageBody* body = view.messageWidget(2)->body();
  QVERIFY(body->thinkingToggle() != nullptr);
  QCOMPARE(body->thinkingToggle()->text(), QStringLiteral("Thinking\u2026"));  // streaming: no </think> yet
  QVERIFY(!body->thinkingView()->isVisible());
  QCOMPARE(body->renderedText(), QStringLiteral("Thinking\u2026"));

  view.model()->setMessages({record(1, "user", "<think>typed</think> 2+2?"),
                             record(2, "assistant", "<think>\nadd two and two\n</think>\n\nIt is **4**.")});
  body = view.messageWidget(2)->body();
  QCOMPARE(body->thinkingToggle()->text(), QStringLiteral("Thought for 4 words"));
  QVERIFY(!body->thinkingView()->isVisible());
  QCOMPARE(body->renderedText(), QStringLiteral("Thought for 4 words\n\nIt is 4."));
  body->thinkingToggle()->click();
  QVERIFY(body->thinkingView()->isVisible());
  QCOMPARE(body->renderedText(), QStringLiteral("Thought for 4 words\n\nadd two and two\n\nIt is 4."));
  body->thinkingToggle()->click();
  QVERIFY(!body->thinkingView()->isVisible());
  QVERIFY(view.messageWidget(1)->body()->renderedText().contains(QStringLiteral("<think>typed</think>")));
}

void MessageRenderingTest::a_failed_reply_shows_its_error_once() {
  ChatView view;
  MessageRecord failed = record(2, "assistant", "");
  failed.stats = QJsonObject{{kvchat::app::kReplyErrorKey, "the last message alone is 900 tokens long"}};
  view.model()->setMessages({record(1, "user", "long"), failed});
  show_view(view, 600, 400);
  MessageWidget* widget = view.messageWidget(2);
  QVERIFY(widget->isFailed());
  QCOMPARE(widget->statsText(), QStringLiteral("Error: the last message alone is 900 tokens long"));
  QVERIFY(widget->body()->isHidden());  // no empty bubble text above the error
  QVERIFY(!view.findChild<QLabel*>("chatError"));
  QVERIFY(!widget->statsText().contains("tokens \u00b7"));
  QCOMPARE(widget->cutShortText(), QString());
}

void MessageRenderingTest::a_reply_cut_short_says_so_and_offers_continue() {
  ChatView view;
  MessageRecord crashed = record(2, "assistant", "Once upon a");
  crashed.complete = false;
  MessageRecord finished = record(4, "assistant", "The end.");
  finished.stats = QJsonObject{{"stop_reason", "eos"}, {"generated_tokens", 3}};
  view.model()->setMessages({record(1, "user", "Tell"), crashed, record(3, "user", "More"), finished});
  show_view(view, 600, 400);
  QCOMPARE(view.messageWidget(2)->cutShortText(),
           QStringLiteral("Cut short: the app closed before this reply finished."));
  QCOMPARE(view.messageWidget(4)->cutShortText(), QString());
  QVERIFY(view.messageWidget(2)->continueButton()->isHidden());  // only once the window offers it
  view.setContinuableMessage(2);
  QVERIFY(!view.messageWidget(2)->continueButton()->isHidden());
  QVERIFY(view.messageWidget(4)->continueButton()->isHidden());
  QSignalSpy requested(&view, &ChatView::continueRequested);
  view.messageWidget(2)->continueButton()->click();
  QCOMPARE(requested.count(), 1);
  QCOMPARE(requested.first().first().toLongLong(), 2);

  MessageRecord max_tokens = record(5, "assistant", "and");
  max_tokens.stats = QJsonObject{{"stop_reason", "max_tokens"}, {"generated_tokens", 1}};
  QVERIFY(kvchat::app::is_continuable_reply(max_tokens));
  QVERIFY(!kvchat::app::is_continuable_reply(finished));
  QVERIFY(kvchat::app::is_continuable_reply(crashed));
}

void MessageRenderingTest::a_huge_message_is_shown_cut_but_copied_whole() {
  ChatView view;
  const QString huge(kvchat::ui::MessageBody::kMaxShownCharacters * 3, QLatin1Char('z'));
  view.model()->setMessages({record(1, "user", huge)});
  MessageWidget* widget = view.messageWidget(1);
  QVERIFY(rendered(widget).size() < huge.size());
  QVERIFY(rendered(widget).contains(QStringLiteral("more characters not shown")));
  QCOMPARE(widget->text(), huge);
  QSignalSpy copied(widget, &MessageWidget::copied);
  widget->findChild<QToolButton*>("copyButton")->click();
  QCOMPARE(copied.first().first().toString().size(), huge.size());
}

void MessageRenderingTest::regenerated_replies_are_switchable_alternatives() {
  ChatView view;
  MessageRecord first = record(2, "assistant", "first try");
  first.settings.insert(kvchat::app::kHiddenAlternativeKey, true);
  MessageRecord third = record(4, "assistant", "third try");
  third.settings.insert(kvchat::app::kHiddenAlternativeKey, true);
  view.model()->setMessages({record(1, "user", "go"), first, record(3, "assistant", "second try"), third,
                             record(5, "user", "next"), record(6, "assistant", "only one")});
  QList<qint64> shown;
  for (MessageWidget* widget : view.messageWidgets()) shown << widget->messageId();
  QCOMPARE(shown, (QList<qint64>{1, 3, 5, 6}));
  QCOMPARE(view.messageWidget(3)->alternativesText(), QStringLiteral("2/3"));
  QCOMPARE(view.messageWidget(6)->alternativesText(), QString());
  QSignalSpy requested(&view, &ChatView::alternativeRequested);
  view.messageWidget(3)->findChild<QToolButton*>("previousAlternativeButton")->click();
  view.messageWidget(3)->findChild<QToolButton*>("nextAlternativeButton")->click();
  QCOMPARE(requested.count(), 2);
  QCOMPARE(requested[0].first().toLongLong(), 2);
  QCOMPARE(requested[1].first().toLongLong(), 4);
}

void MessageRenderingTest::the_time_a_message_was_written_shows_on_hover() {
  ChatView view;
  MessageRecord message = record(1, "user", "hello");
  message.created_at = QDateTime(QDate(2024, 3, 1), QTime(9, 30, 5), Qt::UTC);
  view.model()->setMessages({message});
  auto* header = view.messageWidget(1)->findChild<QLabel*>("messageHeader");
  QVERIFY(header);
  QCOMPARE(header->toolTip(), QLocale().toString(message.created_at.toLocalTime(), QLocale::LongFormat));
}

// Receives the web addresses QDesktopServices would hand to a browser.
class UrlCatcher : public QObject {
  Q_OBJECT
 public:
  QList<QUrl> opened;
 public Q_SLOTS:
  void open(const QUrl& url) { opened << url; }
};

// Clicks (or only hovers) the middle of `text` in `view`.
QPoint point_of(kvchat::ui::MessageTextView* view, const QString& text) {
  QTextCursor cursor(view->document());
  cursor.setPosition(view->document()->toPlainText().indexOf(text) + static_cast<int>(text.size()) / 2);
  return view->cursorRect(cursor).center();
}

void MessageRenderingTest::a_link_shows_its_address_and_opens_only_when_confirmed() {
  ChatView view;
  view.model()->setMessages({record(1, "assistant", "See [the docs](https://example.org/a?b=1) now")});
  show_view(view, 600, 400);
  kvchat::ui::MessageTextView* prose = view.messageWidget(1)->body()->proseViews().first();
  const QPoint link = point_of(prose, "the docs");
  QTest::mouseMove(prose->viewport(), link);
  QTRY_COMPARE(prose->toolTip(), QStringLiteral("https://example.org/a?b=1"));

  UrlCatcher catcher;
  QDesktopServices::setUrlHandler(QStringLiteral("https"), &catcher, "open");
  auto click_and_answer = [&](QMessageBox::StandardButton answer) {
    QTest::mouseClick(prose->viewport(), Qt::LeftButton, {}, link);
    QMessageBox* question = nullptr;
    QTRY_VERIFY((question = view.findChild<QMessageBox*>("openLinkDialog")) != nullptr);
    QVERIFY2(question->text().contains(QStringLiteral("https://example.org/a?b=1")), qPrintable(question->text()));
    question->button(answer)->click();
    QTRY_VERIFY(!view.findChild<QMessageBox*>("openLinkDialog"));
  };
  click_and_answer(QMessageBox::Cancel);
  QVERIFY(catcher.opened.isEmpty());
  click_and_answer(QMessageBox::Open);
  QCOMPARE(catcher.opened, (QList<QUrl>{QUrl(QStringLiteral("https://example.org/a?b=1"))}));
  QDesktopServices::unsetUrlHandler(QStringLiteral("https"));

  // No browser at all (nothing on the PATH): the window says so and the address is on the clipboard.
  const QByteArray path = qgetenv("PATH");
  const QByteArray browser = qgetenv("BROWSER");
  QTemporaryDir empty;
  qputenv("PATH", empty.path().toLocal8Bit());
  qunsetenv("BROWSER");
  click_and_answer(QMessageBox::Open);
  qputenv("PATH", path);
  if (!browser.isEmpty()) qputenv("BROWSER", browser);
  QMessageBox* failure = nullptr;
  QTRY_VERIFY((failure = view.findChild<QMessageBox*>("openLinkFailedDialog")) != nullptr);
  QCOMPARE(failure->text(), QStringLiteral("No web browser could be started for\nhttps://example.org/a?b=1\n\nThe "
                                           "address is copied to the clipboard."));
  QCOMPARE(QGuiApplication::clipboard()->text(), QStringLiteral("https://example.org/a?b=1"));
  failure->accept();
}

// A reply that called a tool shows its text, then each call's function, id and arguments (a code block with
// its own Copy); the tool's result is a block headed "Tool result" with the tool's name, its text as code. Copy
// on the reply copies what the model wrote.
void MessageRenderingTest::tool_calls_and_results_are_shown() {
  ChatView view;
  MessageRecord call = record(2, "assistant", "Let me look.");
  call.model = QStringLiteral("tiny");
  call.tool_calls = QJsonArray{
      QJsonObject{{"id", "call_1"},
                  {"type", "function"},
                  {"function", QJsonObject{{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}};
  MessageRecord result = record(3, "tool", "{\"celsius\": 21}");
  result.tool_call_id = QStringLiteral("call_1");
  result.tool_name = QStringLiteral("get_weather");
  view.model()->setMessages({record(1, "user", "Weather?"), call, result, record(4, "assistant", "It is 21 C.")});
  show_view(view, 700, 500);
  const auto widgets = view.messageWidgets();
  QCOMPARE(widgets.size(), 4);

  MessageWidget* caller = widgets[1];
  QCOMPARE(caller->findChild<QLabel*>("messageHeader")->text(), QStringLiteral("<b>Assistant \u00b7 tiny</b>"));
  QCOMPARE(rendered(caller), QStringLiteral("Let me look.\nTool call get_weather (call call_1):\n\n{\n    "
                                            "\"city\": \"Paris\"\n}"));
  QCOMPARE(caller->body()->codeBlocks().size(), 1);
  QCOMPARE(caller->body()->codeBlocks()[0]->code(), QStringLiteral("{\n    \"city\": \"Paris\"\n}"));
  QCOMPARE(caller->text(), QStringLiteral("Let me look."));

  MessageWidget* tool = widgets[2];
  QCOMPARE(tool->role(), kvchat::app::MessageRole::Tool);
  QCOMPARE(tool->findChild<QLabel*>("messageHeader")->text(), QStringLiteral("<b>Tool result \u00b7 get_weather</b>"));
  QCOMPARE(tool->body()->codeBlocks().size(), 1);
  QCOMPARE(tool->body()->codeBlocks()[0]->code(), QStringLiteral("{\"celsius\": 21}"));
  QCOMPARE(rendered(tool), QStringLiteral("get_weather, call call_1\n\n{\"celsius\": 21}"));
  QVERIFY(!tool->findChild<QToolButton*>("deleteMessageButton"));
  // The answer after the result is not an alternative of the call.
  QCOMPARE(widgets[3]->alternativesText(), QString());
  QCOMPARE(caller->alternativesText(), QString());
}

KVCHAT_TEST_MAIN(MessageRenderingTest)

}  // namespace ui_test_message_rendering

#include "test_message_rendering.moc"
