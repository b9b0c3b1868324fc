#pragma once
// Synthetic request traces for the KV trace simulator (bench only).
//
//  - long_tailed_requests: independent requests whose prompt and output
//    lengths are log-normal (most short, a few very long), as in chat serving
//    logs; used for the fragmentation table.
//  - multi_turn_trace: chat conversations under per-tenant shared system
//    prompts; each turn's prompt is system + every earlier turn + a new user
//    message; used for the prefix-cache hit-rate comparison.
//
// Deterministic for a given seed. Thread safety: plain functions.

#include <cstdint>
#include <string>
#include <vector>

#include "pagoda/kv/kv_types.h"

namespace pagoda::kv::bench {

struct TraceRequest {
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
};

struct LongTailedTraceConfig {
  int32_t num_requests = 4000;
  int32_t max_context = 4096;      // prompt + output never exceed this
  double prompt_median = 256;      // log-normal median, tokens
  double prompt_sigma = 1.1;       // log-normal shape
  double output_median = 128;
  double output_sigma = 1.0;
  uint64_t seed = 42;
};
std::vector<TraceRequest> long_tailed_requests(const LongTailedTraceConfig& config);

struct ConversationTurn {
  int64_t conversation = 0;
  int32_t turn = 0;              // 0-based
  std::string tenant;            // namespace
  std::vector<TokenId> prompt;   // system + history + this user message
  std::vector<TokenId> reply;    // what the model answers (its K/V is written except the last token's)
};

struct MultiTurnTraceConfig {
  int32_t num_conversations = 1500;
  int32_t num_tenants = 4;
  int32_t system_prompts_per_tenant = 4;  // chosen with Zipf(1) popularity
  double system_prompt_median = 600;      // tokens, log-normal
  double mean_turns = 4.0;                // geometric, >= 1
  double user_median = 40;
  double reply_median = 150;
  double sigma = 0.8;
  int32_t concurrent_conversations = 48;  // conversations interleaved at any time
  uint64_t seed = 7;
};
// Turns in arrival order: conversations overlap (a window of concurrent ones),
// so follow-ups compete with other conversations for cache space.
std::vector<ConversationTurn> multi_turn_trace(const MultiTurnTraceConfig& config);

}  // namespace pagoda::kv::bench
