// KV trace simulator: replays synthetic traces through the real KvCacheManager
// and prints the markdown tables of docs/BENCHMARKS.md.
//
//   pagoda_bench_kv_trace [--quick] [--seed N]
//
// 1. Fragmentation: a long-tailed request trace served under a fixed KV budget
//    by (a) contiguous reservation of max_context per request and (b) paging
//    with block sizes 8, 16, 32 (KvCacheManager, prefix cache off).
// 2. Multi-turn chat: prefix-cache hit rate of the radix cache (LRU and
//    value-aware eviction), a hash-per-block cache (peer model) and no cache,
//    at several cache sizes.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "hash_per_block_cache.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "request_traces.h"

namespace pagoda::kv::bench {
namespace {

// ---- 1. fragmentation ------------------------------------------------------------

struct FragmentationResult {
  std::string layout;
  // Averages over the steps where requests were waiting (the server is
  // saturated), so the drain at the end of the trace does not dilute them.
  double used_of_allocated = 0;  // time-averaged written / reserved slots
  double used_of_pool = 0;       // time-averaged written / all slots
  double fragmentation = 0;      // time-averaged reserved-but-unwritten / reserved
  int32_t max_concurrency = 0;
  double mean_concurrency = 0;
  int64_t steps = 0;             // decode steps to serve the whole trace
  int64_t preemptions = 0;
};

struct Running {
  int32_t request = 0;
  int32_t tokens = 0;     // K/V written (prompt + generated so far)
  int32_t generated = 0;
};

struct Averages {
  double used_of_allocated = 0, used_of_pool = 0, fragmentation = 0, concurrency = 0;
  int64_t samples = 0;
  void add(int64_t used, int64_t allocated, int64_t pool, size_t running) {
    if (allocated == 0) return;
    used_of_allocated += static_cast<double>(used) / static_cast<double>(allocated);
    used_of_pool += static_cast<double>(used) / static_cast<double>(pool);
    fragmentation += static_cast<double>(allocated - used) / static_cast<double>(allocated);
    concurrency += static_cast<double>(running);
    ++samples;
  }
  void finish(FragmentationResult& r) const {
    const double n = samples == 0 ? 1.0 : static_cast<double>(samples);
    r.used_of_allocated = used_of_allocated / n;
    r.used_of_pool = used_of_pool / n;
    r.fragmentation = fragmentation / n;
    r.mean_concurrency = concurrency / n;
  }
};

FragmentationResult simulate_contiguous(const std::vector<TraceRequest>& trace, int64_t pool_slots, int32_t max_context) {
  FragmentationResult r;
  r.layout = fmt::format("contiguous, {} slots reserved per request", max_context);
  std::deque<int32_t> waiting(trace.size());
  std::iota(waiting.begin(), waiting.end(), 0);
  std::vector<Running> running;
  Averages avg;
  while (!waiting.empty() || !running.empty()) {
    while (!waiting.empty() && static_cast<int64_t>(running.size() + 1) * max_context <= pool_slots) {
      running.push_back(Running{waiting.front(), trace[static_cast<size_t>(waiting.front())].prompt_tokens, 0});
      waiting.pop_front();
    }
    r.max_concurrency = std::max(r.max_concurrency, static_cast<int32_t>(running.size()));
    int64_t used = 0;
    for (Running& run : running) used += ++run.tokens, ++run.generated;  // this step's token
    if (!waiting.empty()) avg.add(used, static_cast<int64_t>(running.size()) * max_context, pool_slots, running.size());
    std::erase_if(running, [&](const Running& run) {
      return run.generated >= trace[static_cast<size_t>(run.request)].output_tokens;
    });
    ++r.steps;
  }
  avg.finish(r);
  return r;
}

FragmentationResult simulate_paged(const std::vector<TraceRequest>& trace, int64_t pool_slots, int32_t block_size) {
  FragmentationResult r;
  r.layout = fmt::format("paged, block size {}", block_size);
  KvCacheConfig config;
  config.num_blocks = static_cast<int32_t>(pool_slots / block_size);
  config.block_size = block_size;
  config.enable_prefix_cache = false;
  config.record_events = false;
  auto kv = std::move(KvCacheManager::create(config)).value();
  const int32_t watermark = std::max(1, config.num_blocks / 100);  // vLLM's 1% admission headroom
  std::deque<Running> waiting;
  for (int32_t i = 0; i < static_cast<int32_t>(trace.size()); ++i)
    waiting.push_back(Running{i, trace[static_cast<size_t>(i)].prompt_tokens, 0});
  std::vector<Running> running;
  std::vector<TokenId> tokens;
  const std::vector<TokenId> one{1};
  Averages avg;
  while (!waiting.empty() || !running.empty()) {
    // Admit in order while the prompt (plus any tokens generated before a
    // preemption, recomputed) fits above the watermark.
    while (!waiting.empty()) {
      const Running next = waiting.front();
      if (kv->blocks_for_tokens(next.tokens) + watermark > kv->num_available_blocks() && !running.empty()) break;
      tokens.assign(static_cast<size_t>(next.tokens), 0);
      if (!kv->allocate_sequence(next.request, "t", tokens).ok()) break;
      (void)kv->mark_computed(next.request, next.tokens);
      running.push_back(next);
      waiting.pop_front();
    }
    r.max_concurrency = std::max(r.max_concurrency, static_cast<int32_t>(running.size()));
    // One decode token each; out of blocks: preempt the newest (recompute later).
    for (size_t i = 0; i < running.size(); ++i) {
      while (kv->blocks_needed_to_append(running[i].request, 1) > kv->num_available_blocks()) {
        const Running victim = running.back();
        (void)kv->free_sequence(victim.request);
        running.pop_back();
        waiting.push_front(victim);
        ++r.preemptions;
        if (i >= running.size()) break;
      }
      if (i >= running.size()) break;
      Running& run = running[i];
      (void)kv->append_tokens(run.request, one);
      (void)kv->mark_computed(run.request, 1);
      ++run.tokens;
      ++run.generated;
    }
    const KvStats s = kv->stats();
    if (!waiting.empty()) avg.add(s.allocated_slots - s.unwritten_slots, s.allocated_slots, pool_slots, running.size());
    std::erase_if(running, [&](const Running& run) {
      if (run.generated < trace[static_cast<size_t>(run.request)].output_tokens) return false;
      (void)kv->free_sequence(run.request);
      return true;
    });
    ++r.steps;
  }
  avg.finish(r);
  return r;
}

// ---- 2. multi-turn hit rate ------------------------------------------------------

struct HitRateResult {
  std::string cache;
  int64_t skipped_turns = 0;
  double hit_rate = 0;
  int64_t evictions = 0;
  KvStats stats;
};

// Serves turns in order; each stays resident (decoding) while the next
// `in_flight` turns start, then finishes. The reply's K/V is written except
// its last token's (that token is never fed back before the next turn).
// Returns the number of turns skipped because even an empty pool could not
// hold their prompt (reported under the table; 0 in the published runs).
template <typename Allocate, typename Extend, typename Free>
int64_t replay(const std::vector<ConversationTurn>& turns, int32_t in_flight, Allocate allocate, Extend extend,
               Free free) {
  std::deque<int64_t> resident;
  int64_t skipped = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    const ConversationTurn& t = turns[i];
    const auto id = static_cast<int64_t>(i);
    bool admitted = true;
    while (!allocate(id, t)) {
      if (resident.empty()) {
        admitted = false;
        break;
      }
      free(resident.front());
      resident.pop_front();
    }
    if (!admitted) {
      ++skipped;
      continue;
    }
    std::span<const TokenId> reply(t.reply.data(), t.reply.size() - 1);
    while (!extend(id, reply)) {
      if (resident.empty()) break;
      free(resident.front());
      resident.pop_front();
    }
    resident.push_back(id);
    if (static_cast<int32_t>(resident.size()) > in_flight) {
      free(resident.front());
      resident.pop_front();
    }
  }
  while (!resident.empty()) {
    free(resident.front());
    resident.pop_front();
  }
  return skipped;
}

HitRateResult run_radix(const std::vector<ConversationTurn>& turns, int32_t num_blocks, int32_t block_size,
                        int32_t in_flight, EvictionPolicyKind policy, bool prefix_cache) {
  KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  config.eviction_policy = policy;
  config.enable_prefix_cache = prefix_cache;
  config.record_events = false;
  ManualClock clock;  // one tick per turn: deterministic, machine-independent
  auto kv = std::move(KvCacheManager::create(config, &clock)).value();
  HitRateResult r;
  r.skipped_turns = replay(
      turns, in_flight,
      [&](int64_t id, const ConversationTurn& t) {
        clock.advance(1);
        auto m = kv->allocate_sequence(id, t.tenant, t.prompt);
        if (!m.ok()) return false;
        (void)kv->mark_computed(id, static_cast<int64_t>(t.prompt.size()) - m->cached_tokens);
        return true;
      },
      [&](int64_t id, std::span<const TokenId> reply) {
        if (!kv->append_tokens(id, reply).ok()) return false;
        (void)kv->mark_computed(id, static_cast<int64_t>(reply.size()));
        return true;
      },
      [&](int64_t id) { (void)kv->free_sequence(id); });
  r.cache = prefix_cache ? fmt::format("radix tree, {}", eviction_policy_kind_name(policy)) : "no prefix cache";
  r.stats = kv->stats();
  r.hit_rate = r.stats.hit_rate();
  r.evictions = r.stats.removed_blocks_by_reason[static_cast<int>(RemovalReason::kEvictedForSpace)];
  return r;
}

HitRateResult run_hash_per_block(const std::vector<ConversationTurn>& turns, int32_t num_blocks, int32_t block_size,
                                 int32_t in_flight) {
  HashPerBlockCache cache(num_blocks, block_size);
  HitRateResult r;
  r.skipped_turns = replay(
      turns, in_flight, [&](int64_t id, const ConversationTurn& t) { return cache.allocate(id, t.tenant, t.prompt) >= 0; },
      [&](int64_t id, std::span<const TokenId> reply) { return cache.extend(id, reply); },
      [&](int64_t id) { cache.free(id); });
  r.cache = "hash per block (peer model), LRU";
  r.hit_rate = cache.prompt_tokens() == 0 ? 0.0
                                          : static_cast<double>(cache.hit_tokens()) / static_cast<double>(cache.prompt_tokens());
  return r;
}

int run(bool quick, uint64_t seed) {
  // ---- 1 ----
  LongTailedTraceConfig trace_config;
  if (quick) trace_config.num_requests = 600;
  if (seed != 0) trace_config.seed = seed;
  const auto trace = long_tailed_requests(trace_config);
  const int64_t pool_slots = 131072;  // e.g. 16 GiB of an 8B model's fp16 KV (128 KiB per token)
  int64_t prompt_sum = 0, output_sum = 0;
  int32_t longest = 0;
  for (const auto& r : trace) {
    prompt_sum += r.prompt_tokens;
    output_sum += r.output_tokens;
    longest = std::max(longest, r.prompt_tokens + r.output_tokens);
  }
  fmt::print("### Fragmentation: contiguous reservation vs paging\n\n");
  fmt::print("Trace: {} requests, prompt log-normal (median {}, sigma {}), output log-normal (median {}, sigma {}), "
             "max context {}; all arrive at once; mean prompt {:.0f}, mean output {:.0f}, longest request {} tokens. KV budget {} token "
             "slots. Paging admits FCFS above a 1% watermark and preempts the newest request (recompute) when a "
             "decode step finds no block. Averages cover the saturated steps (requests waiting).\n\n",
             trace.size(), trace_config.prompt_median, trace_config.prompt_sigma, trace_config.output_median,
             trace_config.output_sigma, trace_config.max_context, static_cast<double>(prompt_sum) / trace.size(),
             static_cast<double>(output_sum) / trace.size(), longest, pool_slots);
  fmt::print("| layout | used / reserved | used / whole budget | fragmentation (reserved, unwritten) | max concurrency "
             "| mean concurrency | decode steps for the trace | preemptions |\n");
  fmt::print("|---|---|---|---|---|---|---|---|\n");
  std::vector<FragmentationResult> results{simulate_contiguous(trace, pool_slots, trace_config.max_context)};
  for (int32_t bs : {8, 16, 32}) results.push_back(simulate_paged(trace, pool_slots, bs));
  for (const auto& r : results)
    fmt::print("| {} | {:.1f}% | {:.1f}% | {:.1f}% | {} | {:.1f} | {} | {} |\n", r.layout, 100 * r.used_of_allocated,
               100 * r.used_of_pool, 100 * r.fragmentation, r.max_concurrency, r.mean_concurrency, r.steps,
               r.preemptions);

  // ---- 2 ----
  MultiTurnTraceConfig mt;
  if (quick) mt.num_conversations = 300;
  if (seed != 0) mt.seed = seed;
  const auto turns = multi_turn_trace(mt);
  const int32_t block_size = 16;
  const int32_t in_flight = 16;
  int64_t prompt_tokens = 0;
  for (const auto& t : turns) prompt_tokens += static_cast<int64_t>(t.prompt.size());
  // The footprint of caching everything: run with a pool that never evicts.
  const int32_t huge = static_cast<int32_t>(prompt_tokens / block_size + 4 * turns.size() + 1024);
  const HitRateResult unlimited = run_radix(turns, huge, block_size, in_flight, EvictionPolicyKind::kLru, true);
  const int32_t footprint = unlimited.stats.blocks_cached;
  fmt::print("\n### Multi-turn chat: prefix-cache hit rate\n\n");
  fmt::print("Trace: {} conversations, {} turns, {} tenants x {} system prompts (log-normal median {} tokens, Zipf "
             "popularity), geometric turns (mean {}), user messages median {} tokens, replies median {}; {} "
             "conversations interleaved, {} requests resident at a time; block size {}. {} prompt tokens in all. "
             "Caching everything would take {} blocks; the columns are KV pools of a fixed number of blocks (in-flight "
             "requests included), from roomy to tight. Hit rate = prompt tokens served from cache / prompt tokens.\n\n",
             mt.num_conversations, turns.size(), mt.num_tenants, mt.system_prompts_per_tenant, mt.system_prompt_median,
             mt.mean_turns, mt.user_median, mt.reply_median, mt.concurrent_conversations, in_flight, block_size,
             prompt_tokens, footprint);
  fmt::print("| cache | unlimited |");
  const std::vector<int32_t> pool_sizes{8192, 4096, 2048, 1536, 1024};
  for (int32_t n : pool_sizes) fmt::print(" {} blocks |", n);
  fmt::print("\n|---|---|");
  for (size_t i = 0; i < pool_sizes.size(); ++i) fmt::print("---|");
  fmt::print("\n");
  struct Row {
    std::string name;
    std::function<HitRateResult(int32_t)> run;
  };
  const std::vector<Row> rows{
      {"radix tree, lru", [&](int32_t n) { return run_radix(turns, n, block_size, in_flight, EvictionPolicyKind::kLru, true); }},
      {"radix tree, value_aware",
       [&](int32_t n) { return run_radix(turns, n, block_size, in_flight, EvictionPolicyKind::kValueAware, true); }},
      {"hash per block (peer model), lru", [&](int32_t n) { return run_hash_per_block(turns, n, block_size, in_flight); }},
      {"no prefix cache", [&](int32_t n) { return run_radix(turns, n, block_size, in_flight, EvictionPolicyKind::kLru, false); }},
  };
  std::vector<HitRateResult> lru_results;
  int64_t skipped = 0;
  for (const Row& row : rows) {
    fmt::print("| {} |", row.name);
    fmt::print(" {:.2f}% |", 100 * row.run(huge).hit_rate);
    for (int32_t n : pool_sizes) {
      const HitRateResult r = row.run(n);
      if (row.name == "radix tree, lru") lru_results.push_back(r);
      skipped += r.skipped_turns;
      fmt::print(" {:.2f}% |", 100 * r.hit_rate);
    }
    fmt::print("\n");
  }
  fmt::print("\nTurns skipped because a prompt did not fit an empty pool (all runs): {}\n", skipped);
  fmt::print("\nMiss reasons (radix tree, lru), share of prompt tokens:\n\n| cache size | hit |");
  for (int reason = 1; reason < kNumMissReasons; ++reason) fmt::print(" {} |", miss_reason_name(static_cast<MissReason>(reason)));
  fmt::print("\n|---|---|");
  for (int reason = 1; reason < kNumMissReasons; ++reason) fmt::print("---|");
  fmt::print("\n");
  for (size_t i = 0; i < pool_sizes.size(); ++i) {
    const KvStats& s = lru_results[i].stats;
    const double total = static_cast<double>(s.hit_tokens + s.miss_tokens);
    fmt::print("| {} blocks | {:.1f}% |", pool_sizes[i], 100 * s.hit_tokens / total);
    for (int reason = 1; reason < kNumMissReasons; ++reason) fmt::print(" {:.1f}% |", 100 * s.miss_tokens_by_reason[reason] / total);
    fmt::print("\n");
  }
  return 0;
}

}  // namespace
}  // namespace pagoda::kv::bench

int main(int argc, char** argv) {
  bool quick = false;
  uint64_t seed = 0;  // 0: the published traces' seeds
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      fmt::print(stderr, "usage: pagoda_bench_kv_trace [--quick] [--seed N]\n");
      return 2;
    }
  }
  return pagoda::kv::bench::run(quick, seed);
}
