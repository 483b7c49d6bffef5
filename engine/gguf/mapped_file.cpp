#include "engine/gguf/mapped_file.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace kvchat {

FileIdentity FileIdentity::of(const std::string& path, const struct stat& info) {
  FileIdentity identity;
  identity.path = path;
  identity.device = info.st_dev;
  identity.inode = info.st_ino;
  identity.size = info.st_size;
  identity.modified = info.st_mtim;
  return identity;
}

std::string FileIdentity::change() const {
  struct stat now {};
  if (::stat(path.c_str(), &now) != 0) return "it is gone (" + std::string(std::strerror(errno)) + ")";
  if (now.st_dev != device || now.st_ino != inode) return "it was replaced by another file";
  if (now.st_size != size)
    return "its size changed from " + std::to_string(size) + " to " + std::to_string(now.st_size) + " bytes";
  if (now.st_mtim.tv_sec != modified.tv_sec || now.st_mtim.tv_nsec != modified.tv_nsec) return "it was modified";
  return "";
}

namespace {

// The handler may only read plain memory: a fixed table, each slot published by its begin address.
constexpr int kNamedMappings = 256;
constexpr std::size_t kPathBytes = 512;
struct NamedMapping {
  std::atomic<const char*> begin{nullptr};
  std::size_t length = 0;
  char path[kPathBytes] = {};
};
NamedMapping mappings[kNamedMappings];
std::mutex registration_mutex;
std::atomic<int> report_descriptor{-1};

void write_text(int fd, const char* text) {
  std::size_t left = std::strlen(text);
  while (left > 0) {
    ssize_t written = ::write(fd, text, left);
    if (written <= 0) return;
    text += written;
    left -= static_cast<std::size_t>(written);
  }
}

void report(const char* text) {
  write_text(STDERR_FILENO, text);
  const int fd = report_descriptor.load();
  if (fd >= 0) write_text(fd, text);
}

void on_bus_error(int, siginfo_t* info, void*) {
  const char* address = static_cast<const char*>(info->si_addr);
  const char* path = nullptr;
  for (NamedMapping& mapping : mappings) {
    const char* begin = mapping.begin.load();
    if (begin && address >= begin && address < begin + mapping.length) path = mapping.path;
  }
  report("kvchat: fatal: ");
  if (path) {
    report("the model file ");
    report(path);
    report(" was truncated or rewritten while it was in use (SIGBUS reading its memory mapping).");
  } else {
    report("bus error (SIGBUS), most likely a memory-mapped model file truncated while in use.");
  }
  report(" The program must stop; start it again and load the model again.\n");
  // The default action then ends the process with the signal, as it would have without this handler.
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

void install_handler() {
  struct sigaction action {};
  action.sa_sigaction = on_bus_error;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, nullptr);
}

}  // namespace

void register_mapping(const void* address, std::size_t length, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, install_handler);
  std::lock_guard<std::mutex> lock(registration_mutex);
  for (NamedMapping& mapping : mappings) {
    if (mapping.begin.load()) continue;
    mapping.length = length;
    std::snprintf(mapping.path, kPathBytes, "%s", path.c_str());
    mapping.begin.store(static_cast<const char*>(address));
    return;
  }
}

void unregister_mapping(const void* address) {
  std::lock_guard<std::mutex> lock(registration_mutex);
  for (NamedMapping& mapping : mappings)
    if (mapping.begin.load() == address) mapping.begin.store(nullptr);
}

void set_fault_report_descriptor(int fd) { report_descriptor.store(fd); }

std::unique_ptr<FileMapping> FileMapping::map(int fd, std::size_t length, const std::string& path) {
  void* address = mmap(nullptr, length, PROT_READ, MAP_PRIVATE, fd, 0);
  if (address == MAP_FAILED) return nullptr;
  register_mapping(address, length, path);
  return std::unique_ptr<FileMapping>(new FileMapping(address, length));
}

FileMapping::~FileMapping() {
  unregister_mapping(address_);
  munmap(address_, length_);
}

}  // namespace kvchat
