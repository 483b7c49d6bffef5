#include "ui/chat_generation_dialog.h"

#include <algorithm>

#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QVBoxLayout>

#include "app/chat/chat_controller.h"
#include "ui/appearance.h"

namespace kvchat::ui {

using kvchat::app::GenerationPreset;

namespace {
// The combo's entry for values that match no preset.
const QString kCustomEntry = QStringLiteral("Custom");

// Where the dialog says why something typed in it was refused, in the error colour; hidden until then.
QLabel* problem_label(const char* name, QWidget* parent) {
  auto* label = new QLabel(parent);
  label->setObjectName(name);
  label->setWordWrap(true);
  set_palette_style_sheet(label, [](const QPalette& palette) {
    return QStringLiteral("color: %1;").arg(error_text_colour(palette).name());
  });
  label->hide();
  return label;
}
}  // namespace

QStringList ChatGenerationDialog::stop_texts_from_lines(const QString& text) {
  QStringList stops;
  for (const QString& line : text.split(QLatin1Char('\n'))) {
    QString stop;
    for (int i = 0; i < line.size(); ++i) {
      if (line[i] == QLatin1Char('\\') && i + 1 < line.size() &&
          (line[i + 1] == QLatin1Char('n') || line[i + 1] == QLatin1Char('\\'))) {
        stop += line[i + 1] == QLatin1Char('n') ? QLatin1Char('\n') : QLatin1Char('\\');
        ++i;
      } else {
        stop += line[i];
      }
    }
    if (!stop.isEmpty()) stops << stop;
  }
  return stops;
}

QString ChatGenerationDialog::lines_from_stop_texts(const QStringList& stops) {
  QStringList lines;
  for (QString stop : stops)
    lines << stop.replace(QLatin1Char('\\'), QStringLiteral("\\\\")).replace(QLatin1Char('\n'), QStringLiteral("\\n"));
  return lines.join(QLatin1Char('\n'));
}

QString ChatGenerationDialog::summary(const std::optional<GenerationPreset>& settings,
                                      const kvchat::app::ReplyFormat& reply_format) {
  const QString json = reply_format.is_text() ? QString() : tr(" \u00b7 JSON replies");
  if (!settings) return tr("Global settings") + json;
  if (settings->name.isEmpty()) return tr("Own settings") + json;
  return tr("Preset: %1").arg(settings->name) + json;
}

ChatGenerationDialog::ChatGenerationDialog(kvchat::app::ChatController* controller, qint64 conversation_id,
                                           QWidget* parent)
    : QDialog(parent), controller_(controller), conversation_id_(conversation_id) {
  setObjectName("chatGenerationDialog");
  setWindowTitle(tr("Generation settings for this chat"));
  auto* layout = new QVBoxLayout(this);
  follow_global_ = new QCheckBox(tr("&Follow the global settings (Settings > Generation)"), this);
  follow_global_->setObjectName("followGlobalCheck");
  layout->addWidget(follow_global_);

  values_ = new QWidget(this);
  auto* form = new QFormLayout(values_);
  form->setContentsMargins(0, 0, 0, 0);
  preset_ = new QComboBox(values_);
  preset_->setObjectName("presetCombo");
  form->addRow(tr("&Preset:"), preset_);
  temperature_ = new QDoubleSpinBox(values_);
  temperature_->setObjectName("temperatureSpin");
  temperature_->setRange(0.0, 5.0);
  temperature_->setSingleStep(0.05);
  temperature_->setDecimals(2);
  temperature_->setSpecialValueText(tr("0 (greedy)"));
  form->addRow(tr("&Temperature:"), temperature_);
  top_p_ = new QDoubleSpinBox(values_);
  top_p_->setObjectName("topPSpin");
  top_p_->setRange(0.0, 1.0);
  top_p_->setSingleStep(0.01);
  top_p_->setDecimals(2);
  form->addRow(tr("Top-&p:"), top_p_);
  top_k_ = new QSpinBox(values_);
  top_k_->setObjectName("topKSpin");
  top_k_->setRange(0, 1 << 20);
  top_k_->setSpecialValueText(tr("off"));
  form->addRow(tr("Top-&k:"), top_k_);
  min_p_ = new QDoubleSpinBox(values_);
  min_p_->setObjectName("minPSpin");
  min_p_->setRange(0.0, 1.0);
  min_p_->setSingleStep(0.01);
  min_p_->setDecimals(2);
  form->addRow(tr("&Min-p:"), min_p_);
  max_tokens_ = new QSpinBox(values_);
  max_tokens_->setObjectName("maxTokensSpin");
  max_tokens_->setRange(0, 1 << 20);
  max_tokens_->setSpecialValueText(tr("global (%1)").arg(controller_->settings().max_new_tokens));
  form->addRow(tr("Max &tokens:"), max_tokens_);
  stop_texts_ = new QPlainTextEdit(values_);
  stop_texts_->setObjectName("stopTextsEdit");
  stop_texts_->setTabChangesFocus(true);
  stop_texts_->setPlaceholderText(tr("One per line; \\n for a line break"));
  stop_texts_->setFixedHeight(stop_texts_->fontMetrics().lineSpacing() * 4 + 12);
  stop_texts_->setToolTip(tr("The reply stops before the first of these texts, which is neither shown nor kept"));
  form->addRow(tr("&Stop texts:"), stop_texts_);
  auto* save_row = new QHBoxLayout;
  preset_name_ = new QLineEdit(values_);
  preset_name_->setObjectName("presetNameEdit");
  preset_name_->setPlaceholderText(tr("Name of a new preset"));
  save_preset_ = new QPushButton(tr("Save as p&reset"), values_);
  save_preset_->setObjectName("savePresetButton");
  save_preset_->setAutoDefault(false);
  delete_preset_ = new QPushButton(tr("&Delete preset"), values_);
  delete_preset_->setObjectName("deletePresetButton");
  delete_preset_->setAutoDefault(false);
  delete_preset_->setToolTip(tr("Removes the chosen preset of yours (chats that used it keep their values)"));
  save_row->addWidget(preset_name_, 1);
  save_row->addWidget(save_preset_);
  save_row->addWidget(delete_preset_);
  form->addRow(QString(), save_row);
  preset_problem_ = problem_label("presetProblemLabel", values_);
  form->addRow(QString(), preset_problem_);
  layout->addWidget(values_);

  // The reply format is the chat's own whatever the sampling follows.
  auto* format_form = new QFormLayout;
  reply_format_ = new QComboBox(this);
  reply_format_->setObjectName("replyFormatCombo");
  reply_format_->addItem(tr("Free text"));
  reply_format_->addItem(tr("JSON (any object)"));
  reply_format_->addItem(tr("JSON matching a schema"));
  reply_format_->setToolTip(
      tr("A JSON format constrains every token of a reply, so that the reply is always valid JSON (and valid "
         "against the schema)"));
  format_form->addRow(tr("&Replies:"), reply_format_);
  reply_schema_ = new QPlainTextEdit(this);
  reply_schema_->setObjectName("replySchemaEdit");
  reply_schema_->setTabChangesFocus(true);
  reply_schema_->setPlaceholderText(
      tr("A JSON schema, e.g. {\"type\": \"object\", \"properties\": {\"answer\": {\"type\": \"string\"}}, "
         "\"required\": [\"answer\"]}"));
  reply_schema_->setFixedHeight(reply_schema_->fontMetrics().lineSpacing() * 6 + 12);
  format_form->addRow(tr("S&chema:"), reply_schema_);
  reply_format_problem_ = problem_label("replyFormatProblemLabel", this);
  format_form->addRow(QString(), reply_format_problem_);
  layout->addLayout(format_form);
  const kvchat::app::ReplyFormat format = controller_->chatReplyFormat(conversation_id_);
  reply_format_->setCurrentIndex(static_cast<int>(format.kind));
  reply_schema_->setPlainText(format.schema);
  refresh_schema_edit();
  connect(reply_format_, &QComboBox::currentIndexChanged, this, &ChatGenerationDialog::refresh_schema_edit);

  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
  layout->addWidget(buttons);
  connect(buttons, &QDialogButtonBox::accepted, this, &ChatGenerationDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);

  const std::optional<GenerationPreset> own = controller_->chatGenerationSettings(conversation_id_);
  follow_global_->setChecked(!own);
  values_->setEnabled(own.has_value());
  const GenerationPreset shown = own ? *own : GenerationPreset::from_settings(controller_->settings());
  fill_presets(own ? own->name : QString());
  show_values(shown);
  if (!own) values_edited();  // the global values: named after the preset they match, if any

  connect(follow_global_, &QCheckBox::toggled, values_, [this](bool follow) { values_->setEnabled(!follow); });
  connect(preset_, &QComboBox::activated, this, [this](int index) {
    for (const GenerationPreset& preset : controller_->presets())
      if (preset.name == preset_->itemText(index)) show_values(preset);
  });
  for (QDoubleSpinBox* spin : {temperature_, top_p_, min_p_})
    connect(spin, &QDoubleSpinBox::valueChanged, this, &ChatGenerationDialog::values_edited);
  for (QSpinBox* spin : {top_k_, max_tokens_})
    connect(spin, &QSpinBox::valueChanged, this, &ChatGenerationDialog::values_edited);
  connect(stop_texts_, &QPlainTextEdit::textChanged, this, &ChatGenerationDialog::values_edited);
  connect(save_preset_, &QPushButton::clicked, this, &ChatGenerationDialog::save_as_preset);
  connect(delete_preset_, &QPushButton::clicked, this, &ChatGenerationDialog::delete_preset);
  connect(preset_, &QComboBox::currentIndexChanged, this, &ChatGenerationDialog::refresh_delete_button);
  refresh_delete_button();
  connect(preset_name_, &QLineEdit::returnPressed, this, &ChatGenerationDialog::save_as_preset);
}

void ChatGenerationDialog::fill_presets(const QString& selected) {
  filling_ = true;
  preset_->clear();
  for (const GenerationPreset& preset : controller_->presets()) preset_->addItem(preset.name);
  preset_->addItem(kCustomEntry);
  const int index = selected.isEmpty() ? -1 : preset_->findText(selected);
  preset_->setCurrentIndex(index >= 0 ? index : preset_->count() - 1);
  filling_ = false;
}

void ChatGenerationDialog::show_values(const GenerationPreset& preset) {
  filling_ = true;
  temperature_->setValue(preset.temperature);
  top_p_->setValue(preset.top_p);
  top_k_->setValue(preset.top_k);
  min_p_->setValue(preset.min_p);
  max_tokens_->setValue(preset.max_new_tokens);
  stop_texts_->setPlainText(lines_from_stop_texts(preset.stop_texts));
  const int index = preset.name.isEmpty() ? -1 : preset_->findText(preset.name);
  preset_->setCurrentIndex(index >= 0 ? index : preset_->count() - 1);
  filling_ = false;
}

void ChatGenerationDialog::values_edited() {
  if (filling_) return;
  GenerationPreset values;
  values.temperature = temperature_->value();
  values.top_p = top_p_->value();
  values.top_k = top_k_->value();
  values.min_p = min_p_->value();
  values.max_new_tokens = max_tokens_->value();
  values.stop_texts = stop_texts_from_lines(stop_texts_->toPlainText());
  QString match;
  for (const GenerationPreset& preset : controller_->presets())
    if (preset.same_values(values)) {
      match = preset.name;
      break;
    }
  const int index = match.isEmpty() ? preset_->count() - 1 : preset_->findText(match);
  filling_ = true;
  preset_->setCurrentIndex(index);
  filling_ = false;
}

std::optional<GenerationPreset> ChatGenerationDialog::chosenSettings() const {
  if (follow_global_->isChecked()) return std::nullopt;
  GenerationPreset values;
  values.name = preset_->currentText() == kCustomEntry ? QString() : preset_->currentText();
  values.temperature = temperature_->value();
  values.top_p = top_p_->value();
  values.top_k = top_k_->value();
  values.min_p = min_p_->value();
  values.max_new_tokens = max_tokens_->value();
  values.stop_texts = stop_texts_from_lines(stop_texts_->toPlainText());
  return values;
}

kvchat::app::ReplyFormat ChatGenerationDialog::chosenReplyFormat() const {
  kvchat::app::ReplyFormat format;
  format.kind = static_cast<kvchat::app::ReplyFormat::Kind>(reply_format_->currentIndex());
  if (format.kind == kvchat::app::ReplyFormat::Kind::JsonSchema) format.schema = reply_schema_->toPlainText().trimmed();
  return format;
}

void ChatGenerationDialog::refresh_schema_edit() {
  reply_schema_->setEnabled(reply_format_->currentIndex() ==
                            static_cast<int>(kvchat::app::ReplyFormat::Kind::JsonSchema));
}

void ChatGenerationDialog::accept() {
  // Refused here, where the schema was typed: the dialog stays open with what to change.
  const QString problem = controller_->setChatReplyFormat(conversation_id_, chosenReplyFormat());
  reply_format_problem_->setText(problem.isEmpty() ? QString() : tr("This schema cannot be used: %1").arg(problem));
  reply_format_problem_->setVisible(!problem.isEmpty());
  if (!problem.isEmpty()) {
    reply_schema_->setFocus();
    return;
  }
  controller_->setChatGenerationSettings(conversation_id_, chosenSettings());
  QDialog::accept();
}

void ChatGenerationDialog::save_as_preset() {
  std::optional<GenerationPreset> values = chosenSettings();
  if (!values) return;
  values->name = preset_name_->text().trimmed();
  // Refused here, where the name was typed (not in the transcript behind the dialog).
  const QString problem = controller_->presetNameProblem(values->name);
  preset_problem_->setText(problem);
  preset_problem_->setVisible(!problem.isEmpty());
  if (!problem.isEmpty() || !controller_->saveUserPreset(*values)) return;
  fill_presets(values->name);
  preset_name_->clear();
  refresh_delete_button();
}

void ChatGenerationDialog::delete_preset() {
  const QString name = preset_->currentText();
  controller_->removeUserPreset(name);
  fill_presets(QString());  // the values stay, now under "Custom"
  values_edited();
  refresh_delete_button();
}

void ChatGenerationDialog::refresh_delete_button() {
  const QList<GenerationPreset> mine = controller_->userPresets();
  const QString current = preset_->currentText();
  delete_preset_->setEnabled(
      std::any_of(mine.cbegin(), mine.cend(), [&](const GenerationPreset& preset) { return preset.name == current; }));
}

}  // namespace kvchat::ui
