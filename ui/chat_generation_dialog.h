#pragma once
// Chat > Generation settings for this chat ("chatGenerationDialog"): whether the chat follows the global
// settings, or its own values (temperature, top-p, top-k, min-p, max tokens, stop texts), filled from a
// preset ("presetCombo": the built-in ones, then the user's) and changeable; the values can be saved as a
// preset of the user's. Apart from those, the chat's reply format ("replyFormatCombo"): free text, any JSON
// object, or JSON valid against a schema ("replySchemaEdit"). Applied to the chat when accepted; a schema the
// constraint cannot take keeps the dialog open and says why ("replyFormatProblemLabel").
#include <QDialog>

#include <optional>

#include "app/chat/generation_preset.h"
#include "app/chat/reply_format.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLineEdit;
class QPlainTextEdit;
class QLabel;
class QPushButton;
class QSpinBox;

namespace kvchat::app {
class ChatController;
}

namespace kvchat::ui {

class ChatGenerationDialog : public QDialog {
  Q_OBJECT
 public:
  ChatGenerationDialog(kvchat::app::ChatController* controller, qint64 conversation_id, QWidget* parent = nullptr);

  // What the dialog would save: nullopt = the chat follows the global settings.
  std::optional<kvchat::app::GenerationPreset> chosenSettings() const;
  kvchat::app::ReplyFormat chosenReplyFormat() const;
  // One stop text per line; "\n" in a line is a line break, "\\" a backslash.
  static QStringList stop_texts_from_lines(const QString& text);
  static QString lines_from_stop_texts(const QStringList& stops);
  // The header button's words for a chat's settings: "Global settings", "Preset: Precise" or "Own settings",
  // followed by " · JSON replies" when the chat's replies are JSON.
  static QString summary(const std::optional<kvchat::app::GenerationPreset>& settings,
                         const kvchat::app::ReplyFormat& reply_format = {});

 public Q_SLOTS:
  void accept() override;  // saves; stays open when the reply format is refused

 private:
  void show_values(const kvchat::app::GenerationPreset& preset);
  void fill_presets(const QString& selected);
  void values_edited();  // the preset shown becomes "Custom" once the values differ from it
  void save_as_preset();
  void delete_preset();
  void refresh_delete_button();  // enabled for a preset of the user's
  void refresh_schema_edit();    // enabled for a schema format

  kvchat::app::ChatController* controller_;
  qint64 conversation_id_;
  bool filling_ = false;
  QCheckBox* follow_global_ = nullptr;
  QComboBox* preset_ = nullptr;
  QDoubleSpinBox* temperature_ = nullptr;
  QDoubleSpinBox* top_p_ = nullptr;
  QSpinBox* top_k_ = nullptr;
  QDoubleSpinBox* min_p_ = nullptr;
  QSpinBox* max_tokens_ = nullptr;
  QPlainTextEdit* stop_texts_ = nullptr;
  QLineEdit* preset_name_ = nullptr;
  QPushButton* save_preset_ = nullptr;
  QPushButton* delete_preset_ = nullptr;
  QLabel* preset_problem_ = nullptr;  // why a name was refused, in the dialog itself
  QWidget* values_ = nullptr;
  QComboBox* reply_format_ = nullptr;
  QPlainTextEdit* reply_schema_ = nullptr;
  QLabel* reply_format_problem_ = nullptr;
};

}  // namespace kvchat::ui
