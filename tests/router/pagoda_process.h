#pragma once
// Starts a real `pagoda serve` or `pagoda route` process on loopback for the
// router's end-to-end tests, reads its port from the first stdout line that
// says "listening on http://HOST:PORT", keeps its stderr in a file (the
// router's warnings are part of its contract), and stops it with a signal.

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../e2e/cli_process.h"  // exec_pagoda(), source_path()

namespace pagoda::e2e {

class PagodaProcess {
 public:
  PagodaProcess() = default;
  PagodaProcess(const PagodaProcess&) = delete;
  PagodaProcess& operator=(const PagodaProcess&) = delete;
  ~PagodaProcess() { stop(SIGKILL, std::chrono::seconds(5)); }

  // `pagoda ARGS...`; false (and *error) if it exits or says nothing for 60 s.
  bool start(const std::vector<std::string>& args, std::string* error) {
    static int counter = 0;
    err_path_ = std::string(PAGODA_BINARY_DIR) + "/router_e2e_" + std::to_string(getpid()) + "_" +
                std::to_string(++counter) + ".err";
    int out_pipe[2];
    if (pipe(out_pipe) != 0) return fail(error, "pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out_pipe[1], STDOUT_FILENO);
      FILE* err = std::fopen(err_path_.c_str(), "w");
      if (err != nullptr) dup2(fileno(err), STDERR_FILENO);
      close(out_pipe[0]);
      close(out_pipe[1]);
      exec_pagoda(args);
    }
    close(out_pipe[1]);
    out_ = fdopen(out_pipe[0], "r");
    char line[4096];
    while (fgets(line, sizeof line, out_)) {
      const std::string s(line);
      if (s.find("listening on http://") == std::string::npos) continue;
      port_ = std::stoi(s.substr(s.rfind(':') + 1));
      first_line_ = s;
      return true;
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return fail(error, "pagoda exited before listening (status " + std::to_string(status) + "): " + stderr_text());
  }

  int port() const { return port_; }
  bool running() const { return pid_ > 0; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& first_line() const { return first_line_; }
  std::string stderr_text() const {
    std::ifstream in(err_path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  // Sends `sig`, waits up to `timeout`; the exit code, -1 if it had to be
  // killed, -2 if it died from a signal.
  int stop(int sig = SIGTERM, std::chrono::seconds timeout = std::chrono::seconds(20)) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    int code = -1;
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited = true;
        code = WIFEXITED(status) ? WEXITSTATUS(status) : -2;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!exited) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = -1;
    if (out_) fclose(out_), out_ = nullptr;
    return code;
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
  std::string err_path_;
};

}  // namespace pagoda::e2e
