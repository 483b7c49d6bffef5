#include "app/server/broken_pipe.h"

#include <csignal>

namespace kvchat::app {

void ignore_broken_pipe_signals() {
  // Idempotent and cheap: called before every client and server is made.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace kvchat::app
