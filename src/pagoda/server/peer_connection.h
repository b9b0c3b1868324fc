#pragma once
// The accepted TCP socket behind an HTTP request, found from the request's
// address pair, so that a handler which waits before answering (non-streamed
// completions hold their status until the result is known) notices a client
// that leaves and aborts its generation. cpp-httplib 0.11 (Debian bookworm)
// hands handlers no socket and no is_connection_closed().
//
// find() scans this process's descriptors (/proc/self/fd) once for the socket
// whose local and peer addresses both match; while the handler runs,
// httplib keeps that socket open, so the descriptor stays valid. closed() only
// polls it (never reads), so a pipelined next request is left untouched.
//
// Thread safety: find() is safe from any thread; one PeerConnection per handler.

#include <optional>
#include <string>

namespace pagoda::server {

class PeerConnection {
 public:
  // Addresses as httplib writes them (numeric host, e.g. "127.0.0.1", "::1").
  static std::optional<PeerConnection> find(const std::string& local_addr, int local_port,
                                            const std::string& remote_addr, int remote_port);

  // True once the peer has closed or reset the connection (or shut down its
  // sending side: an HTTP client that does that has left).
  bool closed() const;

  int fd() const { return fd_; }

 private:
  explicit PeerConnection(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace pagoda::server
