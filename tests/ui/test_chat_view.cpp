// ChatView and MessageWidget on their own: Markdown for replies and plain text for the user's words, a
// context-cut marker placed above the first message still in context, streaming appends, errors shown.
#include <QSignalSpy>
#include <QtTest>
#include "common/test_suite.h"

#include <QLabel>
#include <QPointer>

#include "app/store/chat_history.h"
#include "ui/chat_view.h"
#include "ui/message_body.h"
#include "ui/message_list_model.h"
#include "ui/message_widget.h"
#include "ui/stats_format.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_chat_view {

using kvchat::app::MessageRecord;
using kvchat::ui::ChatView;
using kvchat::ui::MessageListModel;
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

kvchat::ui::MessageBody* body_of(MessageWidget* widget) { return widget->body(); }
}  // namespace

class ChatViewTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void replies_are_markdown_user_text_is_plain();
  void marker_is_shown_above_the_first_message_in_context();
  void a_marker_or_a_deletion_keeps_the_other_widgets();
  void streamed_chunks_are_laid_out_once_per_interval();
  void streaming_appends_and_the_final_record_replaces();
  void the_transcript_model_applies_differences();
  void byte_sizes_are_readable();
};

void ChatViewTest::replies_are_markdown_user_text_is_plain() {
  ChatView view;
  const QString markdown = "Here:\n\n- one\n- two\n\n```cpp\nint x = 1;\n```\n";
  view.model()->setMessages({record(1, "user", "**not bold**"), record(2, "assistant", markdown)});
  const auto widgets = view.messageWidgets();
  QCOMPARE(widgets.size(), 2);
  QVERIFY(!body_of(widgets[0])->isMarkdown());
  QCOMPARE(body_of(widgets[0])->renderedText(), QStringLiteral("**not bold**"));
  QVERIFY(body_of(widgets[1])->isMarkdown());
  QCOMPARE(body_of(widgets[1])->source(), markdown);
  QCOMPARE(body_of(widgets[1])->codeBlocks().size(), 1);
  QVERIFY(body_of(widgets[1])->renderedText().contains("int x = 1;"));
}

void ChatViewTest::marker_is_shown_above_the_first_message_in_context() {
  ChatView view;
  MessageRecord marker = kvchat::app::context_cut_marker(1, 3, 2, 96);
  marker.id = 6;  // written after the turn that needed the cut
  view.model()->setMessages({record(1, "user", "a"), record(2, "assistant", "b"), record(3, "user", "c"),
                             record(4, "assistant", "d"), record(5, "user", "e"), marker});
  QList<qint64> order;
  for (auto* widget : view.messageWidgets()) order << widget->messageId();
  QCOMPARE(order, (QList<qint64>{1, 2, 6, 3, 4, 5}));
  QVERIFY(view.messageWidget(6)->findChild<QLabel*>("markerText")->text().contains("96 tokens"));
}

// The transcript is not rebuilt when a context-cut marker is inserted (a long chat at the context limit gets one
// each turn) or a message goes: the other messages keep their widgets, and the order is the reading order.
void ChatViewTest::a_marker_or_a_deletion_keeps_the_other_widgets() {
  ChatView view;
  const QList<MessageRecord> chat{record(1, "user", "a"), record(2, "assistant", "b"), record(3, "user", "c"),
                                  record(4, "assistant", "d"), record(5, "user", "e")};
  view.model()->setMessages(chat);
  QHash<qint64, QPointer<MessageWidget>> before;
  for (MessageWidget* widget : view.messageWidgets()) before.insert(widget->messageId(), widget);
  QCOMPARE(before.size(), 5);
  MessageRecord marker = kvchat::app::context_cut_marker(1, 3, 2, 96);
  marker.id = 6;
  view.model()->setMessages(chat + QList<MessageRecord>{marker});
  QList<qint64> order;
  for (MessageWidget* widget : view.messageWidgets()) order << widget->messageId();
  QCOMPARE(order, (QList<qint64>{1, 2, 6, 3, 4, 5}));
  for (qint64 id : {1, 2, 3, 4, 5}) QCOMPARE(view.messageWidget(id), before.value(id).data());

  view.model()->setMessages({record(1, "user", "a"), record(2, "assistant", "b"), record(3, "user", "c"), marker});
  order.clear();
  for (MessageWidget* widget : view.messageWidgets()) order << widget->messageId();
  QCOMPARE(order, (QList<qint64>{1, 2, 6, 3}));
  for (qint64 id : {1, 2, 3}) QCOMPARE(view.messageWidget(id), before.value(id).data());
  QVERIFY(before.value(4)->isHidden());  // deleted later, out of sight at once
  // A message whose text changed keeps its widget, which shows the new text.
  view.model()->setMessages({record(1, "user", "a"), record(2, "assistant", "b2"), record(3, "user", "c"), marker});
  QCOMPARE(view.messageWidget(2), before.value(2).data());
  QCOMPARE(view.messageWidget(2)->text(), QStringLiteral("b2"));
  QCOMPARE(body_of(view.messageWidget(2))->source(), QStringLiteral("b2"));
  QCOMPARE(view.messageWidget(1), before.value(1).data());
}

// A streamed chunk is not laid out when it arrives (a fast model's tokens come faster than a layout of the
// reply): the chunks of one render interval are laid out once, together.
void ChatViewTest::streamed_chunks_are_laid_out_once_per_interval() {
  ChatView view;
  MessageRecord reply = record(2, "assistant", "");
  reply.complete = false;
  view.model()->setMessages({record(1, "user", "hi"), reply}, /*streaming_message_id=*/2);
  kvchat::ui::MessageBody* body = body_of(view.messageWidget(2));
  QVERIFY(body);
  const int layouts_before = body->layoutCount();
  const QString shown_before = body->source();  // what an empty streaming reply shows
  QString expected;
  for (int chunk = 0; chunk < 50; ++chunk) {
    view.model()->appendText(2, QStringLiteral(" and"));
    expected += QStringLiteral(" and");
  }
  QCOMPARE(view.messageWidget(2)->text(), expected);
  QCOMPARE(body->source(), shown_before);
  QCOMPARE(body->layoutCount(), layouts_before);
  QTRY_COMPARE(body->source(), expected);
  QCOMPARE(body->layoutCount(), layouts_before + 1);
  view.model()->appendText(2, QStringLiteral(" cake"));
  QCOMPARE(body->layoutCount(), layouts_before + 1);
  QTRY_COMPARE(body->source(), expected + QStringLiteral(" cake"));
  QCOMPARE(body->layoutCount(), layouts_before + 2);
}

void ChatViewTest::streaming_appends_and_the_final_record_replaces() {
  ChatView view;
  MessageRecord reply = record(2, "assistant", "");
  reply.complete = false;
  view.model()->setMessages({record(1, "user", "hi"), reply}, /*streaming_message_id=*/2);
  MessageWidget* streaming = view.messageWidget(2);
  QVERIFY(streaming);
  view.model()->appendText(2, "Once ");
  view.model()->appendText(2, "upon");
  QCOMPARE(streaming->text(), QStringLiteral("Once upon"));
  QTRY_COMPARE(body_of(streaming)->source(), QStringLiteral("Once upon"));  // rendered within the coalescing interval

  // Sending appends: the widgets already shown stay.
  MessageRecord finished = record(2, "assistant", "Once upon a time");
  finished.stats = QJsonObject{{"generated_tokens", 4},
                               {"prompt_tokens", 2},
                               {"prefilled_tokens", 2},
                               {"cache_mode", "on"},
                               {"stop_reason", "eos"}};
  view.model()->updateMessage(finished);
  QCOMPARE(body_of(streaming)->source(), QStringLiteral("Once upon a time"));
  QVERIFY(streaming->statsText().contains("4 tokens"));
  QVERIFY(streaming->statsText().contains("0 reused / 2 prefilled"));
  view.model()->setMessages({record(1, "user", "hi"), finished, record(3, "user", "more")});
  QCOMPARE(view.messageWidget(2), streaming);
  QCOMPARE(view.messageWidgets().size(), 3);

  view.showError("the model refused");
  QVERIFY(view.findChild<QLabel*>("chatError"));
  QCOMPARE(view.findChild<QLabel*>("chatError")->text(), QStringLiteral("the model refused"));
}

// Every change to the transcript reaches the view as rows inserted, removed or changed, never as a reset: what
// stays keeps its widget.
void ChatViewTest::the_transcript_model_applies_differences() {
  ChatView view;
  MessageListModel& model = *view.model();
  QSignalSpy inserted(&model, &QAbstractItemModel::rowsInserted);
  QSignalSpy removed(&model, &QAbstractItemModel::rowsRemoved);
  QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
  QSignalSpy reset(&model, &QAbstractItemModel::modelReset);
  const auto rows = [&model] {
    QList<qint64> ids;
    for (int row = 0; row < model.rowCount(); ++row)
      ids << model.data(model.index(row), MessageListModel::MessageIdRole).toLongLong();
    return ids;
  };
  const auto range = [](const QSignalSpy& spy, int i) {
    return qMakePair(spy.at(i).at(1).toInt(), spy.at(i).at(2).toInt());
  };
  QList<MessageRecord> chat{record(1, "user", "a"), record(2, "assistant", "b"), record(3, "user", "c"),
                            record(4, "assistant", "d")};
  model.setMessages(chat);
  QCOMPARE(inserted.size(), 1);
  QCOMPARE(range(inserted, 0), qMakePair(0, 3));
  const QList<MessageWidget*> first_widgets = view.messageWidgets();

  // A turn sent: its two messages inserted at the end, the reply streaming; its text grows one row at a time.
  MessageRecord reply = record(6, "assistant", "");
  reply.complete = false;
  chat << record(5, "user", "e") << reply;
  model.setMessages(chat, 6);
  QCOMPARE(inserted.size(), 2);
  QCOMPARE(range(inserted, 1), qMakePair(4, 5));
  QCOMPARE(changed.size(), 0);
  QVERIFY(model.isStreaming(5));
  QCOMPARE(model.data(model.index(5), MessageListModel::StreamingRole).toBool(), true);
  model.appendText(6, "Once");
  model.appendText(6, " upon");
  QCOMPARE(changed.size(), 2);
  QCOMPARE(changed.at(1).at(0).value<QModelIndex>().row(), 5);
  QCOMPARE(changed.at(1).at(2).value<QList<int>>(), QList<int>{Qt::DisplayRole});
  QCOMPARE(model.data(model.index(5)).toString(), QStringLiteral("Once upon"));
  QCOMPARE(view.messageWidget(6)->text(), QStringLiteral("Once upon"));
  reply.text = "Once upon a time";
  reply.complete = true;
  model.updateMessage(reply);
  QCOMPARE(changed.size(), 3);
  QVERIFY(!model.isStreaming(5));

  // Set again with the same messages (as saved): nothing to report.
  chat.last() = reply;
  model.setMessages(chat);
  QCOMPARE(changed.size(), 3);
  QCOMPARE(inserted.size(), 2);

  // A context-cut marker above message 3, then moved above message 5: one row inserted, then one moved (removed
  // and inserted), every message keeping its widget.
  MessageRecord marker = kvchat::app::context_cut_marker(1, 3, 2, 96);
  marker.id = 7;
  model.setMessages(chat + QList<MessageRecord>{marker});
  QCOMPARE(rows(), (QList<qint64>{1, 2, 7, 3, 4, 5, 6}));
  QCOMPARE(range(inserted, 2), qMakePair(2, 2));
  marker = kvchat::app::context_cut_marker(1, 5, 4, 120);
  marker.id = 7;
  model.setMessages(chat + QList<MessageRecord>{marker});
  QCOMPARE(rows(), (QList<qint64>{1, 2, 3, 4, 7, 5, 6}));
  QCOMPARE(removed.size(), 1);
  QCOMPARE(range(removed, 0), qMakePair(2, 2));
  QCOMPARE(range(inserted, 3), qMakePair(4, 4));
  for (int i = 0; i < 4; ++i) QCOMPARE(view.messageWidget(first_widgets[i]->messageId()), first_widgets[i]);

  // Two messages deleted: one removal of both rows.
  model.setMessages(QList<MessageRecord>{chat[0], chat[1], chat[2], chat[3]} + QList<MessageRecord>{marker});
  QCOMPARE(removed.size(), 2);
  QCOMPARE(range(removed, 1), qMakePair(5, 6));
  QCOMPARE(view.messageWidgets().size(), 5);
  QCOMPARE(reset.size(), 0);
}

void ChatViewTest::byte_sizes_are_readable() {
  QCOMPARE(kvchat::ui::format_bytes(812), QStringLiteral("812 B"));
  QCOMPARE(kvchat::ui::format_bytes(1280 * 323), QStringLiteral("403.8 KiB"));
  QCOMPARE(kvchat::ui::format_bytes(3 * 1024 * 1024 + 512 * 1024), QStringLiteral("3.50 MiB"));
  QCOMPARE(kvchat::ui::format_bytes(qint64(6) << 30), QStringLiteral("6.00 GiB"));
}

KVCHAT_TEST_MAIN(ChatViewTest)

}  // namespace ui_test_chat_view

#include "test_chat_view.moc"
