#pragma once
// Byte-level HTTP/1.1 over loopback for tests that must send what a polite
// client never would (slow headers, bad lengths, pipelined requests, huge
// chunked bodies) and see exactly what comes back. Every read has a deadline.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>

namespace pagoda::e2e {

// A connected loopback socket, or -1.
inline int connect_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Bytes received until the peer closes, `stop_after` responses are complete
// (counted by Content-Length or the chunked terminator), or `timeout` passes.
struct Received {
  std::string bytes;
  bool peer_closed = false;  // EOF or reset seen
  bool reset = false;        // ECONNRESET
  bool timed_out = false;
};

// Length of the first complete response at the start of `b`, or 0 if incomplete.
inline size_t complete_response_length(std::string_view b) {
  const size_t head_end = b.find("\r\n\r\n");
  if (head_end == std::string_view::npos) return 0;
  const size_t body_start = head_end + 4;
  std::string head(b.substr(0, head_end));
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (const size_t cl = head.find("\r\ncontent-length:"); cl != std::string::npos) {
    const size_t len = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
    return b.size() >= body_start + len ? body_start + len : 0;
  }
  if (head.find("transfer-encoding: chunked") != std::string::npos) {
    const size_t end = b.find("\r\n0\r\n\r\n", head_end);
    return end == std::string_view::npos ? 0 : end + 7;
  }
  return body_start;  // no body (e.g. 1xx, 204, 304)
}

inline int count_complete_responses(std::string_view b) {
  int n = 0;
  while (const size_t len = complete_response_length(b)) {
    ++n;
    b.remove_prefix(len);
  }
  return n;
}

inline Received receive(int fd, std::chrono::milliseconds timeout, int stop_after = 1 << 30) {
  Received r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[65536];
  while (count_complete_responses(r.bytes) < stop_after) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      r.peer_closed = true;
      r.reset = n < 0 && errno == ECONNRESET;
      break;
    }
    r.bytes.append(buf, static_cast<size_t>(n));
  }
  return r;
}

// Status code of the first response in `bytes`, or -1.
inline int status_of(std::string_view bytes) {
  if (bytes.size() < 12 || bytes.substr(0, 5) != "HTTP/") return -1;
  return std::atoi(std::string(bytes.substr(9, 3)).c_str());
}

// Body of the first (Content-Length) response in `bytes`.
inline std::string body_of(std::string_view bytes) {
  const size_t head_end = bytes.find("\r\n\r\n");
  const size_t len = complete_response_length(bytes);
  if (head_end == std::string_view::npos || len == 0) return {};
  return std::string(bytes.substr(head_end + 4, len - head_end - 4));
}

// One request on a fresh connection; the whole answer (or what came before the deadline).
inline Received exchange(int port, std::string_view request, std::chrono::milliseconds timeout) {
  Received r;
  const int fd = connect_loopback(port);
  if (fd < 0) return r;
  if (send_all(fd, request)) r = receive(fd, timeout, 1);
  close(fd);
  return r;
}

inline std::string http_get(std::string_view path, std::string_view key, std::string_view extra_headers = "") {
  std::string r = "GET " + std::string(path) + " HTTP/1.1\r\nHost: x\r\n";
  if (!key.empty()) r += "Authorization: Bearer " + std::string(key) + "\r\n";
  r += std::string(extra_headers);
  return r + "\r\n";
}

inline std::string http_post(std::string_view path, std::string_view key, std::string_view body,
                             std::string_view content_type = "application/json") {
  std::string r = "POST " + std::string(path) + " HTTP/1.1\r\nHost: x\r\n";
  if (!key.empty()) r += "Authorization: Bearer " + std::string(key) + "\r\n";
  if (!content_type.empty()) r += "Content-Type: " + std::string(content_type) + "\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  return r + std::string(body);
}

// Sends `request` on a fresh connection and measures the time from the send
// to the first event (`data: {`) of a streamed answer, reading on until
// `data: [DONE]`, the peer closing, or `timeout`; the bytes go to `*got`.
// Milliseconds, or -1 when no event came.
inline double time_to_first_event_ms(int port, std::string_view request, std::chrono::milliseconds timeout,
                                     std::string* got) {
  got->clear();
  const int fd = connect_loopback(port);
  if (fd < 0) return -1;
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const auto start = std::chrono::steady_clock::now();
  double first = -1;
  if (send_all(fd, request)) {
    char buf[4096];
    while (std::chrono::steady_clock::now() - start < timeout) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got->append(buf, static_cast<size_t>(n));
      if (first < 0 && got->find("data: {") != std::string::npos)
        first = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (got->find("data: [DONE]") != std::string::npos) break;
    }
  }
  close(fd);
  return first;
}

}  // namespace pagoda::e2e
