#pragma once
// Reading a whole model file (config.json, tokenizer.json, ...) that must be a regular file. Opening a
// FIFO named like one would block forever, and a directory or device reads as nonsense, so anything
// that is not a regular file is refused at once, before a byte is read.
#include <string>

namespace kvchat {

// Returns false with `error` set ("file not found", "not a regular file", or the system's reason).
bool read_regular_file(const std::string& path, std::string& contents, std::string& error);

// The open(2) flags for a model file: never blocks on a FIFO. Check is_regular_file_descriptor after.
int open_model_file(const std::string& path);
bool is_regular_file_descriptor(int fd);

}  // namespace kvchat
