#include "request_traces.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace pagoda::kv::bench {
namespace {

int32_t log_normal(std::mt19937_64& rng, double median, double sigma, int32_t lo, int32_t hi) {
  std::lognormal_distribution<double> d(std::log(median), sigma);
  return std::clamp(static_cast<int32_t>(std::lround(d(rng))), lo, hi);
}

std::vector<TokenId> random_tokens(std::mt19937_64& rng, int32_t n) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<TokenId>(rng() % 100000);
  return t;
}

}  // namespace

std::vector<TraceRequest> long_tailed_requests(const LongTailedTraceConfig& c) {
  std::mt19937_64 rng(c.seed);
  std::vector<TraceRequest> out;
  out.reserve(static_cast<size_t>(c.num_requests));
  for (int32_t i = 0; i < c.num_requests; ++i) {
    TraceRequest r;
    r.prompt_tokens = log_normal(rng, c.prompt_median, c.prompt_sigma, 4, c.max_context - 64);
    r.output_tokens = log_normal(rng, c.output_median, c.output_sigma, 1, c.max_context - r.prompt_tokens);
    out.push_back(r);
  }
  return out;
}

std::vector<ConversationTurn> multi_turn_trace(const MultiTurnTraceConfig& c) {
  std::mt19937_64 rng(c.seed);
  // System prompts per tenant; popularity Zipf(1) within a tenant.
  std::vector<std::vector<std::vector<TokenId>>> systems(static_cast<size_t>(c.num_tenants));
  for (auto& tenant : systems)
    for (int32_t s = 0; s < c.system_prompts_per_tenant; ++s)
      tenant.push_back(random_tokens(rng, log_normal(rng, c.system_prompt_median, 0.6, 32, 4000)));
  std::vector<double> zipf;
  for (int32_t s = 0; s < c.system_prompts_per_tenant; ++s) zipf.push_back(1.0 / (s + 1));
  std::discrete_distribution<int32_t> pick_system(zipf.begin(), zipf.end());
  std::geometric_distribution<int32_t> extra_turns(1.0 / c.mean_turns);

  struct Live {
    int64_t id;
    std::string tenant;
    std::vector<TokenId> history;
    int32_t turn = 0;
    int32_t turns = 1;
  };
  std::vector<ConversationTurn> out;
  std::vector<Live> live;
  int64_t next_id = 0;
  auto start_conversation = [&]() {
    Live l;
    l.id = next_id++;
    const int32_t tenant = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.num_tenants));
    l.tenant = "tenant_" + std::to_string(tenant);
    l.history = systems[static_cast<size_t>(tenant)][static_cast<size_t>(pick_system(rng))];
    l.turns = 1 + extra_turns(rng);
    live.push_back(std::move(l));
  };
  while (next_id < c.num_conversations || !live.empty()) {
    while (next_id < c.num_conversations && static_cast<int32_t>(live.size()) < c.concurrent_conversations)
      start_conversation();
    // The next turn comes from a random live conversation (users think at
    // different speeds).
    const size_t i = rng() % live.size();
    Live& l = live[i];
    ConversationTurn t;
    t.conversation = l.id;
    t.turn = l.turn;
    t.tenant = l.tenant;
    const auto user = random_tokens(rng, log_normal(rng, c.user_median, c.sigma, 1, 2000));
    l.history.insert(l.history.end(), user.begin(), user.end());
    t.prompt = l.history;
    t.reply = random_tokens(rng, log_normal(rng, c.reply_median, c.sigma, 1, 2000));
    l.history.insert(l.history.end(), t.reply.begin(), t.reply.end());
    out.push_back(std::move(t));
    if (++l.turn == l.turns) live.erase(live.begin() + static_cast<int64_t>(i));
  }
  return out;
}

}  // namespace pagoda::kv::bench
