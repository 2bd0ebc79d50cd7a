// cpp-httplib binds with SO_REUSEPORT: a second server on a port in use would bind too and
// share its connections. A plain bind first tells a port in use.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace rlx::serve::detail {

// "" when `port` on `host` (an IPv4 address) can be bound; otherwise why not.
inline std::string port_unavailable(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) return {};  // a name or IPv6: httplib decides
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  std::string why;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) why = std::strerror(errno);
  ::close(fd);
  return why;
}

}  // namespace rlx::serve::detail
