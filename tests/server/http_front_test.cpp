// The HTTP front in process, over loopback, against each way a client can
// starve or abuse a server: slow headers and bodies (slowloris), bad
// Content-Length, chunked bodies past the limit, connection bursts, a full
// handler queue, pipelining, idle keep-alive, clients that leave or stop
// reading, and shutdown with all of them connected. Every test is bounded in
// time; the deadlines are shortened through HttpFrontConfig.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "../e2e/raw_http.h"
#include "pagoda/server/http_front.h"

namespace pagoda::server {
namespace {

using namespace std::chrono_literals;
using e2e::connect_loopback;
using e2e::count_complete_responses;
using e2e::exchange;
using e2e::Received;
using e2e::receive;
using e2e::send_all;
using e2e::status_of;
using Clock = std::chrono::steady_clock;

HttpReply text_reply(std::string body) {
  HttpReply r;
  r.response.content_type = "text/plain";
  r.response.body = std::move(body);
  return r;
}

// A reply that never finishes on its own (a generation that goes on): counts
// cancel() calls; streams `chunk` every time it is woken when streaming.
class EndlessReply : public ReplySource {
 public:
  explicit EndlessReply(bool streamed, std::string chunk = "") : streamed_(streamed), chunk_(std::move(chunk)) {}
  void start(std::function<void()> wake) override {
    std::lock_guard lock(mutex_);
    wake_ = std::move(wake);
  }
  ReplyPiece pull() override {
    ReplyPiece p;
    if (streamed_ && !head_sent_) {
      head_sent_ = true;
      p.has_head = true;
      p.streamed = true;
      p.head.content_type = "text/event-stream";
    }
    if (streamed_) p.data = chunk_;
    return p;
  }
  void cancel() override { ++cancelled; }
  void wake() {
    std::function<void()> w;
    {
      std::lock_guard lock(mutex_);
      w = wake_;
    }
    if (w) w();
  }
  std::atomic<int> cancelled{0};

 private:
  std::mutex mutex_;
  std::function<void()> wake_;
  bool streamed_;
  std::string chunk_;
  bool head_sent_ = false;
};

class HttpFrontTest : public ::testing::Test {
 protected:
  // Short deadlines so every slow-client test ends within seconds.
  virtual HttpFrontConfig make_config() {
    HttpFrontConfig c;
    c.port = 0;
    c.worker_threads = 2;
    c.header_timeout = 400ms;
    c.body_timeout = 400ms;
    c.keep_alive_timeout = 2000ms;
    c.write_timeout = 1000ms;
    c.limits.max_body_bytes = 64 << 10;
    return c;
  }
  virtual void add_routes(HttpFront& front) {
    front.route("GET", "/health", RouteRuns::kOnLoop, [](HttpRequest&) { return text_reply("ok"); });
    front.route("POST", "/echo", RouteRuns::kOnWorker, [this](HttpRequest& r) {
      ++handled;
      return text_reply(std::to_string(r.body.size()));
    });
    front.route("GET", "/n", RouteRuns::kOnWorker, [](HttpRequest& r) { return text_reply(r.target); });
    front.route("GET", "/endless", RouteRuns::kOnWorker, [this](HttpRequest&) {
      endless = std::make_shared<EndlessReply>(false);
      return HttpReply::deferred(endless);
    });
    // A stream of two events, whole at the first pull.
    front.route("GET", "/two", RouteRuns::kOnLoop, [](HttpRequest&) {
      struct TwoEvents : ReplySource {
        void start(std::function<void()>) override {}
        ReplyPiece pull() override {
          ReplyPiece p;
          p.has_head = true;
          p.streamed = true;
          p.head.content_type = "text/event-stream";
          p.data = "data: a\n\ndata: b\n\n";
          p.done = true;
          return p;
        }
        void cancel() override {}
      };
      return HttpReply::deferred(std::make_shared<TwoEvents>());
    });
  }
  void SetUp() override {
    front_ = std::make_unique<HttpFront>(make_config());
    add_routes(*front_);
    auto port = front_->bind();
    ASSERT_TRUE(port.ok()) << port.status().to_string();
    port_ = *port;
    serve_ = std::async(std::launch::async, [this] { return front_->serve(); });
  }
  void TearDown() override {
    front_->stop(0ms);
    ASSERT_EQ(serve_.wait_for(10s), std::future_status::ready) << "serve() did not return after stop()";
    front_.reset();
  }
  // /health answered on a fresh connection within `within`.
  bool health_answers(std::chrono::milliseconds within = 1000ms) {
    const auto t0 = Clock::now();
    const Received r = exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", within);
    return status_of(r.bytes) == 200 && Clock::now() - t0 < within;
  }
  template <typename F>
  bool eventually(F condition, std::chrono::milliseconds limit = 5000ms) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      if (condition()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return condition();
  }

  std::unique_ptr<HttpFront> front_;
  std::future<Status> serve_;
  int port_ = 0;
  std::atomic<int> handled{0};
  std::shared_ptr<EndlessReply> endless;
};

TEST_F(HttpFrontTest, AnswersAndKeepsTheConnection) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    const Received r = receive(fd, 2000ms, 1);
    EXPECT_EQ(status_of(r.bytes), 200) << r.bytes;
    EXPECT_NE(r.bytes.find("Connection: keep-alive"), std::string::npos);
  }
  close(fd);
}

TEST_F(HttpFrontTest, SlowlorisHeaderDeadlineIsForTheWholeHeadNotPerRead) {
  // One byte every 100 ms keeps every read short; the head's deadline (400 ms) still ends it.
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
  const auto t0 = Clock::now();
  bool closed = false;
  for (char c : head) {
    if (!send_all(fd, std::string(1, c))) {
      closed = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char b;
      if (recv(fd, &b, 1, MSG_PEEK) <= 0) {
        closed = true;
        break;
      }
    }
  }
  const auto elapsed = Clock::now() - t0;
  close(fd);
  EXPECT_TRUE(closed) << "a trickled head kept its connection past the deadline";
  EXPECT_LT(elapsed, 1500ms);
  EXPECT_EQ(front_->counters().header_timeouts, 1);
}

TEST_F(HttpFrontTest, HundredsOfSlowClientsDoNotStarveOthers) {
  std::vector<int> slow;
  for (int i = 0; i < 300; ++i) {
    const int fd = connect_loopback(port_);
    ASSERT_GE(fd, 0);
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\n");  // and nothing more
    slow.push_back(fd);
  }
  EXPECT_TRUE(health_answers(1000ms)) << "/health must answer while slow clients hold connections";
  const Received echo = exchange(port_, e2e::http_post("/echo", "", "12345"), 1000ms);
  EXPECT_EQ(status_of(echo.bytes), 200);
  // And the slow ones are all gone after the head deadline.
  EXPECT_TRUE(eventually([&] { return front_->counters().header_timeouts >= 300; }, 3000ms))
      << front_->counters().header_timeouts;
  for (int fd : slow) close(fd);
}

TEST_F(HttpFrontTest, BodyDeadlineIsForTheWholeBody) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"));
  const auto t0 = Clock::now();
  bool closed = false;
  for (int i = 0; i < 40 && !closed; ++i) {
    closed = !send_all(fd, "x");
    pollfd p{fd, POLLIN, 0};
    char b;
    if (poll(&p, 1, 50) > 0 && recv(fd, &b, 1, MSG_PEEK) <= 0) closed = true;
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - t0, 1500ms);
  close(fd);
  EXPECT_EQ(front_->counters().body_timeouts, 1);
  EXPECT_EQ(handled.load(), 0);
}

TEST_F(HttpFrontTest, BadContentLengthIsAnsweredAtOnce) {
  for (const char* length : {"-1", "99999999999999999999999", "abc", "12, 13", "0x10", ""}) {
    const auto t0 = Clock::now();
    const Received r = exchange(
        port_, std::string("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: ") + length + "\r\n\r\nabc", 2000ms);
    EXPECT_EQ(status_of(r.bytes), 400) << "Content-Length '" << length << "': " << r.bytes;
    EXPECT_LT(Clock::now() - t0, 300ms) << length;
    EXPECT_NE(r.bytes.find("\"error\""), std::string::npos);
  }
  // Two different lengths are a smuggling attempt.
  const Received twice =
      exchange(port_, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 2000ms);
  EXPECT_EQ(status_of(twice.bytes), 400) << twice.bytes;
  // A length over the limit: 413 before any of the body is sent.
  const auto t0 = Clock::now();
  const Received big = exchange(port_, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n", 2000ms);
  EXPECT_EQ(status_of(big.bytes), 413) << big.bytes;
  EXPECT_LT(Clock::now() - t0, 300ms);
  EXPECT_EQ(handled.load(), 0);
}

TEST_F(HttpFrontTest, ChunkedBodiesAreCappedLikeAnyOther) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "1000\r\n" + std::string(4096, 'x') + "\r\n";
  size_t sent = 0;
  // 1 MiB offered against a 64 KiB limit: the server answers 413 and stops reading.
  while (sent < (1u << 20) && send_all(fd, chunk)) sent += 4096;
  const Received r = receive(fd, 2000ms, 1);
  close(fd);
  EXPECT_EQ(status_of(r.bytes), 413) << r.bytes.substr(0, 300);
  EXPECT_EQ(handled.load(), 0);
  // Within the limit, chunked works.
  const Received ok = exchange(
      port_, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
      2000ms);
  EXPECT_EQ(status_of(ok.bytes), 200);
  EXPECT_EQ(e2e::body_of(ok.bytes), "11");
}

TEST_F(HttpFrontTest, PipelinedRequestsAreAnsweredInOrder) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd,
                       "GET /n?1 HTTP/1.1\r\nHost: x\r\n\r\nGET /n?2 HTTP/1.1\r\nHost: x\r\n\r\n"
                       "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /n?4 HTTP/1.1\r\nHost: x\r\n\r\n"));
  const Received r = receive(fd, 3000ms, 4);
  close(fd);
  ASSERT_EQ(count_complete_responses(r.bytes), 4) << r.bytes;
  const size_t a = r.bytes.find("/n?1"), b = r.bytes.find("/n?2"), c = r.bytes.find("\r\n\r\n3"),
               d = r.bytes.find("/n?4");
  ASSERT_NE(d, std::string::npos);
  EXPECT_TRUE(a < b && b < c && c < d) << r.bytes;
}

TEST_F(HttpFrontTest, IdleKeepAliveOutlastsAShortPauseThenCloses) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(status_of(receive(fd, 1000ms, 1).bytes), 200);
  std::this_thread::sleep_for(1200ms);  // the old server closed idle connections after 1 s
  ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(status_of(receive(fd, 1000ms, 1).bytes), 200);
  // Past keep_alive_timeout the connection is closed (cleanly: end of stream).
  const Received idle = receive(fd, 4000ms);
  EXPECT_TRUE(idle.peer_closed);
  EXPECT_FALSE(idle.reset);
  close(fd);
  EXPECT_EQ(front_->counters().idle_closes, 1);
}

TEST_F(HttpFrontTest, ClientLeavingAPendingReplyIsNoticedFromItsSocket) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "GET /endless HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(eventually([&] { return endless != nullptr; }));
  std::this_thread::sleep_for(50ms);
  close(fd);
  EXPECT_TRUE(eventually([&] { return endless->cancelled.load() == 1; }, 1000ms));
  EXPECT_EQ(front_->counters().client_disconnects, 1);
}

TEST_F(HttpFrontTest, UnknownPathIs404AndWrongMethodIs405WithTheErrorObject) {
  const Received a = exchange(port_, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", 1000ms);
  EXPECT_EQ(status_of(a.bytes), 404);
  EXPECT_NE(a.bytes.find("\"not_found\""), std::string::npos);
  const Received b = exchange(port_, "DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n", 1000ms);
  EXPECT_EQ(status_of(b.bytes), 405);
  EXPECT_NE(b.bytes.find("Allow: POST"), std::string::npos);
  const Received c = exchange(port_, "GET http://evil/health HTTP/1.1\r\nHost: x\r\n\r\n", 1000ms);
  EXPECT_EQ(status_of(c.bytes), 400);
  const Received d = exchange(port_, "GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 1000ms);
  EXPECT_TRUE(status_of(d.bytes) == 505 || status_of(d.bytes) == 400) << d.bytes;
}

TEST_F(HttpFrontTest, ExpectContinueGetsContinueThenTheAnswer) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  const Received cont = receive(fd, 1000ms, 1);
  EXPECT_EQ(status_of(cont.bytes), 100) << cont.bytes;
  ASSERT_TRUE(send_all(fd, "hello"));
  const Received r = receive(fd, 1000ms, 1);
  EXPECT_EQ(status_of(r.bytes), 200) << r.bytes;
  close(fd);
}

TEST_F(HttpFrontTest, RangeHeadersAreIgnored) {
  const Received r = exchange(port_, "GET /n HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0,0-0,0-0\r\n\r\n", 1000ms);
  EXPECT_EQ(status_of(r.bytes), 200);
  EXPECT_EQ(e2e::body_of(r.bytes), "/n");
  const Received bad = exchange(port_, "GET /n HTTP/1.1\r\nHost: x\r\nRange: bytes=zz\r\n\r\n", 1000ms);
  EXPECT_EQ(status_of(bad.bytes), 200);
}

TEST_F(HttpFrontTest, Http10StreamsEndWithTheConnectionInsteadOfChunks) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "GET /two HTTP/1.0\r\n\r\n"));
  const Received r10 = receive(fd, 2000ms);  // until the server closes
  close(fd);
  EXPECT_TRUE(r10.peer_closed);
  EXPECT_FALSE(r10.timed_out);
  EXPECT_EQ(r10.bytes.find("chunked"), std::string::npos) << r10.bytes;
  EXPECT_NE(r10.bytes.find("\r\n\r\ndata: a\n\ndata: b\n\n"), std::string::npos) << r10.bytes;
  const Received r11 = exchange(port_, "GET /two HTTP/1.1\r\nHost: x\r\n\r\n", 2000ms);
  EXPECT_NE(r11.bytes.find("Transfer-Encoding: chunked"), std::string::npos) << r11.bytes;
  EXPECT_NE(r11.bytes.find("\r\n0\r\n\r\n"), std::string::npos) << r11.bytes;
}

// ---- limits that need their own configuration ------------------------------------------

class BusyFrontTest : public HttpFrontTest {
 protected:
  HttpFrontConfig make_config() override {
    HttpFrontConfig c = HttpFrontTest::make_config();
    c.worker_threads = 1;
    c.max_queued_handlers = 2;
    c.max_connections = 40;
    return c;
  }
  void add_routes(HttpFront& front) override {
    HttpFrontTest::add_routes(front);
    front.route("GET", "/slow", RouteRuns::kOnWorker, [](HttpRequest&) {
      std::this_thread::sleep_for(1000ms);
      return text_reply("done");
    });
  }
};

TEST_F(BusyFrontTest, AFullHandlerQueueIsRefusedAtOnceWith429AndRetryAfter) {
  std::vector<std::future<std::pair<int, double>>> calls;
  for (int i = 0; i < 20; ++i) {
    calls.push_back(std::async(std::launch::async, [this] {
      const auto t0 = Clock::now();
      const Received r = exchange(port_, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n", 5000ms);
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (status_of(r.bytes) == 429) {
        EXPECT_NE(r.bytes.find("Retry-After: 1"), std::string::npos);
      }
      return std::pair{status_of(r.bytes), seconds};
    }));
  }
  int ok = 0, busy = 0;
  for (auto& f : calls) {
    const auto [status, seconds] = f.get();
    if (status == 200) ++ok;
    if (status == 429) {
      ++busy;
      EXPECT_LT(seconds, 0.6) << "a refusal must not wait for the queue (each queued request takes 1 s)";
    }
  }
  EXPECT_EQ(ok + busy, 20);
  EXPECT_GE(busy, 10);
  EXPECT_GE(ok, 3);
}

TEST_F(BusyFrontTest, ConnectionsPastTheCapGet503AndAreClosed) {
  std::vector<int> held;
  for (int i = 0; i < 40; ++i) {
    held.push_back(connect_loopback(port_));
    ASSERT_GE(held.back(), 0);
  }
  ASSERT_TRUE(eventually([&] { return front_->counters().connections_open == 40; }));
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const Received r = receive(fd, 1000ms);  // until the server closes
  close(fd);
  EXPECT_EQ(status_of(r.bytes), 503) << r.bytes;
  EXPECT_TRUE(r.peer_closed);
  EXPECT_FALSE(r.timed_out);
  for (int fd : held) close(fd);
  EXPECT_TRUE(eventually([&] { return health_answers(); }));
}

// A burst of connections while the server is too busy to accept them: the
// kernel must queue them (a backlog of somaxconn), not reset or drop them.
class BurstFrontTest : public HttpFrontTest {
 protected:
  HttpFrontConfig make_config() override {
    HttpFrontConfig c = HttpFrontTest::make_config();
    c.listen_backlog = backlog;
    c.header_timeout = 5000ms;
    return c;
  }
  void add_routes(HttpFront& front) override {
    HttpFrontTest::add_routes(front);
    // Holds the (single) event loop, so nothing is accepted meanwhile.
    front.route("GET", "/block", RouteRuns::kOnLoop, [](HttpRequest&) {
      std::this_thread::sleep_for(1000ms);
      return text_reply("unblocked");
    });
  }
  int backlog = 0;  // the kernel's somaxconn
};

struct BurstOutcome {
  int ok = 0, reset = 0, other = 0;
};

// n non-blocking clients connect and send GET /health at once; each waits up
// to `limit` for its whole answer.
BurstOutcome burst(int port, int n, std::chrono::milliseconds limit) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);  // EINPROGRESS
    fds.push_back(fd);
  }
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::vector<int> state(n, 0);  // 0 connecting, 1 sent, 2 done
  std::vector<std::string> got(n);
  BurstOutcome out;
  const auto end = Clock::now() + limit;
  int open = n;
  while (open > 0 && Clock::now() < end) {
    std::vector<pollfd> polls;
    std::vector<int> index;
    for (int i = 0; i < n; ++i) {
      if (state[i] == 2) continue;
      polls.push_back(pollfd{fds[i], static_cast<short>(state[i] == 0 ? POLLOUT : POLLIN), 0});
      index.push_back(i);
    }
    if (poll(polls.data(), polls.size(), 50) <= 0) continue;
    for (size_t k = 0; k < polls.size(); ++k) {
      const int i = index[k];
      if (polls[k].revents == 0) continue;
      if (state[i] == 0) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0 || send(fds[i], request.data(), request.size(), MSG_NOSIGNAL) != (ssize_t)request.size()) {
          ++(err == ECONNRESET || err == ECONNREFUSED ? out.reset : out.other);
          state[i] = 2, --open;
        } else {
          state[i] = 1;
        }
        continue;
      }
      char buf[4096];
      const ssize_t r = recv(fds[i], buf, sizeof buf, 0);
      if (r > 0) {
        got[i].append(buf, r);
        continue;
      }
      if (r < 0 && errno == EAGAIN) continue;
      if (r < 0 && errno == ECONNRESET) ++out.reset;
      else if (status_of(got[i]) == 200) ++out.ok;
      else ++out.other;
      state[i] = 2, --open;
    }
  }
  out.other += open;  // still waiting at the deadline
  for (int fd : fds) close(fd);
  return out;
}

TEST_F(BurstFrontTest, ABurstWhileTheLoopIsBusyIsQueuedByTheKernelNotReset) {
  auto blocker = std::async(std::launch::async, [this] {
    return exchange(port_, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n", 5000ms);
  });
  std::this_thread::sleep_for(100ms);  // the loop is now inside /block
  const BurstOutcome out = burst(port_, 1000, 6000ms);
  EXPECT_EQ(status_of(blocker.get().bytes), 200);
  EXPECT_EQ(out.reset, 0);
  EXPECT_EQ(out.other, 0);
  EXPECT_EQ(out.ok, 1000);
}

class StreamingFrontTest : public HttpFrontTest {
 protected:
  HttpFrontConfig make_config() override {
    HttpFrontConfig c = HttpFrontTest::make_config();
    c.max_unsent_bytes = 1 << 20;
    return c;
  }
  void add_routes(HttpFront& front) override {
    HttpFrontTest::add_routes(front);
    front.route("GET", "/firehose", RouteRuns::kOnWorker, [this](HttpRequest&) {
      firehose = std::make_shared<EndlessReply>(true, std::string(64 << 10, 'z'));
      return HttpReply::deferred(firehose);
    });
  }
  std::shared_ptr<EndlessReply> firehose;
};

TEST_F(StreamingFrontTest, AClientThatStopsReadingIsDropped) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ASSERT_TRUE(send_all(fd, "GET /firehose HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(eventually([&] { return firehose != nullptr; }));
  // Keep waking the source: each pull adds 64 KiB the client never reads.
  const bool dropped = eventually(
      [&] {
        firehose->wake();
        return firehose->cancelled.load() == 1;
      },
      5000ms);
  close(fd);
  EXPECT_TRUE(dropped) << "a client that never reads must not hold the reply forever";
  EXPECT_GE(front_->counters().slow_readers_dropped, 1);
}

TEST_F(StreamingFrontTest, StopHonoursTheGraceWithSlowAndStreamingClientsConnected) {
  // Fifty clients dripping their heads, one waiting on a reply that never ends.
  std::vector<int> slow;
  for (int i = 0; i < 50; ++i) {
    slow.push_back(connect_loopback(port_));
    send_all(slow.back(), "GET /health HTTP/1.1\r\n");
  }
  const int waiting = connect_loopback(port_);
  ASSERT_TRUE(send_all(waiting, "GET /endless HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(eventually([&] { return endless != nullptr; }));
  const auto t0 = Clock::now();
  front_->stop(500ms);
  ASSERT_EQ(serve_.wait_for(3s), std::future_status::ready) << "stop() must end serve() within its grace";
  const auto elapsed = Clock::now() - t0;
  EXPECT_GE(elapsed, 450ms) << "the reply in progress gets its grace";
  EXPECT_LT(elapsed, 1500ms);
  EXPECT_EQ(endless->cancelled.load(), 1) << "the unfinished reply is cancelled at the deadline";
  EXPECT_LT(connect_loopback(port_), 0) << "no new connections after stop()";
  for (int fd : slow) close(fd);
  close(waiting);
}

}  // namespace
}  // namespace pagoda::server
