#pragma once
// The settings dialog: the backend (this computer, or an OpenAI-compatible server), KV cache on/off, sampling, limits,
// the default system prompt, the model (a directory or a .gguf file), threads, the context limit and its overflow
// policy, the cache memory budget. It edits a copy of the settings; the caller applies settings() when the dialog is
// accepted (from the next turn on).
#include <QDialog>
#include <QList>

#include "app/settings.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QFileDialog;
class QFormLayout;
class QLabel;
class QLineEdit;
class QPushButton;
class QPlainTextEdit;
class QScrollArea;
class QSpinBox;
class QVBoxLayout;

namespace kvchat::ui {

class SettingsDialog : public QDialog {
  Q_OBJECT
 public:
  explicit SettingsDialog(const kvchat::app::ChatSettings& settings, QWidget* parent = nullptr);
  kvchat::app::ChatSettings settings() const;
  // A section of settings kept apart from the chat settings (its owner reads them back), above the buttons.
  void addSection(QWidget* section);
  // The loaded model's own limit: the context limit cannot be set past it, and the dialog says so.
  void setModelContextLength(int tokens);

  // The model field's pickers, non-modal (object names "modelFileDialog", "modelDirectoryDialog"): the
  // chosen path fills the field. Also behind the "File…" and "Folder…" buttons.
  QFileDialog* browseModelFile();
  QFileDialog* browseModelDirectory();
  QFileDialog* browseDraftModelFile();  // speculative decoding's draft model

  // Asks the server for its /v1/models on a thread of its own (the "Fetch models" button), so a slow or
  // unreachable server never freezes the window; then fills the model list, and the status line says how
  // many or why not, and modelsFetched(count) follows (0 on failure).
  void fetchRemoteModels();

 Q_SIGNALS:
  void modelsFetched(int count);

 protected:
  void showEvent(QShowEvent* event) override;

 private:
  void add_backend_rows(QFormLayout* form, const kvchat::app::ChatSettings& settings);
  void refresh_local_only_rows();  // greyed out while the backend is a server
  kvchat::app::ChatSettings original_;
  QComboBox* backend_ = nullptr;
  QLineEdit* remote_url_ = nullptr;
  QLineEdit* remote_key_ = nullptr;
  QComboBox* remote_model_ = nullptr;
  QLabel* remote_status_ = nullptr;
  QCheckBox* kv_cache_ = nullptr;
  QComboBox* kv_dtype_ = nullptr;
  QComboBox* speculative_ = nullptr;
  QLineEdit* draft_model_path_ = nullptr;
  QPushButton* browse_draft_model_ = nullptr;
  QCheckBox* model_titles_ = nullptr;
  QCheckBox* long_context_ = nullptr;
  QDoubleSpinBox* temperature_ = nullptr;
  QSpinBox* top_k_ = nullptr;
  QSpinBox* remote_idle_timeout_ = nullptr;
  QSpinBox* remote_reply_timeout_ = nullptr;
  QDoubleSpinBox* top_p_ = nullptr;
  QDoubleSpinBox* min_p_ = nullptr;
  QDoubleSpinBox* repetition_penalty_ = nullptr;
  QLineEdit* seed_ = nullptr;
  QSpinBox* max_new_tokens_ = nullptr;
  QPlainTextEdit* system_prompt_ = nullptr;
  QLineEdit* model_path_ = nullptr;
  QSpinBox* threads_ = nullptr;
  QSpinBox* context_limit_ = nullptr;
  QLabel* context_limit_note_ = nullptr;
  QComboBox* overflow_ = nullptr;
  QSpinBox* cache_budget_mib_ = nullptr;
  QCheckBox* snapshots_ = nullptr;
  QSpinBox* snapshot_budget_mib_ = nullptr;
  QLineEdit* snapshot_directory_ = nullptr;
  QVBoxLayout* sections_ = nullptr;
  QList<QWidget*> local_only_;  // the fields (and their labels) only this computer's engine uses
  QLabel* local_only_hint_ = nullptr;
  QScrollArea* scroll_area_ = nullptr;  // everything but the buttons
};

}  // namespace kvchat::ui
