#pragma once
// Text from elsewhere (a server's reply, a stored title or message) on its way to a terminal. A terminal
// acts on the control characters it is sent: escape sequences move the cursor, clear the screen, retitle
// the window or write to the clipboard (OSC 52). Where the output is a terminal they are shown as \xNN
// instead (C1 controls and bytes that are not UTF-8 too, as `kvchat-cli list` shows a title's); line breaks
// and tabs pass.
// Pipes and files get the bytes unchanged.
#include <cstdio>
#include <string>
#include <string_view>

namespace kvchat::cli {

bool is_terminal(std::FILE* stream);

// `text` with its control characters escaped (see above). A sequence cut off at the end is escaped too.
std::string escaped_for_terminal(std::string_view text);

// The same for text that arrives in pieces: a character split between two pieces is held back until it
// is whole, so that it is neither escaped by mistake nor cut in two.
class TerminalText {
 public:
  explicit TerminalText(bool escape) : escape_(escape) {}
  std::string feed(std::string_view piece);  // what may be printed now
  std::string finish();                      // what was held back (escaped: nothing will complete it)

 private:
  bool escape_;
  std::string held_;
};

// Writes `text` to `stream`, escaped when the stream is a terminal. False when the write failed.
bool write_for_terminal(std::FILE* stream, std::string_view text);

}  // namespace kvchat::cli
