// MainWindow, what it shows: the status bar, the conversation list, the transcript, the buttons' states and
// the input box's drafts, each refreshed from the controller's queries.
#include "ui/appearance.h"
#include "ui/main_window.h"

#include <QDir>
#include <QFileInfo>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QLocale>
#include <QProgressBar>
#include <QPushButton>
#include <QScopedValueRollback>
#include <QStatusBar>

#include <algorithm>

#include "app/remote/remote_client.h"
#include "app/store/chat_history.h"
#include "ui/chat_generation_dialog.h"
#include "ui/chat_view.h"
#include "ui/conversation_titles.h"
#include "ui/elided_label.h"
#include "ui/message_input.h"
#include "ui/message_list_model.h"
#include "ui/priority_row_layout.h"
#include "ui/stats_format.h"
#include "ui/system_prompt_block.h"

namespace kvchat::ui {

using kvchat::app::MessageRole;

QLabel* MainWindow::speedLabel() const { return speed_label_; }
QLabel* MainWindow::replyStatsLabel() const { return reply_stats_label_; }
QLabel* MainWindow::cacheLabel() const { return cache_label_; }
QLabel* MainWindow::modelLabel() const { return model_label_; }
QLabel* MainWindow::noticeLabel() const { return notice_label_; }
QLabel* MainWindow::tokenCounterLabel() const { return token_counter_; }

void MainWindow::build_status_bar() {
  // Every field but the live speed elides rather than overlapping its neighbours, the least important first
  // (PriorityRowLayout). Passing messages are not shown here at all (QStatusBar's temporary message is drawn
  // under the permanent fields): they have a line of their own above the input.
  const auto make_label = [this](const char* name) {
    auto* label = new ElidedLabel(this);
    label->setObjectName(name);
    return label;
  };
  model_label_ = make_label("modelLabel");
  model_label_->setFullText(tr("No model"));
  load_busy_ = new QProgressBar(this);
  load_busy_->setObjectName("loadBusy");
  load_busy_->setRange(0, 0);  // indeterminate: loading has no measurable steps
  load_busy_->setMaximumWidth(90);
  load_busy_->hide();
  // The app's headline figure: a field of fixed width that is never elided.
  speed_label_ = make_label("speedLabel");
  speed_label_->setElidable(false);
  speed_label_->setReservedText(format_live_speed(true, 9999, 9999));
  reply_stats_label_ = make_label("replyStatsLabel");
  cache_bar_ = new QProgressBar(this);
  cache_bar_->setObjectName("cacheGauge");
  cache_bar_->setMinimumWidth(70);
  cache_bar_->setMaximumWidth(130);
  cache_bar_->setTextVisible(true);
  cache_label_ = make_label("cacheLabel");
  serving_label_ = new QLabel(this);
  serving_label_->setObjectName("servingLabel");
  serving_label_->hide();
  auto* fields = new QWidget(this);
  fields->setObjectName("statusFields");
  auto* row = new PriorityRowLayout(fields);
  row->setContentsMargins(0, 0, 0, 0);
  row->setSpacing(12);
  // Left to right as shown; the rank says who keeps its width longest when the window narrows.
  row->addField(model_label_, 5);
  row->addField(load_busy_, 1);
  row->addField(speed_label_, 0);
  row->addField(reply_stats_label_, 4);
  row->addField(cache_bar_, 1);
  row->addField(cache_label_, 3);
  row->addField(serving_label_, 2);
  statusBar()->addPermanentWidget(fields, 1);
}

void MainWindow::show_notice(const QString& text, int milliseconds) {
  notice_label_->setText(text);
  notice_label_->show();
  notice_timer_.start(milliseconds);
}

void MainWindow::show_cache_evicted(qint64 conversation_id) {
  QString title = QString::number(conversation_id);
  if (const auto record = controller_->conversation(conversation_id)) title = record->title;
  show_notice(tr("The cache of \u201c%1\u201d was dropped to stay within the memory budget; "
                 "it is rebuilt on that chat's next turn.")
                  .arg(title));
}

void MainWindow::show_model_loading(const QString& path) {
  load_busy_->show();
  model_label_->setFullText(tr("Loading %1\u2026").arg(QFileInfo(path).fileName()));
  refresh_buttons();
}

void MainWindow::show_model_loaded(const kvchat::app::ModelInfo&) {
  load_busy_->hide();
  // The previous model's speed says nothing about this one.
  if (!controller_->isGenerating()) clear_speed();
  refresh_window_title();
  refresh_model_label();
  refresh_buttons();
  refresh_cache_gauge();
  refresh_placeholder();
}

namespace {

// The server's address as the window shows it: credentials in the URL never are.
QString shown_base_url(const kvchat::app::ChatSettings& settings) {
  return QString::fromStdString(kvchat::app::displayed_base_url(settings.remote_base_url.trimmed().toStdString()));
}

}  // namespace

void MainWindow::refresh_model_label() {
  const kvchat::app::ChatSettings& settings = controller_->settings();
  if (controller_->usesRemoteBackend()) {
    const QString model = settings.remote_model.isEmpty() ? tr("the server's first model") : settings.remote_model;
    model_label_->setFullText(tr("%1 on %2").arg(model, shown_base_url(settings)));
    model_label_->setToolTip(tr("Replies come from the OpenAI-compatible server at %1").arg(shown_base_url(settings)));
  } else if (backend_->isModelLoaded()) {
    model_label_->setFullText(format_model_summary(backend_->modelInfo()));
    model_label_->setToolTip(format_model_details(backend_->modelInfo()));
  }
}

void MainWindow::show_model_load_failed(const QString& path, const QString& message) {
  load_busy_->hide();
  model_label_->setFullText(backend_->isModelLoaded() ? format_model_summary(backend_->modelInfo()) : tr("No model"));
  refresh_buttons();
  QString text = tr("Could not load the model\n%1\n\n%2").arg(path, message);
  if (backend_->isModelLoaded()) text += tr("\n\nStill using %1.").arg(backend_->modelInfo().path);
  show_error_dialog(tr("Model not loaded"), text, "modelLoadErrorDialog");
}

void MainWindow::show_reply_failed(qint64 conversation_id, const QString& message) {
  (void)message;  // the reply shows it; here only where to look
  if (conversation_id == controller_->currentConversationId()) return;
  QString title = QString::number(conversation_id);
  if (const auto record = controller_->conversation(conversation_id)) title = record->title;
  show_notice(tr("The reply in \u201c%1\u201d failed (the error is shown there).").arg(title));
}

void MainWindow::switch_drafts(qint64 conversation_id) {
  if (conversation_id == input_conversation_) return;
  const QString draft = input_->toPlainText();
  if (!draft.isEmpty())
    drafts_.insert(input_conversation_, draft);
  else
    drafts_.remove(input_conversation_);
  input_->setPlainText(drafts_.take(conversation_id));
  input_->moveCursor(QTextCursor::End);
  input_conversation_ = conversation_id;
}

bool MainWindow::generating_here() const {
  return controller_->isGenerating() && controller_->generatingConversationId() == controller_->currentConversationId();
}

void MainWindow::clear_speed() {
  speed_label_->setFullText(QString());
  speed_conversation_ = 0;
}

void MainWindow::refresh_conversations() {
  {
    const QScopedValueRollback<bool> updating(updating_conversation_list_, true);
    // While the search field holds text, only the chats it finds, each with its first matching message.
    conversation_model_->reload(search_field_ ? search_field_->text().trimmed() : QString());
  }
  // The speed shown was a deleted chat's: it describes nothing on screen any more.
  if (speed_conversation_ > 0 && !conversation_model_->knows(speed_conversation_)) clear_speed();
  select_current_conversation_row();
}

void MainWindow::refresh_conversation_states() {
  const QScopedValueRollback<bool> updating(updating_conversation_list_, true);
  conversation_model_->refresh_states();
}

// The list's current row follows the controller's current chat; no selection signal goes back to it.
void MainWindow::select_current_conversation_row() {
  const qint64 current = controller_->currentConversationId();
  const int row = conversation_model_->row_of(current);
  QItemSelectionModel* selection = conversation_list_->selectionModel();
  if (row != conversation_list_->currentIndex().row() || row < 0) {
    const QSignalBlocker blocker(selection);
    if (row >= 0)
      selection->setCurrentIndex(conversation_model_->index(row), QItemSelectionModel::ClearAndSelect);
    else
      selection->clear();
    conversation_list_->viewport()->update();
  }
  const std::optional<kvchat::app::ConversationRecord> record = conversation_model_->record(current);
  title_label_->setFullText(record ? record->title : tr("New chat"));
  refresh_pin_action();
}

void MainWindow::reload_messages() {
  const bool streaming_here = generating_here();
  const QList<kvchat::app::MessageRecord> shown = controller_->currentMessages();
  // A message no longer shown (another branch, deleted) is no longer being edited.
  if (editing_message_id_ != 0 && std::none_of(shown.cbegin(), shown.cend(), [this](const auto& message) {
        return message.id == editing_message_id_;
      }))
    editing_message_id_ = 0;
  message_model_->setMessages(shown, streaming_here ? controller_->generatingMessageId() : 0,
                              streaming_here ? controller_->generatingText() : QString(),
                              controller_->currentBranches());
  refresh_buttons();
  refresh_cache_gauge();
  refresh_placeholder();
}

void MainWindow::refresh_chat_header() {
  const qint64 id = controller_->currentConversationId();
  const auto record = id > 0 ? controller_->conversation(id) : std::nullopt;
  system_prompt_block_->setPrompt(record ? record->system_prompt : QString());
  generation_button_->setText(
      id > 0 ? ChatGenerationDialog::summary(controller_->chatGenerationSettings(id), controller_->chatReplyFormat(id))
             : ChatGenerationDialog::summary(std::nullopt));
  // The chat's last local model, when another one is loaded: offered, never loaded without a click.
  const auto last = id > 0 && !controller_->usesRemoteBackend() ? controller_->lastModelOf(id) : std::nullopt;
  const QString loaded = backend_->isModelLoaded() ? backend_->modelInfo().path : QString();
  const bool offer = last && !backend_->isModelLoading() && QDir::cleanPath(last->path) != QDir::cleanPath(loaded);
  last_model_path_ = offer ? last->path : QString();
  if (offer) {
    const QString name = last->name.isEmpty() ? QFileInfo(last->path).fileName() : last->name;
    last_model_label_->setText(tr("This chat last used %1").arg(name));
    last_model_label_->setToolTip(last->path);
    last_model_button_->setText(tr("Load %1").arg(name));
  }
  last_model_bar_->setVisible(offer);
}

void MainWindow::refresh_window_title() {
  // What answers in this window: the server's model in remote mode (the local model then does not), else
  // the loaded model.
  const kvchat::app::ChatSettings& settings = controller_->settings();
  QString what;
  if (controller_->usesRemoteBackend())
    what = tr("%1 on %2")
               .arg(settings.remote_model.isEmpty() ? tr("the server's first model") : settings.remote_model,
                    shown_base_url(settings));
  else if (backend_->isModelLoaded())
    what = backend_->modelInfo().name;
  setWindowTitle(what.isEmpty() ? QStringLiteral("kvchat") : QStringLiteral("kvchat \u2014 %1").arg(what));
}

void MainWindow::refresh_placeholder() {
  QString text;
  if (controller_->usesRemoteBackend()) {
    const kvchat::app::ChatSettings& settings = controller_->settings();
    const QString model = settings.remote_model.isEmpty() ? tr("the server's first model") : settings.remote_model;
    text = tr("<p>Replies come from <b>%1</b> on the OpenAI-compatible server at %2.</p>")
               .arg(model.toHtmlEscaped(), shown_base_url(settings).toHtmlEscaped());
    text += tr("<p>Type a message below and press Enter.</p>");
    text += tr("<p>Settings \u2192 Backend switches back to a model on this computer.</p>");
  } else if (backend_->isModelLoaded()) {
    const kvchat::app::ModelInfo& info = backend_->modelInfo();
    text = tr("<p><b>%1</b> is loaded (%2).</p>")
               .arg(info.name.toHtmlEscaped(), format_model_summary(info).toHtmlEscaped());
    text += tr("<p>Architecture: %1 \u00b7 chat template: %2</p>")
                .arg(info.architecture.isEmpty() ? tr("unknown") : info.architecture.toHtmlEscaped(),
                     info.has_chat_template ? tr("yes") : tr("no"));
    if (!info.has_chat_template) {
      text += tr("<p>Without a chat template it does not answer questions: it <b>continues the text you type</b>.</p>");
      // Only the embedded model is known to write children's stories.
      if (info.name == QLatin1String("stories260K"))
        text +=
            tr("<p>stories260K is a tiny model that writes children's stories: try \u201cOnce upon a time\u201d.</p>");
    } else {
      text += tr("<p>Type a message below and press Enter.</p>");
    }
    text += tr("<p>File \u2192 Open model file\u2026 loads another model (a .gguf file or a Hugging Face folder).</p>");
  } else {
    text = tr("<p>No model is loaded yet.</p>");
  }
  chat_view_->setPlaceholder(text);
}

void MainWindow::refresh_buttons() {
  const bool here = generating_here();
  const bool elsewhere = controller_->isGenerating() && !here;
  const bool queued = controller_->isQueued(controller_->currentConversationId());
  const bool ready = controller_->isBackendReady();
  // A waiting message can be withdrawn like a reply stopped (the button, or Esc).
  send_button_->setText(here || queued ? tr("Stop") : editing_message_id_ != 0 ? tr("Resend") : tr("Send"));
  send_button_->setToolTip(queued ? tr("Withdraw the waiting message (Esc)")
                           : here ? tr("Stop the reply (Esc)")
                                  : QString());
  send_button_->setEnabled(here || queued || ready);
  editing_label_->setVisible(editing_message_id_ != 0);
  QString waiting;
  if (queued || elsewhere) {
    QString title;
    if (const auto record = controller_->conversation(controller_->generatingConversationId())) title = record->title;
    waiting = queued ? tr("Waiting for the reply in \u201c%1\u201d to finish; this chat's reply starts then "
                          "(Stop or Esc withdraws it).")
                           .arg(title)
                     : tr("\u201c%1\u201d is generating a reply: a message sent here waits for it.").arg(title);
  }
  waiting_label_->setText(waiting);
  waiting_label_->setVisible(!waiting.isEmpty());
  bool has_reply = false;
  bool has_user_message = false;
  const auto messages = controller_->currentMessages();
  for (auto it = messages.crbegin(); it != messages.crend(); ++it) {
    if (it->role == MessageRole::Marker || kvchat::app::is_hidden_alternative(*it)) continue;
    has_reply = it->role == MessageRole::Assistant;
    break;
  }
  for (const auto& message : messages) has_user_message = has_user_message || message.role == MessageRole::User;
  const bool idle = !controller_->isGenerating() && !queued;
  regenerate_button_->setEnabled(idle && ready && has_reply);
  edit_button_->setEnabled(idle && ready && has_user_message);
  const auto continuable = controller_->continuableReply();
  chat_view_->setContinuableMessage(idle && ready && continuable ? continuable->id : 0);
}

MainWindow::DraftKey MainWindow::draft_key() const {
  return DraftKey{input_->toPlainText(), editing_message_id_, controller_->currentConversationId(), draft_revision_};
}

void MainWindow::refresh_token_counter() {
  token_count_timer_.stop();
  const DraftKey key = draft_key();
  if (key.text.trimmed().isEmpty()) {
    draft_request_id_ = 0;
    show_token_count(key, std::nullopt);
    return;
  }
  // Counted on the controller's counting thread; the answer is shown when it comes (draftMeasured).
  draft_request_key_ = key;
  draft_request_id_ = controller_->requestDraftMeasure(key.text, key.editing_message_id);
}

void MainWindow::show_draft_measure(quint64 request_id, bool measured, const kvchat::app::DraftMeasure& measure) {
  if (request_id == 0 || request_id != draft_request_id_) return;  // typed over since: a newer answer follows
  draft_request_id_ = 0;
  show_token_count(draft_request_key_, measured ? std::optional<kvchat::app::DraftMeasure>(measure) : std::nullopt);
}

void MainWindow::show_token_count(const DraftKey& key, const std::optional<kvchat::app::DraftMeasure>& measure) {
  shown_measure_key_ = key;
  shown_measure_ = measure;
  if (key.text.trimmed().isEmpty() || !measure) {
    token_counter_->setFullText(QString());
    return;
  }
  if (measure->fits) {
    set_palette_style_sheet(token_counter_, [](const QPalette&) { return QStringLiteral("color: palette(mid);"); });
    token_counter_->setFullText(tr("%1 tokens \u00b7 %2 of %3 left in the context after it")
                                    .arg(measure->draft_tokens)
                                    .arg(std::max(0, measure->context_limit - measure->prompt_tokens))
                                    .arg(measure->context_limit));
  } else {
    set_palette_style_sheet(token_counter_, [](const QPalette& palette) {
      return QStringLiteral("color: %1; font-weight: bold;").arg(error_text_colour(palette).name());
    });
    token_counter_->setFullText(tr("%1 tokens: this message does not fit (the prompt would be %2 tokens, the "
                                   "context limit is %3). Shorten it or start a new chat.")
                                    .arg(measure->draft_tokens)
                                    .arg(measure->prompt_tokens)
                                    .arg(measure->context_limit));
  }
}

bool MainWindow::draft_fits() {
  const DraftKey key = draft_key();
  // The count shown is used when it is this draft's against the chat as it is now; else it is counted now (on
  // the counting thread, waited for) and shown.
  if (!shown_measure_key_ || !(*shown_measure_key_ == key)) {
    token_count_timer_.stop();
    draft_request_id_ = 0;
    show_token_count(key, key.editing_message_id != 0 ? controller_->measureEdit(key.text, key.editing_message_id)
                                                      : controller_->measureDraft(key.text));
  }
  if (!shown_measure_ || shown_measure_->fits) return true;
  show_notice(tr("Not sent: the message does not fit the context (see under the message box)."));
  return false;
}

void MainWindow::refresh_cache_gauge() {
  const kvchat::app::CacheGauge gauge = controller_->cacheGauge();
  cache_bar_->setRange(0, std::max(1, gauge.context_limit));
  if (gauge.on_server) {
    // The server keeps (or not) its own cache: only what it reported about the last prompt is known here.
    cache_bar_->setValue(0);
    cache_bar_->setFormat(tr("on the server"));
    QString text = tr("KV cache on the server");
    if (gauge.has_turn)
      text += tr(" \u00b7 %1 cached / %2 prefilled").arg(gauge.reused_tokens).arg(gauge.prefilled_tokens);
    cache_label_->setFullText(text);
    cache_label_->setToolTip(tr("Replies come from %1; its cache is its own. The figures are the cached_tokens it "
                                "reported for this chat's last prompt.")
                                 .arg(shown_base_url(controller_->settings())));
    return;
  }
  if (!gauge.cache_enabled) {
    cache_bar_->setValue(0);
    cache_bar_->setFormat(tr("cache off"));
    cache_label_->setFullText(tr("KV cache off: recomputing"));
    return;
  }
  cache_bar_->setValue(static_cast<int>(std::min<qint64>(gauge.conversation_tokens, std::max(1, gauge.context_limit))));
  cache_bar_->setFormat(QStringLiteral("%1/%2 tok").arg(gauge.conversation_tokens).arg(gauge.context_limit));
  // Wide enough for its own figures at the largest count this limit allows.
  cache_bar_->setMinimumWidth(
      cache_bar_->fontMetrics().horizontalAdvance(QStringLiteral("%1/%1 tok").arg(gauge.context_limit)) + 16);
  cache_bar_->setToolTip(
      tr("This chat's KV cache: %1 of the %2-token context").arg(gauge.conversation_tokens).arg(gauge.context_limit));
  QString text = tr("KV %1").arg(format_bytes(gauge.conversation_bytes));
  // What a token costs in this cache's storage type (half or about a quarter of f32's in bf16/f16/q8_0).
  if (gauge.conversation_tokens > 0)
    text += tr(" (%1 B/token, %2)")
                .arg(gauge.conversation_bytes / gauge.conversation_tokens)
                .arg(QString::fromLatin1(kvchat::to_string(gauge.kv_dtype)));
  // Nothing in memory yet, but a snapshot on disk (an earlier run's, or an evicted cache's): the next turn
  // restores from it rather than prefilling.
  if (gauge.conversation_tokens == 0 && gauge.snapshots_enabled && gauge.snapshot_tokens > 0)
    text = tr("KV on disk: %1 tokens, %2 (restored on the next turn)")
               .arg(gauge.snapshot_tokens)
               .arg(format_bytes(gauge.snapshot_bytes));
  if (gauge.has_turn && gauge.restored_tokens > 0)
    text += tr(" \u00b7 %1 restored from disk (%2 ms) / %3 reused in memory / %4 prefilled")
                .arg(gauge.restored_tokens)
                .arg(gauge.restore_ms, 0, 'f', 0)
                .arg(gauge.reused_tokens - gauge.restored_tokens)
                .arg(gauge.prefilled_tokens);
  else if (gauge.has_turn)
    text += tr(" \u00b7 %1 reused / %2 prefilled").arg(gauge.reused_tokens).arg(gauge.prefilled_tokens);
  text += tr(" \u00b7 all chats %1 of %2").arg(format_bytes(gauge.total_bytes), format_bytes(gauge.budget_bytes));
  if (gauge.snapshots_enabled && gauge.disk_bytes >= 0)
    text += tr(" \u00b7 disk %1 of %2")
                .arg(format_bytes(gauge.disk_bytes),
                     gauge.disk_budget_bytes > 0 ? format_bytes(gauge.disk_budget_bytes) : tr("no limit"));
  cache_label_->setFullText(text);
  QString tip =
      tr("Where this chat's last prompt came from: restored from a snapshot on disk, reused from the cache "
         "in memory, or prefilled.");
  if (gauge.snapshots_enabled)
    tip += gauge.snapshot_tokens > 0 ? tr("\nOn disk: a snapshot of %1 tokens (%2).")
                                           .arg(gauge.snapshot_tokens)
                                           .arg(format_bytes(gauge.snapshot_bytes))
                                     : tr("\nOn disk: no snapshot of this chat written in this session yet.");
  cache_label_->setToolTip(tip);
}

void MainWindow::refresh_reply_stats() {
  const auto stats = controller_->lastReplyStats();
  if (!stats) {
    reply_stats_label_->setFullText(QString());
    return;
  }
  if (controller_->lastReplyFromServer()) {
    // The server prefilled: there is no prefill speed to show, only what was seen from here.
    reply_stats_label_->setFullText(
        tr("last (server): TTFT %1 ms \u00b7 %2 tok").arg(stats->ttft_ms, 0, 'f', 0).arg(stats->generated_tokens));
    return;
  }
  reply_stats_label_->setFullText(tr("last: prefill %1 \u00b7 TTFT %2 ms \u00b7 %3 tok")
                                      .arg(format_rate(stats->prefill_tokens_per_second))
                                      .arg(stats->ttft_ms, 0, 'f', 1)
                                      .arg(stats->generated_tokens));
}

}  // namespace kvchat::ui
