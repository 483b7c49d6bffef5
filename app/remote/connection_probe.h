#pragma once
// Whether the client of a request being served has closed its connection. cpp-httplib 0.11 gives a
// handler no socket (newer releases added Request::is_connection_closed), and a whole (non-streamed)
// reply writes nothing until it is done, so a client that leaves would otherwise be noticed only after
// its generation ran to the end. The probe finds the request's accepted socket among this process's
// descriptors by the request's two addresses, then polls it without reading or writing anything.
#include <string>

namespace kvchat::app::openai {

class ConnectionProbe {
 public:
  // The socket whose local and peer addresses are these (as httplib's Request reports them); when none
  // is found (not expected) the probe always answers "open".
  ConnectionProbe(const std::string& local_address, int local_port, const std::string& remote_address, int remote_port);
  // False once the peer has closed or reset the connection (an end of stream or an error is pending).
  // One poll() with no wait: cheap enough to ask after every token.
  bool open() const;
  bool found() const { return socket_ >= 0; }

 private:
  int socket_ = -1;  // httplib closes it only after the handler returns, so it stays ours meanwhile
};

}  // namespace kvchat::app::openai
