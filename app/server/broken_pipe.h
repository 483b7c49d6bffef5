#pragma once
// Writing to a socket whose peer has gone raises SIGPIPE, which ends the whole process by default, and
// cpp-httplib 0.11 sends without MSG_NOSIGNAL. A remote server that closes the connection while the app
// is still sending a request (a stop, a crash, a proxy timeout) would take the chat window down with
// it, and a client that leaves mid-stream would end the server. Every user of sockets calls this before
// its first one: such a write then fails with EPIPE, which httplib reports as a failed request and the
// caller turns into an error message.
namespace kvchat::app {

// Ignores SIGPIPE for the whole process from now on. Any handler installed before is replaced, a crash
// reporter's too (QtTest's): in this program a broken pipe is never a crash.
void ignore_broken_pipe_signals();

}  // namespace kvchat::app
