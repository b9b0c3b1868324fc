#pragma once
// Starts the real `pagoda serve` binary on a free loopback port for e2e tests
// and stops it with a signal. The port is read from the server's first line
// ("... listening on http://127.0.0.1:PORT").

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli_process.h"  // exec_pagoda(): the binary, or $PAGODA_CLI on the GPU machine

namespace pagoda::e2e {

inline std::string repo_path(const std::string& rel) { return std::string(PAGODA_SOURCE_DIR) + "/" + rel; }
inline std::string pagoda_binary() { return std::string(PAGODA_BINARY_DIR) + "/pagoda"; }

class ServerProcess {
 public:
  // Returns false (and fills error) if the server did not come up within 60 s.
  bool start(std::vector<std::string> args, std::string* error) {
    int out_pipe[2];
    if (pipe(out_pipe) != 0) return fail(error, "pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out_pipe[1], STDOUT_FILENO);
      close(out_pipe[0]);
      close(out_pipe[1]);
      args.insert(args.begin(), {"serve", "--host", "127.0.0.1", "--port", "0"});
      exec_pagoda(args);
    }
    close(out_pipe[1]);
    out_ = fdopen(out_pipe[0], "r");
    char line[4096];
    while (fgets(line, sizeof line, out_)) {
      std::string s(line);
      auto at = s.find("listening on http://");
      if (at == std::string::npos) continue;
      auto colon = s.rfind(':');
      port_ = std::stoi(s.substr(colon + 1));
      first_line_ = s;
      return true;
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return fail(error, "pagoda serve exited before listening (status " + std::to_string(status) + ")");
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& first_line() const { return first_line_; }

  // Sends `sig` and waits up to `timeout` for exit; returns the exit code, or
  // -1 if it had to be killed, -2 if it died from a signal.
  int stop(int sig = SIGTERM, std::chrono::seconds timeout = std::chrono::seconds(20)) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        if (out_) fclose(out_), out_ = nullptr;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return -1;
  }

  ~ServerProcess() {
    if (pid_ > 0) stop(SIGKILL, std::chrono::seconds(5));
    if (out_) fclose(out_);
  }

 private:
  static bool fail(std::string* error, std::string message) {
    if (error) *error = std::move(message);
    return false;
  }
  pid_t pid_ = -1;
  int port_ = 0;
  FILE* out_ = nullptr;
  std::string first_line_;
};

}  // namespace pagoda::e2e
