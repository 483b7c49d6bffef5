#pragma once
// (In the torch-free model-file library: the GGUF and the safetensors readers both use it.)
//
// Model files are memory-mapped, not read: weights stay in the page cache, shared, and load in
// milliseconds. The price is that the file must not change under the mapping. Rewritten in place, the
// weights silently change; truncated, the next read of a page past the new end raises SIGBUS, which
// kills the process. Two defences:
//  - before each turn, the files a model maps are compared with what was mapped (device, inode, size,
//    modification time), and a changed file is a clear error that asks to load the model again;
//  - a SIGBUS that still happens (the file changed during a turn) is reported before the process
//    ends: which mapped file, and what to do, on stderr and in the log file.
#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvchat {

// A read-only private mapping of a whole open file, named for fault reports (register_mapping) while
// it lives: both model readers map their files through it.
class FileMapping {
 public:
  // Maps `length` (> 0) bytes of the descriptor `fd`, the file `path`. Null when mmap fails, with errno
  // left as mmap set it, so that each reader words the error as its format's errors read.
  static std::unique_ptr<FileMapping> map(int fd, std::size_t length, const std::string& path);
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  const std::uint8_t* bytes() const { return static_cast<const std::uint8_t*>(address_); }
  std::size_t length() const { return length_; }

 private:
  FileMapping(void* address, std::size_t length) : address_(address), length_(length) {}
  void* address_;
  std::size_t length_;
};

// What identifies a file's contents cheaply: the same path may name another file, or the same file
// may have been rewritten.
struct FileIdentity {
  std::string path;
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  timespec modified{};

  // From the fstat of the descriptor that was mapped (not a second stat of the path: no race).
  static FileIdentity of(const std::string& path, const struct stat& info);
  // "" while `path` is still this file unchanged; else what changed, in words.
  std::string change() const;
};

// Reports a SIGBUS inside [address, address + length) as a fault of `path`. The first registration
// installs the SIGBUS handler. Up to 256 mappings are named; more are still reported, unnamed.
void register_mapping(const void* address, std::size_t length, const std::string& path);
void unregister_mapping(const void* address);
// Where the fault report goes besides stderr (the app's log file); -1 for none.
void set_fault_report_descriptor(int fd);

}  // namespace kvchat
