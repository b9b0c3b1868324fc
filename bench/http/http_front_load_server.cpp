// A synthetic streaming server to measure HTTP fronts alone, without a model:
// GET /stream answers 200 text/event-stream and sends `--events` events, one
// every `--interval-ms`, then "data: [DONE]". Two fronts:
//
//   --front asio     pagoda's HttpFront (http_front.h): an event loop, the
//                    events pushed by one ticker thread that wakes each stream
//   --front httplib  Debian's cpp-httplib 0.11.4 as pagoda used it, "fixed"
//                    as far as its API allows: one pool thread per connection
//                    (--threads), the listen backlog raised to somaxconn by
//                    listening again on its socket (the library's is 5)
//
// Driven by tools/http_load.py; results in docs/BENCHMARKS.md ("HTTP front").
//
//   http_front_load_server --front asio --port 8123 --events 10 --interval-ms 1000

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "pagoda/server/http_front.h"

namespace {

using namespace std::chrono_literals;

struct Options {
  std::string front = "asio";
  int port = 8123;
  int events = 10;
  int interval_ms = 1000;
  int threads = 6000;  // httplib pool
};

std::string event_text(int i) { return "data: {\"event\": " + std::to_string(i) + ", \"pad\": \"................\"}\n\n"; }

// ---- asio front: one ticker thread feeds every open stream ------------------------

class TickerStream : public pagoda::server::ReplySource {
 public:
  explicit TickerStream(int events) : events_(events) {}
  void start(std::function<void()> wake) override {
    std::lock_guard lock(mutex_);
    wake_ = std::move(wake);
  }
  pagoda::server::ReplyPiece pull() override {
    pagoda::server::ReplyPiece piece;
    std::lock_guard lock(mutex_);
    if (!head_sent_) {
      head_sent_ = true;
      piece.has_head = true;
      piece.streamed = true;
      piece.head.content_type = "text/event-stream";
    }
    for (; sent_ < ticks_ && sent_ < events_; ++sent_) piece.data += event_text(sent_);
    if (sent_ == events_) {
      piece.data += "data: [DONE]\n\n";
      piece.done = true;
      done_ = true;
    }
    return piece;
  }
  void cancel() override {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  // Ticker thread: one more event is due. False once the stream is over.
  bool tick() {
    std::function<void()> wake;
    {
      std::lock_guard lock(mutex_);
      if (done_) return false;
      ++ticks_;
      wake = wake_;
    }
    if (wake) wake();
    return true;
  }

 private:
  std::mutex mutex_;
  std::function<void()> wake_;
  const int events_;
  int ticks_ = 0, sent_ = 0;
  bool head_sent_ = false, done_ = false;
};

class Ticker {
 public:
  explicit Ticker(int interval_ms) : thread_([this, interval_ms] { run(interval_ms); }) {}
  ~Ticker() {
    stop_ = true;
    thread_.join();
  }
  void add(std::shared_ptr<TickerStream> s) {
    std::lock_guard lock(mutex_);
    incoming_.push_back(std::move(s));
  }

 private:
  void run(int interval_ms) {
    std::vector<std::shared_ptr<TickerStream>> live;
    auto next = std::chrono::steady_clock::now();
    while (!stop_) {
      next += std::chrono::milliseconds(interval_ms);
      std::this_thread::sleep_until(next);
      {
        std::lock_guard lock(mutex_);
        for (auto& s : incoming_) live.push_back(std::move(s));
        incoming_.clear();
      }
      std::vector<std::shared_ptr<TickerStream>> still;
      for (auto& s : live)
        if (s->tick()) still.push_back(std::move(s));
      live.swap(still);
    }
  }
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<std::shared_ptr<TickerStream>> incoming_;
  std::thread thread_;
};

pagoda::server::HttpFront* g_front = nullptr;
httplib::Server* g_httplib = nullptr;

int run_asio(const Options& opt) {
  pagoda::server::HttpFrontConfig config;
  config.port = opt.port;
  config.worker_threads = 2;
  pagoda::server::HttpFront front(config);
  Ticker ticker(opt.interval_ms);
  front.route("GET", "/stream", pagoda::server::RouteRuns::kOnLoop, [&](pagoda::server::HttpRequest&) {
    auto s = std::make_shared<TickerStream>(opt.events);
    ticker.add(s);
    return pagoda::server::HttpReply::deferred(s);
  });
  auto port = front.bind();
  if (!port.ok()) return std::fprintf(stderr, "%s\n", port.status().to_string().c_str()), 1;
  g_front = &front;
  std::printf("listening on http://127.0.0.1:%d (asio)\n", *port);
  std::fflush(stdout);
  (void)front.serve();
  return 0;
}

// ---- cpp-httplib: thread per connection -------------------------------------------

// httplib 0.11.4 listens with a backlog of 5 compiled into libcpp-httplib.so;
// listening again on the bound socket raises it (Linux allows it).
void raise_backlog_of_listener(int port) {
  int somaxconn = 4096;
  std::ifstream("/proc/sys/net/core/somaxconn") >> somaxconn;
  DIR* dir = opendir("/proc/self/fd");
  while (dirent* e = dir ? readdir(dir) : nullptr) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    if (ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port) != port) continue;
    listen(fd, somaxconn);
  }
  if (dir) closedir(dir);
}

int run_httplib(const Options& opt) {
  httplib::Server server;
  const int threads = opt.threads;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_keep_alive_timeout(5);
  server.Get("/stream", [&](const httplib::Request&, httplib::Response& res) {
    auto sent = std::make_shared<int>(0);
    res.set_chunked_content_provider("text/event-stream", [&, sent](size_t, httplib::DataSink& sink) {
      while (*sent < opt.events) {
        std::this_thread::sleep_for(std::chrono::milliseconds(opt.interval_ms));
        const std::string e = event_text((*sent)++);
        if (!sink.write(e.data(), e.size())) return false;
      }
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    });
  });
  if (!server.bind_to_port("127.0.0.1", opt.port)) return std::fprintf(stderr, "cannot bind\n"), 1;
  raise_backlog_of_listener(opt.port);
  g_httplib = &server;
  std::printf("listening on http://127.0.0.1:%d (httplib, %d threads)\n", opt.port, threads);
  std::fflush(stdout);
  server.listen_after_bind();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--front") opt.front = value;
    else if (flag == "--port") opt.port = std::atoi(value.c_str());
    else if (flag == "--events") opt.events = std::atoi(value.c_str());
    else if (flag == "--interval-ms") opt.interval_ms = std::atoi(value.c_str());
    else if (flag == "--threads") opt.threads = std::atoi(value.c_str());
    else return std::fprintf(stderr, "unknown flag %s\n", flag.c_str()), 2;
  }
  signal(SIGPIPE, SIG_IGN);
  // SIGTERM ends the run: a thread waits for it and stops the front.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread waiter([set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (g_front) g_front->stop(std::chrono::milliseconds(0));
    if (g_httplib) g_httplib->stop();
  });
  waiter.detach();
  return opt.front == "httplib" ? run_httplib(opt) : run_asio(opt);
}
