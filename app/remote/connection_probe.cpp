#include "app/remote/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace kvchat::app::openai {

namespace {

// "127.0.0.1" / "::1" and the port of a socket address; false for other families.
bool address_of(const sockaddr_storage& address, std::string* host, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& ipv4 = reinterpret_cast<const sockaddr_in&>(address);
    if (!inet_ntop(AF_INET, &ipv4.sin_addr, text, sizeof text)) return false;
    *port = ntohs(ipv4.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& ipv6 = reinterpret_cast<const sockaddr_in6&>(address);
    if (!inet_ntop(AF_INET6, &ipv6.sin6_addr, text, sizeof text)) return false;
    *port = ntohs(ipv6.sin6_port);
  } else {
    return false;
  }
  *host = text;
  return true;
}

bool has_addresses(int socket, const std::string& local_address, int local_port, const std::string& remote_address,
                   int remote_port) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  std::string host;
  int port = 0;
  if (::getpeername(socket, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      !address_of(address, &host, &port) || port != remote_port || host != remote_address)
    return false;
  length = sizeof address;
  if (::getsockname(socket, reinterpret_cast<sockaddr*>(&address), &length) != 0 || !address_of(address, &host, &port))
    return false;
  return port == local_port && host == local_address;
}

}  // namespace

ConnectionProbe::ConnectionProbe(const std::string& local_address, int local_port, const std::string& remote_address,
                                 int remote_port) {
  DIR* descriptors = ::opendir("/proc/self/fd");
  if (!descriptors) return;
  while (const dirent* entry = ::readdir(descriptors)) {
    char* end = nullptr;
    const long descriptor = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || descriptor == ::dirfd(descriptors)) continue;
    struct stat status {};
    if (::fstat(static_cast<int>(descriptor), &status) != 0 || !S_ISSOCK(status.st_mode)) continue;
    if (has_addresses(static_cast<int>(descriptor), local_address, local_port, remote_address, remote_port)) {
      socket_ = static_cast<int>(descriptor);
      break;
    }
  }
  ::closedir(descriptors);
}

bool ConnectionProbe::open() const {
  if (socket_ < 0) return true;
  pollfd entry{socket_, POLLIN | POLLRDHUP, 0};
  if (::poll(&entry, 1, 0) <= 0) return true;
  if (entry.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return false;
  // Readable without a hang-up: a pipelined request's bytes, or an end of stream on a kernel that does
  // not report POLLRDHUP. Peeking tells them apart.
  char byte = 0;
  return ::recv(socket_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
}

}  // namespace kvchat::app::openai
