// `pagoda route`'s client side and its checks of the replicas, end to end: a
// real `pagoda serve` replica of the bundled model and a real router on
// loopback, with raw sockets where a well-behaved client library would hide
// the point.
//
//   - the router serves on the hardened HTTP front: hundreds of idle or
//     half-sent connections starve nobody and are closed at the header
//     deadline; a burst of connections is queued by the kernel, not reset;
//     requests past --max-open-requests get 429 with Retry-After at once
//     while the others stream to the end; an oversized body is a 413 before
//     it is read; the router's /metrics counts it all;
//   - the tokenizer check: a replica that advertises another tokenizer
//     fingerprint is named in a warning and routed by load only, or with
//     --strict-tokenizer kept out of rotation.
// Bounded in count (a few hundred loopback connections) and time.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "pagoda_process.h"

namespace pagoda::e2e {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const char* kModel = "models/pagoda-tiny";

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

int connect_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
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

bool send_all(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Everything the peer sends until it closes or `limit` passes.
std::string read_until_closed(int fd, std::chrono::milliseconds limit, bool* closed) {
  std::string got;
  *closed = false;
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r <= 0) {
      *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(r));
  }
  return got;
}

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

double metric(const std::string& text, const std::string& line_prefix) {
  const size_t at = text.find("\n" + line_prefix + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + line_prefix.size() + 2));
}

std::string metrics_of(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10, 0);
  auto res = c.Get("/metrics");
  return res ? res->body : std::string();
}

int healthy_backends(int router_port) {
  httplib::Client c("127.0.0.1", router_port);
  auto res = c.Get("/health");
  if (!res) return -1;
  const json j = json::parse(res->body, nullptr, false);
  return j.is_object() && j.contains("healthy_backends") ? j["healthy_backends"].get<int>() : -1;
}

std::string completion_body(int max_tokens, bool stream) {
  json body = {{"model", "pagoda-tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", max_tokens},
               {"temperature", 0}};
  if (stream) body["stream"] = true;
  return body.dump();
}

// ---- the hardened front ------------------------------------------------------------

class RouterFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    ASSERT_TRUE(replica_.start({"serve", "--model", source_path(kModel), "--host", "127.0.0.1", "--port", "0",
                                "--max-queued", "64"},
                               &error))
        << error;
    ASSERT_TRUE(router_.start({"route", "--policy", "least-loaded", "--host", "127.0.0.1", "--port", "0", "--backend",
                               replica_.url(), "--health-interval", "0.2", "--http-header-timeout", "1",
                               "--max-open-requests", std::to_string(kMaxOpen), "--http-threads", "2"},
                              &error))
        << error;
    ASSERT_TRUE(wait_until([&] { return healthy_backends(router_.port()) == 1; }, 10s)) << router_.stderr_text();
  }

  static constexpr int kMaxOpen = 4;
  PagodaProcess replica_;
  PagodaProcess router_;
};

TEST_F(RouterFrontTest, HalfSentConnectionsStarveNobodyAndCloseAtTheHeaderDeadline) {
  // 300 connections that send half a request head and then nothing: a
  // thread-per-connection server would have no thread left for anyone else.
  std::vector<int> stalled;
  for (int i = 0; i < 300; ++i) {
    const int fd = connect_loopback(router_.port());
    ASSERT_GE(fd, 0) << "connection " << i;
    ASSERT_TRUE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
    stalled.push_back(fd);
  }
  const auto asked = Clock::now();
  httplib::Client c("127.0.0.1", router_.port());
  c.set_read_timeout(30, 0);
  for (int i = 0; i < 3; ++i) {
    auto res = c.Post("/v1/completions", completion_body(2, false), "application/json");
    ASSERT_TRUE(res) << "request " << i << " starved by the stalled connections";
    EXPECT_EQ(res->status, 200) << res->body;
  }
  EXPECT_LT(Clock::now() - asked, 20s);
  // --http-header-timeout 1: every stalled connection is closed, without an answer, soon after.
  int closed = 0;
  for (int fd : stalled) {
    bool was_closed = false;
    read_until_closed(fd, 6000ms, &was_closed);
    closed += was_closed ? 1 : 0;
    close(fd);
  }
  EXPECT_EQ(closed, 300);
  const std::string m = metrics_of(router_.port());
  EXPECT_GE(metric(m, "pagoda_router_http_timeouts_total{phase=\"header\"}"), 300) << m;
  EXPECT_LE(metric(m, "pagoda_router_http_connections_open"), 2) << "the /metrics request's own, at most one more";
}

TEST_F(RouterFrontTest, ABurstOfConnectionsIsQueuedNotReset) {
  constexpr int kBurst = 400;
  std::vector<std::future<int>> answers;
  std::atomic<int> refused{0};
  // Threads in groups: all connect at once-ish, each reads its whole answer.
  for (int i = 0; i < kBurst; ++i)
    answers.push_back(std::async(std::launch::async, [this, &refused] {
      const int fd = connect_loopback(router_.port());
      if (fd < 0) {
        ++refused;
        return 0;
      }
      send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
      bool closed = false;
      const std::string got = read_until_closed(fd, 20000ms, &closed);
      close(fd);
      return status_of(got);
    }));
  int ok = 0;
  for (auto& a : answers) ok += a.get() == 200 ? 1 : 0;
  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(ok, kBurst);
}

TEST_F(RouterFrontTest, RequestsPastTheOpenLimitGet429AtOnceAndTheRestStreamToTheEnd) {
  constexpr int kClients = 24;
  struct Outcome {
    int status = 0;
    bool retry_after = false;
    bool done = false;
  };
  std::vector<std::future<Outcome>> futures;
  for (int i = 0; i < kClients; ++i)
    futures.push_back(std::async(std::launch::async, [this] {
      httplib::Client c("127.0.0.1", router_.port());
      c.set_read_timeout(60, 0);
      Outcome o;
      auto res = c.Post("/v1/completions", completion_body(16, true), "application/json");
      if (!res) return o;
      o.status = res->status;
      o.retry_after = res->has_header("Retry-After");
      o.done = res->body.find("data: [DONE]") != std::string::npos;
      return o;
    }));
  int ok = 0, busy = 0, other = 0;
  for (auto& f : futures) {
    const Outcome o = f.get();
    if (o.status == 200) {
      ++ok;
      EXPECT_TRUE(o.done) << "a stream the router accepted must reach [DONE]";
    } else if (o.status == 429) {
      ++busy;
      EXPECT_TRUE(o.retry_after);
    } else {
      ++other;
    }
  }
  EXPECT_EQ(other, 0);
  EXPECT_GE(ok, kMaxOpen);
  EXPECT_GT(busy, 0) << kClients << " streams at once must overrun " << kMaxOpen << " open requests";
  EXPECT_EQ(ok + busy, kClients);
  const std::string m = metrics_of(router_.port());
  EXPECT_EQ(metric(m, "pagoda_router_http_busy_refusals_total"), busy) << m;
  EXPECT_TRUE(wait_until(
      [&] {
        return metric(metrics_of(router_.port()),
                      "pagoda_router_backend_in_flight{backend=\"" + replica_.url() + "\"}") == 0;
      },
      5s))
      << metrics_of(router_.port());
}

TEST_F(RouterFrontTest, AnOversizedBodyIsRefusedBeforeItIsRead) {
  const int fd = connect_loopback(router_.port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd,
                       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 100000000\r\n\r\n{"));
  bool closed = false;
  const std::string got = read_until_closed(fd, 5000ms, &closed);
  close(fd);
  EXPECT_EQ(status_of(got), 413) << got;
  EXPECT_NE(got.find("\"error\""), std::string::npos) << "the OpenAI error shape: " << got;
}

// A non-streamed completion sends nothing until it is done; its prefill stops
// counting as queued once the replica's load report shows it running, not
// at its end.
TEST_F(RouterFrontTest, ALongNonStreamedRequestCountsAsRunningOnceTheReplicaReportsIt) {
  const std::string url = replica_.url();
  auto answer = std::async(std::launch::async, [this] {
    httplib::Client c("127.0.0.1", router_.port());
    c.set_read_timeout(120, 0);
    json body = {{"model", "pagoda-tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 900},
                 {"temperature", 0}, {"ignore_eos", true}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    return res ? res->status : 0;
  });
  bool settled_while_running = false;
  const auto deadline = Clock::now() + 60s;
  while (Clock::now() < deadline && answer.wait_for(20ms) != std::future_status::ready) {
    const std::string m = metrics_of(router_.port());
    if (metric(m, "pagoda_router_backend_in_flight{backend=\"" + url + "\"}") == 1 &&
        metric(m, "pagoda_router_backend_prefills_settled_by_load_total{backend=\"" + url + "\"}") == 1) {
      settled_while_running = true;
      break;
    }
  }
  EXPECT_EQ(answer.get(), 200);
  EXPECT_TRUE(settled_while_running) << metrics_of(router_.port());
}

// ---- the tokenizer check -----------------------------------------------------------

// The bundled model with a tokenizer_config.json that differs by one byte:
// the same weights, another tokenizer fingerprint.
std::string model_with_other_tokenizer() {
  namespace fs = std::filesystem;
  const fs::path model = source_path(kModel);
  const fs::path dir = fs::path(PAGODA_BINARY_DIR) / ("router_other_tokenizer." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(model))
    if (entry.path().filename() != "tokenizer_config.json") fs::create_symlink(entry.path(), dir / entry.path().filename());
  fs::copy_file(model / "tokenizer_config.json", dir / "tokenizer_config.json");
  std::ofstream(dir / "tokenizer_config.json", std::ios::app) << "\n";
  return dir.string();
}

std::string fingerprint_of(int replica_port) {
  httplib::Client c("127.0.0.1", replica_port);
  auto res = c.Get("/v1/models");
  if (!res || res->status != 200) return "";
  const json j = json::parse(res->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || j["data"].empty()) return "";
  return j["data"][0].value("tokenizer_fingerprint", "");
}

TEST(RouterTokenizerCheck, AReplicaWithAnotherTokenizerIsNamedAndRoutedByLoadOrKeptOut) {
  const std::string other_dir = model_with_other_tokenizer();
  PagodaProcess same, other;
  std::string error;
  ASSERT_TRUE(same.start({"serve", "--model", source_path(kModel), "--host", "127.0.0.1", "--port", "0"}, &error))
      << error;
  ASSERT_TRUE(other.start({"serve", "--model", other_dir, "--served-model-name", "pagoda-tiny", "--host", "127.0.0.1",
                           "--port", "0"},
                          &error))
      << error;
  const std::string fp_same = fingerprint_of(same.port());
  const std::string fp_other = fingerprint_of(other.port());
  EXPECT_EQ(fp_same.size(), 64u);
  EXPECT_EQ(fp_other.size(), 64u);
  EXPECT_NE(fp_same, fp_other);

  {
    PagodaProcess router;
    ASSERT_TRUE(router.start({"route", "--model", source_path(kModel), "--port", "0", "--health-interval", "0.2",
                              "--backend", same.url(), "--backend", other.url()},
                             &error))
        << error;
    ASSERT_TRUE(wait_until([&] { return healthy_backends(router.port()) == 2; }, 10s)) << router.stderr_text();
    const std::string err = router.stderr_text();
    EXPECT_NE(err.find("warning: backend " + other.url() + " tokenizes differently"), std::string::npos) << err;
    EXPECT_NE(err.find("routed by load only"), std::string::npos) << err;
    EXPECT_EQ(err.find("warning: backend " + same.url()), std::string::npos) << err;
    const std::string m = metrics_of(router.port());
    EXPECT_EQ(metric(m, "pagoda_router_backend_tokenizer_match{backend=\"" + same.url() + "\"}"), 1) << m;
    EXPECT_EQ(metric(m, "pagoda_router_backend_tokenizer_match{backend=\"" + other.url() + "\"}"), 0) << m;
    httplib::Client c("127.0.0.1", router.port());
    c.set_read_timeout(30, 0);
    auto res = c.Post("/v1/completions", completion_body(2, false), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(router.stop(SIGTERM), 0);
  }
  {
    PagodaProcess strict;
    ASSERT_TRUE(strict.start({"route", "--model", source_path(kModel), "--port", "0", "--health-interval", "0.2",
                              "--strict-tokenizer", "--backend", same.url(), "--backend", other.url()},
                             &error))
        << error;
    ASSERT_TRUE(wait_until([&] { return healthy_backends(strict.port()) == 1; }, 10s)) << strict.stderr_text();
    std::this_thread::sleep_for(1s);  // several probes later it is still out
    EXPECT_EQ(healthy_backends(strict.port()), 1);
    const std::string err = strict.stderr_text();
    EXPECT_NE(err.find("warning: backend " + other.url() + " tokenizes differently"), std::string::npos) << err;
    EXPECT_NE(err.find("kept out of rotation"), std::string::npos) << err;
    httplib::Client c("127.0.0.1", strict.port());
    c.set_read_timeout(30, 0);
    for (int i = 0; i < 4; ++i) {
      auto res = c.Post("/v1/completions", completion_body(2, false), "application/json");
      ASSERT_TRUE(res);
      EXPECT_EQ(res->status, 200) << res->body;
    }
    const std::string m = metrics_of(strict.port());
    EXPECT_EQ(metric(m, "pagoda_router_backend_requests_total{backend=\"" + other.url() + "\"}"), 0) << m;
    EXPECT_EQ(strict.stop(SIGTERM), 0);
  }
  std::filesystem::remove_all(other_dir);
}

}  // namespace
}  // namespace pagoda::e2e
