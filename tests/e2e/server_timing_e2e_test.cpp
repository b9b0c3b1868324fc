// The prefix cache as a timing side channel, probed against the real
// `pagoda serve` on the bundled model (loopback): one client warms a long
// prompt, another sends the same prompt and a fresh one of equal length, and
// their times to the first streamed token are compared.
//
//   - across tenants (two api keys): B's time for A's prompt must not differ
//     from its time for a fresh prompt;
//   - inside a tenant, users salted with X-Pagoda-User: the same for bob
//     after alice;
//   - the control, in the same run: A's (alice's) own repeat must be
//     measurably faster than the fresh send before it, so the test has the
//     power to see a hit and fails if the cache leaked.
//
// The statistic is built for a loaded 2-core box: each probe is a pair (the
// shared prompt and a fresh one, sent back to back in random order), so a
// load spike slows both alike. Under no leak, which of the two is faster is a
// coin toss; a sign test over kPairs pairs fails when one is faster in at
// least kSignLimit of them (16 pairs, 15: a two-sided false-alarm rate of
// 2 x 17 / 2^16, about 0.05%). The control must show the hit faster in at
// least kSignLimit pairs. Medians are compared too: the shared prompt's median must
// lie nearer the fresh prompt's median than the hit's (a leak answers like a
// hit), and the control's hit median must be below half its fresh median.

#include <algorithm>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "raw_http.h"
#include "server_process.h"

namespace pagoda::e2e {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int kPromptTokens = 256;  // long enough that a hit is far faster than prefill
constexpr int kPairs = 16;
constexpr int kSignLimit = 15;

std::string keys_file() {
  // One file per process: ctest -j runs tests of one binary in parallel processes.
  const std::string path = std::string(PAGODA_BINARY_DIR) + "/e2e_timing_keys_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << R"({"keys": [
      {"key": "sk-a", "tenant": "tenant-a"},
      {"key": "sk-b", "tenant": "tenant-b"},
      {"key": "sk-app", "tenant": "app", "user_salt": true}]})";
  return path;
}

struct Client {
  std::string key;
  std::string user;  // X-Pagoda-User, or empty
};

// Milliseconds to the first streamed token of a 1-token greedy completion.
double ttft_ms(int port, const std::vector<int>& prompt, const Client& c) {
  const std::string body =
      json{{"model", "pagoda-tiny"}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"stream", true}}
          .dump();
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + c.key +
                     "\r\nContent-Type: application/json\r\nConnection: close\r\n";
  if (!c.user.empty()) head += "X-Pagoda-User: " + c.user + "\r\n";
  const std::string request = head + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  std::string got;
  const double ms = time_to_first_event_ms(port, request, 60s, &got);
  EXPECT_EQ(status_of(got), 200) << got.substr(0, 300);
  EXPECT_GE(ms, 0) << got.substr(0, 300);
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string ms_list(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += std::to_string(static_cast<int>(x)) + " ";
  return s;
}

// What one victim/prober pairing measured, each vector one entry per pair.
struct Probe {
  std::vector<double> victim_fresh;  // the victim's first send of its prompt (a miss)
  std::vector<double> victim_hit;    // the victim's repeat: the control
  std::vector<double> shared;        // the prober sending the victim's prompt
  std::vector<double> fresh;         // the prober sending a never-seen prompt of equal length
};

Probe probe(int port, const Client& victim, const Client& prober, std::mt19937& rng) {
  auto random_prompt = [&] {
    std::vector<int> p(kPromptTokens);
    for (int& t : p) t = static_cast<int>(rng() % 4000) + 3;
    return p;
  };
  Probe out;
  for (int i = 0; i < kPairs; ++i) {
    const auto secret = random_prompt();
    const auto other = random_prompt();
    out.victim_fresh.push_back(ttft_ms(port, secret, victim));
    out.victim_hit.push_back(ttft_ms(port, secret, victim));
    // Back to back, in random order, so neither is favoured by its position.
    if (rng() % 2 == 0) {
      out.shared.push_back(ttft_ms(port, secret, prober));
      out.fresh.push_back(ttft_ms(port, other, prober));
    } else {
      out.fresh.push_back(ttft_ms(port, other, prober));
      out.shared.push_back(ttft_ms(port, secret, prober));
    }
  }
  return out;
}

// In how many pairs the first series was faster than the second.
int faster_count(const std::vector<double>& a, const std::vector<double>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] < b[i] ? 1 : 0;
  return n;
}

void expect_no_signal_with_a_working_control(const Probe& p, const std::string& who) {
  const double hit = median(p.victim_hit), victim_fresh = median(p.victim_fresh);
  const double shared = median(p.shared), fresh = median(p.fresh);
  const std::string figures = who + ": victim fresh [" + ms_list(p.victim_fresh) + "] hit [" + ms_list(p.victim_hit) +
                              "]; prober shared [" + ms_list(p.shared) + "] fresh [" + ms_list(p.fresh) + "] ms";
  std::printf("%s\n", figures.c_str());
  // The control: the victim's own repeat is a hit, and it shows.
  EXPECT_GE(faster_count(p.victim_hit, p.victim_fresh), kSignLimit) << "the control lost its power: " << figures;
  EXPECT_LT(hit, victim_fresh / 2) << figures;
  // The probe: no consistent difference, and nothing that looks like a hit.
  const int shared_faster = faster_count(p.shared, p.fresh);
  EXPECT_LT(shared_faster, kSignLimit) << "the victim's prompt answers faster: " << figures;
  EXPECT_GT(shared_faster, kPairs - kSignLimit) << "the victim's prompt answers slower: " << figures;
  EXPECT_GT(shared, (hit + fresh) / 2) << "the victim's prompt answers like a hit: " << figures;
}

class CacheTimingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    std::string error;
    ok_ = server_->start({"--model", repo_path("models/pagoda-tiny"), "--api-keys", keys_file(),
                          "--kv-cache-memory", "268435456"},
                         &error);
    if (!ok_) std::fprintf(stderr, "%s\n", error.c_str());
    // One untimed request, so the first timed one pays no start-up cost.
    if (ok_) ttft_ms(server_->port(), std::vector<int>(kPromptTokens, 7), Client{"sk-a", ""});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ok_) << "server did not start"; }
  static int port() { return server_->port(); }
  static inline ServerProcess* server_ = nullptr;
  static inline bool ok_ = false;
};

TEST_F(CacheTimingTest, AnotherTenantsWarmPromptIsNoFasterThanAFreshOne) {
  std::mt19937 rng(71);
  expect_no_signal_with_a_working_control(probe(port(), Client{"sk-a", ""}, Client{"sk-b", ""}, rng),
                                          "tenant-a -> tenant-b");
}

TEST_F(CacheTimingTest, AnotherSaltedUsersWarmPromptIsNoFasterThanAFreshOne) {
  std::mt19937 rng(73);
  expect_no_signal_with_a_working_control(probe(port(), Client{"sk-app", "alice"}, Client{"sk-app", "bob"}, rng),
                                          "app/alice -> app/bob");
}

}  // namespace
}  // namespace pagoda::e2e
