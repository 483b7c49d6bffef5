#include "ui/local_server_group.h"

#include <QCheckBox>
#include <QFormLayout>
#include <QLineEdit>
#include <QSpinBox>

namespace kvchat::ui {

LocalServerGroup::LocalServerGroup(const kvchat::app::LocalServerSettings& settings, QWidget* parent)
    : QGroupBox(tr("Local server"), parent), original_(settings) {
  setObjectName("localServerGroup");
  auto* form = new QFormLayout(this);
  enabled_ = new QCheckBox(this);
  enabled_->setObjectName("serveCheck");
  enabled_->setChecked(settings.enabled);
  enabled_->setToolTip(
      tr("The OpenAI API (as kvchat-cli serve) on the loaded model, for programs on this machine: "
         "base URL http://127.0.0.1:PORT/v1. The chats here keep working meanwhile."));
  form->addRow(enabled_);
  port_ = new QSpinBox(this);
  port_->setObjectName("servePortSpin");
  port_->setRange(1, 65535);
  port_->setValue(settings.port > 0 ? settings.port : kvchat::app::LocalServerSettings::kDefaultPort);
  form->addRow(tr("Port"), port_);
  api_key_ = new QLineEdit(settings.api_key, this);
  api_key_->setObjectName("serveApiKeyEdit");
  api_key_->setPlaceholderText(tr("none: any program on this machine may use it"));
  api_key_->setToolTip(tr("When set, clients must send Authorization: Bearer KEY"));
  form->addRow(tr("API key"), api_key_);
  connect(port_, qOverload<int>(&QSpinBox::valueChanged), this, &LocalServerGroup::update_label);
  update_label();
}

void LocalServerGroup::update_label() {
  enabled_->setText(tr("Serve the loaded model on localhost:%1").arg(port_->value()));
}

kvchat::app::LocalServerSettings LocalServerGroup::settings() const {
  kvchat::app::LocalServerSettings settings = original_;
  settings.enabled = enabled_->isChecked();
  settings.port = port_->value();
  settings.api_key = api_key_->text().trimmed();
  return settings;
}

}  // namespace kvchat::ui
