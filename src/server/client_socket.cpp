#include "server/client_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <system_error>

namespace lragent::server {
namespace {

// The port of an IPv4 or IPv6 address (-1 for any other family).
int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

}  // namespace

int find_client_socket(const std::string& remote_addr, int remote_port, int local_port) {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/fd", ec);
  if (ec) return -1;
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    int fd = -1;
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc()) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
    // Not a socket (ENOTSOCK), not connected, or another connection: the ports tell most apart.
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 || port_of(local) != local_port) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 || port_of(peer) != remote_port) continue;
    char host[NI_MAXHOST];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&peer), peer_len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0)
      continue;
    if (remote_addr == host) return fd;
  }
  return -1;
}

bool client_still_there(int fd) {
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;
  if (n == 0) return false;  // the client closed its end
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

}  // namespace lragent::server
