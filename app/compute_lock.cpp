#include "app/compute_lock.h"

namespace kvchat::app {

std::shared_mutex& compute_settings_mutex() {
  static std::shared_mutex mutex;
  return mutex;
}

}  // namespace kvchat::app
