#include "app/server/local_server_host.h"

#include <QSettings>

namespace kvchat::app {

LocalServerHost::LocalServerHost(QSettings* settings_storage, QObject* parent)
    : QObject(parent),
      settings_storage_(settings_storage),
      settings_(LocalServerSettings::load(*settings_storage)),
      server_(new LocalServer(this)) {}

LocalServerHost::~LocalServerHost() { server_->stop(); }

void LocalServerHost::applySettings(const LocalServerSettings& settings) {
  settings_ = settings;
  settings_.save(*settings_storage_);
  apply();
}

void LocalServerHost::serve(std::shared_ptr<const LoadedModel> model, std::int64_t budget_bytes, int threads) {
  model_ = std::move(model);
  budget_bytes_ = budget_bytes;
  threads_ = threads;
  apply();
}

void LocalServerHost::stop() { server_->stop(); }

void LocalServerHost::apply() { server_->apply(settings_, model_, budget_bytes_, threads_); }

}  // namespace kvchat::app
