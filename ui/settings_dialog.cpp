#include "ui/settings_dialog.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QRegularExpressionValidator>
#include <QScreen>
#include <QScrollArea>
#include <QScrollBar>
#include <QSpinBox>
#include <QThread>
#include <QVBoxLayout>

#include <algorithm>
#include <memory>

#include "app/remote/remote_client.h"
#include "ui/stats_format.h"

namespace kvchat::ui {

namespace {
constexpr qint64 kMiB = 1024 * 1024;
// The tallest the dialog opens: a 768 px screen less its panels and the title bar.
constexpr int kMaxHeight = 640;

QDoubleSpinBox* make_double(double minimum, double maximum, double step, int decimals, double value, QWidget* parent) {
  auto* box = new QDoubleSpinBox(parent);
  box->setRange(minimum, maximum);
  box->setSingleStep(step);
  box->setDecimals(decimals);
  box->setValue(value);
  return box;
}

QSpinBox* make_int(int minimum, int maximum, int value, QWidget* parent) {
  auto* box = new QSpinBox(parent);
  box->setRange(minimum, maximum);
  box->setValue(value);
  return box;
}
}  // namespace

SettingsDialog::SettingsDialog(const kvchat::app::ChatSettings& settings, QWidget* parent)
    : QDialog(parent), original_(settings) {
  setObjectName("settingsDialog");
  setWindowTitle(tr("Settings"));
  auto* form = new QFormLayout;
  add_backend_rows(form, settings);

  kv_cache_ = new QCheckBox(tr("Keep a KV cache per conversation (off: recompute every token)"), this);
  kv_cache_->setObjectName("kvCacheCheck");
  kv_cache_->setChecked(settings.kv_cache_enabled);
  form->addRow(tr("KV cache"), kv_cache_);
  kv_dtype_ = new QComboBox(this);
  kv_dtype_->setObjectName("kvDtypeCombo");
  kv_dtype_->addItem(tr("32-bit float (exact)"), QString::fromLatin1(kvchat::to_string(kvchat::KvDtype::F32)));
  kv_dtype_->addItem(tr("bfloat16 (half the memory)"), QString::fromLatin1(kvchat::to_string(kvchat::KvDtype::BF16)));
  kv_dtype_->addItem(tr("float16 (half the memory)"), QString::fromLatin1(kvchat::to_string(kvchat::KvDtype::F16)));
  kv_dtype_->addItem(tr("8-bit q8_0 (about a quarter)"), QString::fromLatin1(kvchat::to_string(kvchat::KvDtype::Q8_0)));
  kv_dtype_->setCurrentIndex(kv_dtype_->findData(QString::fromLatin1(kvchat::to_string(settings.kv_dtype))));
  kv_dtype_->setToolTip(
      tr("How the cache stores each key and value. Below 32 bits they are rounded once, when made, on every path, so "
         "the cache still changes no word; a long chat holds less memory and reads fewer bytes per word. Changing it "
         "rebuilds the conversations' caches."));
  form->addRow(tr("KV cache storage"), kv_dtype_);
  speculative_ = new QComboBox(this);
  speculative_->setObjectName("speculativeCombo");
  speculative_->addItem(tr("Off"), QString::fromLatin1(kvchat::to_string(kvchat::SpeculativeMode::None)));
  speculative_->addItem(tr("Prompt lookup"), QString::fromLatin1(kvchat::to_string(kvchat::SpeculativeMode::Lookup)));
  speculative_->setToolTip(
      tr("Proposes the words that followed the same few words earlier in the chat and checks them in one pass: "
         "faster when a reply repeats or edits earlier text, and the reply is the same word for word (needs the "
         "KV cache)"));
  speculative_->addItem(tr("Draft model"), QString::fromLatin1(kvchat::to_string(kvchat::SpeculativeMode::DraftModel)));
  speculative_->setItemData(
      2, tr("A smaller model of the same tokenizer proposes the next words; the reply is the same word for word"),
      Qt::ToolTipRole);
  speculative_->setCurrentIndex(settings.speculative == kvchat::SpeculativeMode::Lookup       ? 1
                                : settings.speculative == kvchat::SpeculativeMode::DraftModel ? 2
                                                                                              : 0);
  form->addRow(tr("Speculative decoding"), speculative_);
  draft_model_path_ = new QLineEdit(settings.draft_model_path, this);
  draft_model_path_->setObjectName("draftModelPathEdit");
  draft_model_path_->setPlaceholderText(tr("the draft model: a .gguf file or a directory, same tokenizer"));
  browse_draft_model_ = new QPushButton(tr("File\u2026"), this);
  browse_draft_model_->setObjectName("browseDraftModelButton");
  connect(browse_draft_model_, &QPushButton::clicked, this, &SettingsDialog::browseDraftModelFile);
  auto* draft_row = new QHBoxLayout;
  draft_row->addWidget(draft_model_path_);
  draft_row->addWidget(browse_draft_model_);
  form->addRow(tr("Draft model"), draft_row);
  connect(speculative_, &QComboBox::currentIndexChanged, this, &SettingsDialog::refresh_local_only_rows);
  model_titles_ = new QCheckBox(tr("Title new chats with the model"), this);
  model_titles_->setObjectName("modelTitlesCheck");
  model_titles_->setToolTip(
      tr("After a new chat's first reply, the loaded model is asked for a short title (a "
         "separate generation: the chat's cache is not touched)"));
  model_titles_->setChecked(settings.model_titles);
  form->addRow(tr("Chat titles"), model_titles_);

  temperature_ = make_double(0.0, 2.0, 0.05, 2, settings.temperature, this);
  temperature_->setObjectName("temperatureSpin");
  temperature_->setToolTip(tr("0 = greedy (always the most likely token)"));
  form->addRow(tr("Temperature"), temperature_);
  top_k_ = make_int(0, 100000, settings.top_k, this);
  top_k_->setObjectName("topKSpin");
  top_k_->setSpecialValueText(tr("off"));
  top_k_->setToolTip(tr("On a server: sent as top_k (vLLM, llama-server)"));
  form->addRow(tr("Top-k"), top_k_);
  top_p_ = make_double(0.0, 1.0, 0.01, 3, settings.top_p, this);
  top_p_->setObjectName("topPSpin");
  form->addRow(tr("Top-p"), top_p_);
  min_p_ = make_double(0.0, 1.0, 0.01, 3, settings.min_p, this);
  min_p_->setObjectName("minPSpin");
  min_p_->setToolTip(tr("On a server: sent as min_p (vLLM, llama-server)"));
  form->addRow(tr("Min-p"), min_p_);
  repetition_penalty_ = make_double(0.5, 3.0, 0.05, 2, settings.repetition_penalty, this);
  repetition_penalty_->setObjectName("repetitionPenaltySpin");
  repetition_penalty_->setToolTip(
      tr("On a server: sent as repetition_penalty (vLLM) and repeat_penalty "
         "(llama-server)"));
  form->addRow(tr("Repetition penalty"), repetition_penalty_);
  seed_ = new QLineEdit(QString::number(settings.seed), this);
  seed_->setObjectName("seedEdit");
  seed_->setValidator(new QRegularExpressionValidator(QRegularExpression("[0-9]{1,19}"), seed_));
  seed_->setToolTip(tr("0 = a fresh random seed each turn; at most %1").arg(kvchat::app::ChatSettings::kMaxSeed));
  form->addRow(tr("Seed"), seed_);
  max_new_tokens_ = make_int(1, 1 << 20, settings.max_new_tokens, this);
  max_new_tokens_->setObjectName("maxNewTokensSpin");
  form->addRow(tr("Max new tokens"), max_new_tokens_);

  system_prompt_ = new QPlainTextEdit(settings.default_system_prompt, this);
  system_prompt_->setObjectName("systemPromptEdit");
  system_prompt_->setPlaceholderText(tr("Default system prompt for new chats (each chat can change its own)"));
  system_prompt_->setMaximumHeight(80);
  form->addRow(tr("System prompt"), system_prompt_);

  auto* model_row = new QHBoxLayout;
  model_path_ = new QLineEdit(settings.model_path, this);
  model_path_->setObjectName("modelPathEdit");
  model_path_->setPlaceholderText(tr("a .gguf file or a model directory; empty = the embedded stories260K"));
  auto* browse_file = new QPushButton(tr("File\u2026"), this);
  browse_file->setObjectName("browseModelFileButton");
  browse_file->setToolTip(tr("Choose a GGUF model file"));
  connect(browse_file, &QPushButton::clicked, this, &SettingsDialog::browseModelFile);
  auto* browse_directory = new QPushButton(tr("Folder\u2026"), this);
  browse_directory->setObjectName("browseModelDirectoryButton");
  browse_directory->setToolTip(tr("Choose a Hugging Face model directory (config.json, safetensors)"));
  connect(browse_directory, &QPushButton::clicked, this, &SettingsDialog::browseModelDirectory);
  model_row->addWidget(model_path_);
  model_row->addWidget(browse_file);
  model_row->addWidget(browse_directory);
  form->addRow(tr("Model"), model_row);

  threads_ = make_int(0, kvchat::app::ChatSettings::max_threads(), settings.threads, this);
  threads_->setObjectName("threadsSpin");
  threads_->setSpecialValueText(tr("all cores"));
  form->addRow(tr("Threads"), threads_);
  context_limit_ = make_int(0, 1 << 24, settings.context_limit, this);
  context_limit_->setObjectName("contextLimitSpin");
  context_limit_->setSpecialValueText(tr("the model's"));
  context_limit_note_ = new QLabel(this);
  context_limit_note_->setObjectName("contextLimitNote");
  context_limit_note_->setStyleSheet("color: palette(mid);");
  context_limit_note_->setWordWrap(true);  // whole, on two lines if need be, rather than clipped
  context_limit_note_->hide();
  auto* context_row = new QHBoxLayout;
  context_row->addWidget(context_limit_);
  context_row->addWidget(context_limit_note_, 1);
  form->addRow(tr("Context limit (tokens)"), context_row);
  long_context_ = new QCheckBox(tr("Open Phi-3 models for their long context"), this);
  long_context_->setObjectName("longContextCheck");
  long_context_->setToolTip(
      tr("LongRoPE models (Phi-3.5-mini, Phi-4-mini) take their long factors at every position and their whole "
         "context (131,072 tokens), as llama.cpp does past the original context; off, the short factors within the "
         "original one (4,096), where they compute what transformers does. Other models are not affected. The model "
         "loads again when this changes."));
  long_context_->setChecked(settings.long_context);
  form->addRow(tr("Long context"), long_context_);
  overflow_ = new QComboBox(this);
  overflow_->setObjectName("overflowCombo");
  overflow_->addItem(tr("Stop with a message"),
                     QString::fromLatin1(to_string(kvchat::app::ContextOverflowPolicy::Stop)));
  overflow_->addItem(tr("Drop the oldest turns"),
                     QString::fromLatin1(to_string(kvchat::app::ContextOverflowPolicy::DropOldestTurns)));
  overflow_->setCurrentIndex(settings.context_overflow == kvchat::app::ContextOverflowPolicy::Stop ? 0 : 1);
  form->addRow(tr("When the context is full"), overflow_);
  cache_budget_mib_ = make_int(0, 1 << 22, static_cast<int>(settings.cache_budget_bytes / kMiB), this);
  cache_budget_mib_->setObjectName("cacheBudgetSpin");
  cache_budget_mib_->setSuffix(tr(" MiB"));
  cache_budget_mib_->setSpecialValueText(
      tr("default (%1)").arg(format_bytes(kvchat::app::ChatSettings{}.effective_cache_budget_bytes())));
  form->addRow(tr("Cache memory budget"), cache_budget_mib_);
  snapshots_ = new QCheckBox(tr("Keep each chat's KV cache on disk too"), this);
  snapshots_->setObjectName("snapshotsCheck");
  snapshots_->setChecked(settings.kv_snapshots_enabled);
  snapshots_->setToolTip(
      tr("A chat continued after a restart (or an eviction) restores its prompt from disk "
         "instead of prefilling it again"));
  form->addRow(tr("KV snapshots"), snapshots_);
  snapshot_budget_mib_ = make_int(0, 1 << 24, static_cast<int>(settings.snapshot_disk_budget_bytes / kMiB), this);
  snapshot_budget_mib_->setObjectName("snapshotBudgetSpin");
  snapshot_budget_mib_->setSuffix(tr(" MiB"));
  snapshot_budget_mib_->setSpecialValueText(tr("no limit"));
  form->addRow(tr("Snapshot disk budget"), snapshot_budget_mib_);
  snapshot_directory_ = new QLineEdit(settings.snapshot_directory, this);
  snapshot_directory_->setObjectName("snapshotDirectoryEdit");
  snapshot_directory_->setPlaceholderText(kvchat::app::ChatSettings{}.effective_snapshot_directory());
  form->addRow(tr("Snapshot folder"), snapshot_directory_);

  // What only this computer's engine uses: greyed out (with the hint under the backend) for a server.
  for (QWidget* field : std::initializer_list<QWidget*>{
           kv_cache_, kv_dtype_, speculative_, threads_, context_limit_, long_context_, context_limit_note_, overflow_,
           cache_budget_mib_, snapshots_, snapshot_budget_mib_, snapshot_directory_, model_path_, browse_file,
           browse_directory})
    local_only_ << field;
  for (QObject* field :
       std::initializer_list<QObject*>{kv_cache_, kv_dtype_, speculative_, threads_, long_context_, overflow_,
                                       cache_budget_mib_, snapshots_, snapshot_budget_mib_, snapshot_directory_})
    if (QWidget* label = form->labelForField(static_cast<QWidget*>(field))) local_only_ << label;
  for (QLayout* row : {static_cast<QLayout*>(context_row), static_cast<QLayout*>(model_row)})
    if (QWidget* label = form->labelForField(row)) local_only_ << label;
  connect(backend_, &QComboBox::currentIndexChanged, this, &SettingsDialog::refresh_local_only_rows);
  refresh_local_only_rows();

  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  // The settings scroll under fixed buttons: the dialog fits a small screen (768 px high and less) whatever
  // sections are added, and OK / Cancel stay in reach.
  auto* page = new QWidget;
  page->setObjectName("settingsPage");
  auto* page_layout = new QVBoxLayout(page);
  page_layout->setContentsMargins(0, 0, 0, 0);
  page_layout->addLayout(form);
  sections_ = new QVBoxLayout;
  page_layout->addLayout(sections_);
  page_layout->addStretch(1);
  scroll_area_ = new QScrollArea(this);
  scroll_area_->setObjectName("settingsScrollArea");
  scroll_area_->setWidgetResizable(true);
  scroll_area_->setFrameShape(QFrame::NoFrame);
  scroll_area_->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  scroll_area_->setWidget(page);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(scroll_area_, 1);
  layout->addWidget(buttons);
}

void SettingsDialog::showEvent(QShowEvent* event) {
  // As large as the settings need, within the screen: beyond that they scroll.
  QWidget* page = scroll_area_->widget();
  const int scroll_bar = scroll_area_->verticalScrollBar()->sizeHint().width();
  scroll_area_->setMinimumWidth(page->sizeHint().width() + scroll_bar);
  const QScreen* screen = this->screen() ? this->screen() : QGuiApplication::primaryScreen();
  const int available = screen ? screen->availableGeometry().height() * 9 / 10 : kMaxHeight;
  const int wanted = page->sizeHint().height() + height() - scroll_area_->height() + 2;
  resize(width(), std::min({wanted, available, kMaxHeight}));
  QDialog::showEvent(event);
}

void SettingsDialog::addSection(QWidget* section) { sections_->addWidget(section); }

void SettingsDialog::add_backend_rows(QFormLayout* form, const kvchat::app::ChatSettings& settings) {
  backend_ = new QComboBox(this);
  backend_->setObjectName("backendCombo");
  backend_->addItem(tr("This computer"), QStringLiteral("local"));
  backend_->addItem(tr("OpenAI-compatible server"), QStringLiteral("remote"));
  backend_->setCurrentIndex(settings.backend == kvchat::app::BackendKind::Remote ? 1 : 0);
  form->addRow(tr("Backend"), backend_);
  local_only_hint_ = new QLabel(tr("On a server, the greyed-out settings do not apply: they are this computer's "
                                   "engine's. Temperature, top-p, top-k, min-p, the repetition penalty, the seed "
                                   "and max new tokens are sent with every request (README: Remote backend)."),
                                this);
  local_only_hint_->setObjectName("localOnlyHint");
  local_only_hint_->setWordWrap(true);
  local_only_hint_->setStyleSheet("color: palette(mid);");
  form->addRow(QString(), local_only_hint_);
  remote_url_ = new QLineEdit(settings.remote_base_url, this);
  remote_url_->setObjectName("remoteUrlEdit");
  remote_url_->setPlaceholderText(tr("http://localhost:8000/v1 (vLLM), :8080/v1 (llama-server), :11434/v1 (Ollama)"));
  form->addRow(tr("Server base URL"), remote_url_);
  remote_key_ = new QLineEdit(settings.remote_api_key, this);
  remote_key_->setObjectName("remoteApiKeyEdit");
  remote_key_->setEchoMode(QLineEdit::Password);
  remote_key_->setPlaceholderText(tr("none"));
  remote_key_->setToolTip(
      tr("Kept in a file of its own next to the settings (readable only by you), never in the chats"));
  form->addRow(tr("API key"), remote_key_);
  auto* model_row = new QHBoxLayout;
  remote_model_ = new QComboBox(this);
  remote_model_->setObjectName("remoteModelCombo");
  remote_model_->setEditable(true);
  remote_model_->setCurrentText(settings.remote_model);
  remote_model_->lineEdit()->setPlaceholderText(tr("the server's first model"));
  auto* fetch = new QPushButton(tr("Fetch models"), this);
  fetch->setObjectName("fetchModelsButton");
  connect(fetch, &QPushButton::clicked, this, &SettingsDialog::fetchRemoteModels);
  model_row->addWidget(remote_model_, 1);
  model_row->addWidget(fetch);
  form->addRow(tr("Server model"), model_row);
  // A silent server, or one that never ends a reply, ends the turn as failed (its text kept).
  auto* timeout_row = new QHBoxLayout;
  auto seconds_box = [&](const char* name, int value, const QString& tip) {
    auto* box = new QSpinBox(this);
    box->setObjectName(name);
    box->setRange(1, kvchat::app::ChatSettings::kMaxRemoteTimeout);
    box->setSuffix(tr(" s"));
    box->setValue(value);
    box->setToolTip(tip);
    return box;
  };
  remote_idle_timeout_ = seconds_box("remoteIdleTimeoutSpin", settings.remote_idle_timeout_s,
                                     tr("How long the server may send nothing (the first token included)"));
  remote_reply_timeout_ =
      seconds_box("remoteReplyTimeoutSpin", settings.remote_reply_timeout_s, tr("How long one reply may take in all"));
  timeout_row->addWidget(new QLabel(tr("silent for"), this));
  timeout_row->addWidget(remote_idle_timeout_);
  timeout_row->addWidget(new QLabel(tr("whole reply"), this));
  timeout_row->addWidget(remote_reply_timeout_);
  timeout_row->addStretch(1);
  form->addRow(tr("Give up when"), timeout_row);
  remote_status_ = new QLabel(this);
  remote_status_->setObjectName("remoteStatusLabel");
  remote_status_->setWordWrap(true);
  form->addRow(QString(), remote_status_);
}

void SettingsDialog::refresh_local_only_rows() {
  const bool local = backend_->currentData().toString() != QLatin1String("remote");
  for (QWidget* widget : local_only_) widget->setEnabled(local);
  local_only_hint_->setVisible(!local);
  // The draft model's file matters only with that mode.
  const bool draft = local && speculative_->currentData().toString() ==
                                  QLatin1String(kvchat::to_string(kvchat::SpeculativeMode::DraftModel));
  draft_model_path_->setEnabled(draft);
  browse_draft_model_->setEnabled(draft);
}

void SettingsDialog::fetchRemoteModels() {
  const kvchat::app::RemoteEndpoint endpoint{remote_url_->text().trimmed().toStdString(),
                                             remote_key_->text().toStdString(), ""};
  struct Answer {
    std::vector<std::string> models;
    QString error;
  };
  auto answer = std::make_shared<Answer>();
  QThread* thread = QThread::create([endpoint, answer] {
    try {
      answer->models = kvchat::app::list_remote_models(endpoint);
    } catch (const std::exception& error) {
      answer->error = QString::fromUtf8(error.what());
    }
  });
  remote_status_->setText(
      tr("Asking %1\u2026").arg(QString::fromStdString(kvchat::app::displayed_base_url(endpoint.base_url))));
  // Delivered on this (the GUI) thread; a dialog closed meanwhile simply gets nothing.
  connect(thread, &QThread::finished, this, [this, answer] {
    if (!answer->error.isEmpty()) {
      remote_status_->setText(answer->error);
      Q_EMIT modelsFetched(0);
      return;
    }
    const QString chosen = remote_model_->currentText().trimmed();
    remote_model_->clear();
    QStringList models;
    for (const std::string& model : answer->models) models << QString::fromStdString(model);
    remote_model_->addItems(models);
    QString status =
        models.size() == 1 ? tr("1 model on the server") : tr("%1 models on the server").arg(models.size());
    // A model this server does not have would be asked for on every turn (and named in the status bar):
    // its first one is taken instead, and the dialog says so.
    if (models.isEmpty() || models.contains(chosen)) {
      remote_model_->setCurrentText(chosen);
    } else {
      remote_model_->setCurrentText(models.front());
      if (!chosen.isEmpty())
        status += tr(". It has no \u201c%1\u201d: its first model, \u201c%2\u201d, is chosen instead.")
                      .arg(chosen, models.front());
    }
    remote_status_->setText(status);
    Q_EMIT modelsFetched(static_cast<int>(answer->models.size()));
  });
  connect(thread, &QThread::finished, thread, &QObject::deleteLater);
  thread->start();
}

void SettingsDialog::setModelContextLength(int tokens) {
  if (tokens <= 0) return;
  const int wanted = original_.context_limit;
  context_limit_->setMaximum(tokens);
  context_limit_note_->setText(tr("at most %1, the model's maximum").arg(tokens));
  context_limit_note_->show();
  context_limit_->setToolTip(tr("0 = the model's %1 tokens; it reads no more than that").arg(tokens));
  if (wanted > tokens) {
    context_limit_note_->setText(
        tr("at most %1, the model's maximum (the saved %2 is more than it reads)").arg(tokens).arg(wanted));
  }
}

kvchat::app::ChatSettings SettingsDialog::settings() const {
  kvchat::app::ChatSettings settings = original_;
  settings.backend = backend_->currentData().toString() == QLatin1String("remote") ? kvchat::app::BackendKind::Remote
                                                                                   : kvchat::app::BackendKind::Local;
  settings.remote_base_url = remote_url_->text().trimmed();
  settings.remote_api_key = remote_key_->text();
  settings.remote_model = remote_model_->currentText().trimmed();
  settings.remote_idle_timeout_s = remote_idle_timeout_->value();
  settings.remote_reply_timeout_s = remote_reply_timeout_->value();
  settings.kv_cache_enabled = kv_cache_->isChecked();
  settings.kv_dtype = kvchat::kv_dtype_from_string(kv_dtype_->currentData().toString().toStdString());
  settings.speculative = kvchat::speculative_mode_from_string(speculative_->currentData().toString().toStdString());
  settings.draft_model_path = draft_model_path_->text().trimmed();
  settings.model_titles = model_titles_->isChecked();
  settings.temperature = temperature_->value();
  settings.top_k = top_k_->value();
  settings.top_p = top_p_->value();
  settings.min_p = min_p_->value();
  settings.repetition_penalty = repetition_penalty_->value();
  settings.seed = std::min(seed_->text().toULongLong(), kvchat::app::ChatSettings::kMaxSeed);
  settings.max_new_tokens = max_new_tokens_->value();
  settings.default_system_prompt = system_prompt_->toPlainText();
  settings.model_path = model_path_->text().trimmed();
  settings.threads = threads_->value();
  settings.context_limit = context_limit_->value();
  settings.long_context = long_context_->isChecked();
  settings.context_overflow = kvchat::app::context_overflow_policy_from_string(overflow_->currentData().toString());
  // Whole MiB in the dialog; an unchanged field keeps the exact stored figure.
  const qint64 budget = static_cast<qint64>(cache_budget_mib_->value()) * kMiB;
  if (budget / kMiB != original_.cache_budget_bytes / kMiB) settings.cache_budget_bytes = budget;
  settings.kv_snapshots_enabled = snapshots_->isChecked();
  const qint64 disk_budget = static_cast<qint64>(snapshot_budget_mib_->value()) * kMiB;
  if (disk_budget / kMiB != original_.snapshot_disk_budget_bytes / kMiB)
    settings.snapshot_disk_budget_bytes = disk_budget;
  settings.snapshot_directory = snapshot_directory_->text().trimmed();
  return settings;
}

namespace {

// A picker that starts where the field points (a file's folder) and fills the field when accepted.
QFileDialog* open_model_picker(QWidget* parent, QLineEdit* field, const QString& title, bool file) {
  const QFileInfo current(field->text().trimmed());
  auto* dialog = new QFileDialog(parent, title, current.isFile() ? current.absolutePath() : current.filePath());
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  if (file) {
    dialog->setFileMode(QFileDialog::ExistingFile);
    dialog->setNameFilters({QObject::tr("GGUF models (*.gguf)"), QObject::tr("All files (*)")});
  } else {
    dialog->setFileMode(QFileDialog::Directory);
    dialog->setOption(QFileDialog::ShowDirsOnly, true);
  }
  QObject::connect(dialog, &QFileDialog::fileSelected, field, [field](const QString& path) {
    if (!path.isEmpty()) field->setText(path);
  });
  dialog->open();  // not exec(): tests find it among the dialog's children
  return dialog;
}

}  // namespace

QFileDialog* SettingsDialog::browseModelFile() {
  QFileDialog* dialog = open_model_picker(this, model_path_, tr("Model file"), true);
  dialog->setObjectName("modelFileDialog");
  return dialog;
}

QFileDialog* SettingsDialog::browseModelDirectory() {
  QFileDialog* dialog = open_model_picker(this, model_path_, tr("Model directory"), false);
  dialog->setObjectName("modelDirectoryDialog");
  return dialog;
}

QFileDialog* SettingsDialog::browseDraftModelFile() {
  QFileDialog* dialog = open_model_picker(this, draft_model_path_, tr("Draft model file"), true);
  dialog->setObjectName("draftModelFileDialog");
  return dialog;
}

}  // namespace kvchat::ui
