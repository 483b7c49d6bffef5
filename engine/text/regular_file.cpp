#include "engine/text/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvchat {

int open_model_file(const std::string& path) { return ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); }

bool is_regular_file_descriptor(int fd) {
  struct stat info {};
  return fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
}

bool read_regular_file(const std::string& path, std::string& contents, std::string& error) {
  const int fd = open_model_file(path);
  if (fd < 0) {
    error = errno == ENOENT ? "file not found" : std::strerror(errno);
    return false;
  }
  if (!is_regular_file_descriptor(fd)) {
    ::close(fd);
    error = "not a regular file";
    return false;
  }
  contents.clear();
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      error = std::strerror(errno);
      ::close(fd);
      return false;
    }
    contents.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return true;
}

}  // namespace kvchat
