#include "pagoda/server/peer_connection.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace pagoda::server {
namespace {

// Numeric host and port of a socket address, as httplib formats them (getnameinfo, NI_NUMERICHOST).
bool numeric_address(const sockaddr_storage& address, socklen_t length, std::string& host, int& port) {
  char buffer[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, buffer, sizeof(buffer), nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return false;
  host = buffer;
  if (address.ss_family == AF_INET)
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  else if (address.ss_family == AF_INET6)
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  else
    return false;
  return true;
}

bool socket_matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr,
                    int remote_port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  std::string host;
  int port = -1;
  // Ports first: cheap, and they rule out nearly every other descriptor.
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  if (!numeric_address(address, length, host, port) || port != remote_port || host != remote_addr) return false;
  length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  return numeric_address(address, length, host, port) && port == local_port && host == local_addr;
}

}  // namespace

std::optional<PeerConnection> PeerConnection::find(const std::string& local_addr, int local_port,
                                                   const std::string& remote_addr, int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return std::nullopt;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  std::optional<PeerConnection> found;
  const int dir_fd = dirfd(dir);
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == dir_fd) continue;
    if (socket_matches(fd, local_addr, local_port, remote_addr, remote_port)) {
      found = PeerConnection(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool PeerConnection::closed() const {
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace pagoda::server
