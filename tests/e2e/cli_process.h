#pragma once
// Runs the real `pagoda` binary with arguments and collects its exit code,
// stdout and stderr, for tests of the command line (flags, errors, output).
//
// The binary is PAGODA_BINARY_DIR/pagoda, or the command in the environment
// variable PAGODA_CLI (words split at spaces, e.g. ".device/cli/run.sh pagoda"
// on the GPU machine, where the build tree does not exist).

#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace pagoda::e2e {

struct CliResult {
  int exit_code = -1;  // the process's exit status; -1: killed at the timeout; -2 - n: died from signal n
  std::string out;
  std::string err;
  bool crashed() const { return exit_code <= -2; }
};

// The words that start pagoda: PAGODA_CLI split at spaces, else the build tree's binary.
inline std::vector<std::string> pagoda_command() {
  if (const char* cli = std::getenv("PAGODA_CLI"); cli != nullptr && *cli != '\0') {
    std::vector<std::string> words;
    std::istringstream in(cli);
    for (std::string w; in >> w;) words.push_back(w);
    return words;
  }
  return {std::string(PAGODA_BINARY_DIR) + "/pagoda"};
}

// In a forked child: replaces it with `pagoda ARGS...` (exit 127 if that fails).
[[noreturn]] inline void exec_pagoda(const std::vector<std::string>& args) {
  std::vector<std::string> full = pagoda_command();
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  _exit(127);
}

// The repository root: PAGODA_SOURCE_DIR from the environment (ctest sets it;
// the GPU machine's copy of the tree is elsewhere), else the configured one.
inline std::string source_dir() {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? env : PAGODA_SOURCE_DIR;
}
inline std::string source_path(const std::string& rel) { return source_dir() + "/" + rel; }

// Sets an environment variable for a scope (a pagoda child started in it inherits
// it), then puts the previous value back. Not thread-safe (setenv).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (previous_) setenv(name_, previous_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

inline CliResult run_pagoda(const std::vector<std::string>& args,
                            std::chrono::seconds timeout = std::chrono::seconds(120)) {
  CliResult result;
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) return result;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    exec_pagoda(args);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (const pollfd& p : fds)
    if (p.fd >= 0) close(p.fd);
  int status = 0;
  waitpid(pid, &status, 0);
  if (timed_out) result.exit_code = -1;
  else if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  else result.exit_code = -2 - WTERMSIG(status);
  return result;
}

// The last non-empty line of `text` (generate --json prints its JSON object last on stdout).
inline std::string last_line(const std::string& text) {
  size_t end = text.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

}  // namespace pagoda::e2e
