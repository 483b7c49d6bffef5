#pragma once
// The settings dialog's "Local server" section: Serve the loaded model on localhost:PORT (the OpenAI
// API of `kvchat-cli serve`, on the app's model), its port and an optional API key. Its own section and
// its own settings (LocalServerSettings), apart from the chat settings above it.
#include <QGroupBox>

#include "app/server/local_server.h"

class QCheckBox;
class QLineEdit;
class QSpinBox;

namespace kvchat::ui {

class LocalServerGroup : public QGroupBox {
  Q_OBJECT
 public:
  explicit LocalServerGroup(const kvchat::app::LocalServerSettings& settings, QWidget* parent = nullptr);
  kvchat::app::LocalServerSettings settings() const;

 private:
  void update_label();
  kvchat::app::LocalServerSettings original_;
  QCheckBox* enabled_ = nullptr;
  QSpinBox* port_ = nullptr;
  QLineEdit* api_key_ = nullptr;
};

}  // namespace kvchat::ui
