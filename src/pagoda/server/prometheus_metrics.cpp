#include "pagoda/server/prometheus_metrics.h"

#include <fmt/format.h>

namespace pagoda::server {
namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <typename T>
void scalar(std::string& out, const char* name, const char* type, const char* help, T value) {
  header(out, name, type, help);
  out += fmt::format("{} {}\n", name, value);
}

// The tiers below the host (--kv-offload-disk, --kv-offload-redis), label tier.
void lower_tier_metrics(std::string& out, const engine::EngineStats& s) {
  const char* names[2] = {"disk", "redis"};
  bool any = false;
  for (const kvstore::TierIoStats& t : s.lower_tiers) any = any || t.enabled;
  if (!any) return;
  struct Counter {
    const char* name;
    const char* type;
    const char* help;
    int64_t kvstore::TierIoStats::*field;
  };
  static constexpr Counter kCounters[] = {
      {"pagoda_kv_tier_read_blocks_total", "counter", "Blocks read back intact from a tier below the host.",
       &kvstore::TierIoStats::hit_blocks},
      {"pagoda_kv_tier_read_bytes_total", "counter", "Bytes read back from a tier below the host.",
       &kvstore::TierIoStats::bytes_read},
      {"pagoda_kv_tier_written_bytes_total", "counter", "Bytes written to a tier below the host.",
       &kvstore::TierIoStats::bytes_written},
      {"pagoda_kv_tier_written_blocks_total", "counter", "Blocks written to a tier below the host.",
       &kvstore::TierIoStats::blocks_written},
      {"pagoda_kv_tier_writes_dropped_total", "counter",
       "Block writes dropped (queue full, tier down, disk full).", &kvstore::TierIoStats::writes_dropped},
      {"pagoda_kv_tier_write_errors_total", "counter", "Block writes the OS or server refused.",
       &kvstore::TierIoStats::write_errors},
      {"pagoda_kv_tier_corrupt_blocks_total", "counter",
       "Stored blocks refused on read (torn, short, bad checksum): deleted, a miss.",
       &kvstore::TierIoStats::corrupt_blocks},
      {"pagoda_kv_tier_evicted_blocks_total", "counter", "Blocks deleted to stay under the tier's size bound.",
       &kvstore::TierIoStats::blocks_evicted},
      {"pagoda_kv_tier_stored_bytes", "gauge", "Bytes a tier below the host holds (disk).",
       &kvstore::TierIoStats::stored_bytes},
  };
  for (const Counter& c : kCounters) {
    header(out, c.name, c.type, c.help);
    for (int t = 0; t < 2; ++t)
      if (s.lower_tiers[static_cast<size_t>(t)].enabled)
        out += fmt::format("{}{{tier=\"{}\"}} {}\n", c.name, names[t], s.lower_tiers[static_cast<size_t>(t)].*c.field);
  }
  header(out, "pagoda_kv_tier_up", "gauge", "1 when a tier below the host is reachable and writing.");
  for (int t = 0; t < 2; ++t) {
    const kvstore::TierIoStats& x = s.lower_tiers[static_cast<size_t>(t)];
    if (x.enabled) out += fmt::format("pagoda_kv_tier_up{{tier=\"{}\"}} {}\n", names[t], x.connected && !x.writes_stopped ? 1 : 0);
  }
  scalar(out, "pagoda_kv_tier_loads_total", "counter",
         "Requests that waited, holding no step, for their prompt blocks to be read from disk or redis.",
         s.lower_tier_loads);
  scalar(out, "pagoda_kv_tier_loads_in_flight", "gauge",
         "Requests waiting now for their prompt blocks to be read from disk or redis.", s.lower_tier_loads_in_flight);
  header(out, "pagoda_kv_tier_read_seconds", "histogram", "Time to read and verify one block from a tier below the host.");
  for (int t = 0; t < 2; ++t) {
    const kvstore::TierIoStats& x = s.lower_tiers[static_cast<size_t>(t)];
    if (!x.enabled) continue;
    int64_t cumulative = 0;
    for (size_t b = 0; b < x.read_latency_counts.size(); ++b) {
      cumulative += x.read_latency_counts[b];
      const std::string le = b < kvstore::TierIoStats::kLatencyBounds.size()
                                 ? fmt::format("{}", kvstore::TierIoStats::kLatencyBounds[b])
                                 : std::string("+Inf");
      out += fmt::format("pagoda_kv_tier_read_seconds_bucket{{tier=\"{}\",le=\"{}\"}} {}\n", names[t], le, cumulative);
    }
    out += fmt::format("pagoda_kv_tier_read_seconds_sum{{tier=\"{}\"}} {}\n", names[t], x.read_latency_sum);
    out += fmt::format("pagoda_kv_tier_read_seconds_count{{tier=\"{}\"}} {}\n", names[t], cumulative);
  }
}

void histogram(std::string& out, const char* name, const char* help, const engine::LatencyHistogram& h) {
  header(out, name, "histogram", help);
  const auto counts = h.cumulative_counts();
  const auto& bounds = h.upper_bounds();
  for (size_t i = 0; i < bounds.size(); ++i) out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds[i], counts[i]);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, counts.back());
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, h.sum(), name, h.count());
}

// A label value: backslash, double quote and newline escaped (exposition format).
std::string label_value(std::string_view v) {
  std::string out;
  for (char c : v.substr(0, 256)) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void tenant_metrics(std::string& out, const std::map<std::string, TenantCounters, std::less<>>& tenants) {
  if (tenants.empty()) return;
  header(out, "pagoda_tenant_requests_total", "counter", "Requests per tenant, by outcome.");
  for (const auto& [name, c] : tenants) {
    const std::string t = label_value(name);
    out += fmt::format("pagoda_tenant_requests_total{{tenant=\"{}\",outcome=\"accepted\"}} {}\n", t, c.requests_accepted);
    out += fmt::format("pagoda_tenant_requests_total{{tenant=\"{}\",outcome=\"finished\"}} {}\n", t, c.requests_finished);
    for (int r = 0; r < kNumRefusals; ++r)
      out += fmt::format("pagoda_tenant_requests_total{{tenant=\"{}\",outcome=\"refused_{}\"}} {}\n", t,
                         refusal_name(static_cast<Refusal>(r)), c.requests_refused[r]);
  }
  header(out, "pagoda_tenant_tokens_total", "counter", "Tokens per tenant (requests that reached their end).");
  for (const auto& [name, c] : tenants) {
    const std::string t = label_value(name);
    out += fmt::format("pagoda_tenant_tokens_total{{tenant=\"{}\",kind=\"prompt\"}} {}\n", t, c.prompt_tokens);
    out += fmt::format("pagoda_tenant_tokens_total{{tenant=\"{}\",kind=\"completion\"}} {}\n", t, c.completion_tokens);
    out += fmt::format("pagoda_tenant_tokens_total{{tenant=\"{}\",kind=\"cached\"}} {}\n", t, c.cached_prompt_tokens);
  }
}

}  // namespace

std::string render_prometheus_metrics(const engine::EngineStats& s, const HttpCounters& http,
                                      const std::map<std::string, TenantCounters, std::less<>>& tenants) {
  std::string out;
  const auto& kv = s.kv;
  scalar(out, "pagoda_kv_blocks_total", "gauge", "KV cache blocks in the pool.", kv.blocks_total);
  scalar(out, "pagoda_kv_blocks_in_use", "gauge", "KV blocks referenced by running sequences.", kv.blocks_in_use);
  scalar(out, "pagoda_kv_blocks_cached", "gauge", "KV blocks in the prefix cache.", kv.blocks_cached);
  scalar(out, "pagoda_kv_blocks_evictable", "gauge", "Cached, unreferenced KV blocks.", kv.blocks_evictable);
  scalar(out, "pagoda_kv_blocks_free", "gauge", "KV blocks on the free list.", kv.blocks_free);
  scalar(out, "pagoda_kv_namespaces", "gauge",
         "Live KV namespaces (tenants, and salted users holding blocks or running requests).", kv.namespaces_live);
  scalar(out, "pagoda_kv_namespaces_reclaimed_total", "counter",
         "KV namespaces forgotten once nothing referred to them.", kv.namespaces_reclaimed);
  scalar(out, "pagoda_kv_usage_ratio", "gauge", "Fraction of KV blocks in use by sequences.",
         kv.blocks_total ? static_cast<double>(kv.blocks_in_use) / kv.blocks_total : 0.0);
  scalar(out, "pagoda_kv_unwritten_slots", "gauge", "Allocated KV slots not holding K/V (fragmentation).",
         kv.unwritten_slots);
  header(out, "pagoda_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens served from the prefix cache, by the tier the blocks were found in.");
  // Host hits loaded from disk or redis just before are counted under those tiers.
  const int64_t lower_hits = kv.hit_tokens_by_lower_tier[0] + kv.hit_tokens_by_lower_tier[1];
  for (int t = 0; t < kv::kNumTiers; ++t)
    out += fmt::format("pagoda_prefix_cache_hit_tokens_total{{tier=\"{}\"}} {}\n",
                       kv::block_tier_name(static_cast<kv::BlockTier>(t)),
                       kv.hit_tokens_by_tier[t] - (t == static_cast<int>(kv::BlockTier::kHost) ? lower_hits : 0));
  const char* lower_names[2] = {"disk", "redis"};
  for (int t = 0; t < 2; ++t)
    if (s.lower_tiers[static_cast<size_t>(t)].enabled)
      out += fmt::format("pagoda_prefix_cache_hit_tokens_total{{tier=\"{}\"}} {}\n", lower_names[t],
                         kv.hit_tokens_by_lower_tier[static_cast<size_t>(t)]);
  header(out, "pagoda_prefix_cache_miss_tokens_total", "counter", "Prompt tokens computed, by miss reason.");
  for (int r = 1; r < kv::kNumMissReasons; ++r)
    out += fmt::format("pagoda_prefix_cache_miss_tokens_total{{reason=\"{}\"}} {}\n",
                       kv::miss_reason_name(static_cast<kv::MissReason>(r)), kv.miss_tokens_by_reason[r]);
  scalar(out, "pagoda_prefix_cache_hit_rate", "gauge", "Prefix-cache hits over prompt tokens looked up.",
         kv.hit_rate());
  header(out, "pagoda_kv_removed_blocks_total", "counter", "Blocks that left the prefix cache, by reason.");
  for (int r = 0; r < kv::kNumRemovalReasons; ++r)
    out += fmt::format("pagoda_kv_removed_blocks_total{{reason=\"{}\"}} {}\n",
                       kv::removal_reason_name(static_cast<kv::RemovalReason>(r)), kv.removed_blocks_by_reason[r]);

  // The tiers: device (the backend's KV pool) and host (--kv-offload-memory).
  header(out, "pagoda_kv_tier_blocks_capacity", "gauge", "KV blocks each tier holds.");
  out += fmt::format("pagoda_kv_tier_blocks_capacity{{tier=\"device\"}} {}\n", kv.blocks_total);
  out += fmt::format("pagoda_kv_tier_blocks_capacity{{tier=\"host\"}} {}\n", kv.host_blocks_total);
  header(out, "pagoda_kv_tier_blocks_used", "gauge",
         "KV blocks not free in each tier (in use by sequences or holding cached K/V).");
  out += fmt::format("pagoda_kv_tier_blocks_used{{tier=\"device\"}} {}\n", kv.blocks_total - kv.blocks_free);
  out += fmt::format("pagoda_kv_tier_blocks_used{{tier=\"host\"}} {}\n", kv.host_blocks_total - kv.host_blocks_free);
  scalar(out, "pagoda_kv_host_blocks_cached", "gauge",
         "Host-tier blocks holding prefix-cache K/V (written back, or copies of device blocks).", kv.host_blocks_cached);
  scalar(out, "pagoda_kv_host_blocks_swapped", "gauge", "Host-tier blocks held by swapped-out sequences.",
         kv.host_blocks_swapped);
  scalar(out, "pagoda_kv_swapped_sequences", "gauge", "Sequences whose K/V waits in the host tier.",
         kv.sequences_swapped);
  scalar(out, "pagoda_kv_blocks_demoted_total", "counter",
         "Cached blocks the device evicted into the host tier instead of dropping them.", kv.blocks_demoted);
  scalar(out, "pagoda_kv_blocks_written_back_total", "counter",
         "Demotions that copied the block (the others reused a host copy already there).", kv.blocks_written_back);
  scalar(out, "pagoda_kv_blocks_promoted_total", "counter", "Host-tier hits copied back into device blocks.",
         kv.blocks_promoted);
  scalar(out, "pagoda_kv_host_blocks_evicted_total", "counter", "Host-tier blocks reclaimed by host-tier eviction.",
         kv.host_blocks_evicted);
  scalar(out, "pagoda_kv_blocks_lost_total", "counter",
         "Blocks whose transfer between tiers failed (dropped from the cache, recomputed).", kv.blocks_lost);
  const char* directions[runtime::kNumTransferDirections] = {"device_to_host", "host_to_device"};
  header(out, "pagoda_kv_transfer_blocks_total", "counter", "KV blocks copied between the tiers, by direction.");
  for (int d = 0; d < runtime::kNumTransferDirections; ++d)
    out += fmt::format("pagoda_kv_transfer_blocks_total{{direction=\"{}\"}} {}\n", directions[d],
                       s.transfers.blocks[d]);
  header(out, "pagoda_kv_transfer_bytes_total", "counter", "Bytes copied between the tiers, by direction.");
  for (int d = 0; d < runtime::kNumTransferDirections; ++d)
    out += fmt::format("pagoda_kv_transfer_bytes_total{{direction=\"{}\"}} {}\n", directions[d],
                       s.transfers.bytes[d]);
  header(out, "pagoda_kv_transfer_seconds_total", "counter",
         "Time the copies between the tiers took, by direction (on a GPU: on its copy stream).");
  for (int d = 0; d < runtime::kNumTransferDirections; ++d)
    out += fmt::format("pagoda_kv_transfer_seconds_total{{direction=\"{}\"}} {}\n", directions[d],
                       s.transfers.seconds[d]);
  scalar(out, "pagoda_kv_transfer_failures_total", "counter",
         "Calls that moved blocks between the tiers and failed.", s.transfer_failures);
  lower_tier_metrics(out, s);

  scalar(out, "pagoda_queue_length", "gauge", "Requests accepted but not yet started.", s.num_queued_requests);
  scalar(out, "pagoda_waiting_sequences", "gauge", "Sequences waiting (incl. preempted).", s.num_waiting);
  scalar(out, "pagoda_running_sequences", "gauge", "Sequences in the running batch.", s.num_running);
  scalar(out, "pagoda_requests_in_flight", "gauge", "Requests accepted and not finished.", s.num_requests_in_flight);
  scalar(out, "pagoda_preemptions_total", "counter", "Sequences preempted (by swap or by recompute).", s.preemptions);
  scalar(out, "pagoda_swap_preemptions_total", "counter",
         "Preemptions by swap: the K/V went to the host tier and came back, not recomputed.", s.swap_preemptions);
  scalar(out, "pagoda_engine_steps_total", "counter", "Model forward steps.", s.steps);
  scalar(out, "pagoda_engine_overlapped_steps_total", "counter",
         "Steps launched while the one before still ran on the device (--overlap-steps).", s.overlapped_steps);
  header(out, "pagoda_requests_total", "counter", "Requests by outcome.");
  out += fmt::format("pagoda_requests_total{{outcome=\"stop\"}} {}\n", s.requests_finished_stop);
  out += fmt::format("pagoda_requests_total{{outcome=\"length\"}} {}\n", s.requests_finished_length);
  out += fmt::format("pagoda_requests_total{{outcome=\"abort\"}} {}\n", s.requests_aborted);
  out += fmt::format("pagoda_requests_total{{outcome=\"error\"}} {}\n", s.requests_failed);
  out += fmt::format("pagoda_requests_total{{outcome=\"rejected_queue_full\"}} {}\n", s.requests_rejected_queue_full);
  scalar(out, "pagoda_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", s.prompt_tokens);
  scalar(out, "pagoda_generation_tokens_total", "counter", "Generated tokens.", s.generated_tokens);
  scalar(out, "pagoda_jump_forward_tokens_total", "counter",
         "Generated tokens a grammar forced, appended without a forward pass of their own (jump-forward).",
         s.jump_forward_tokens);
  scalar(out, "pagoda_kv_blocks_zeroed_total", "counter", "KV blocks zeroed as they passed from one tenant to another.",
         s.kv_blocks_zeroed);
  scalar(out, "pagoda_kv_compactions_total", "counter", "Token eviction: sequences compacted.", s.kv_compactions);
  scalar(out, "pagoda_kv_evicted_slots_total", "counter", "Token eviction: KV cache slots freed by compactions.",
         s.kv_evicted_slots);
  scalar(out, "pagoda_kv_compactions_deferred_total", "counter",
         "Token eviction: compactions put off for want of fresh blocks.", s.kv_compactions_deferred);
  histogram(out, "pagoda_time_to_first_token_seconds", "Submit to first generated token.", s.time_to_first_token);
  histogram(out, "pagoda_inter_token_latency_seconds", "Time between tokens of one sequence.", s.inter_token_latency);
  histogram(out, "pagoda_step_duration_seconds", "Wall time of one engine step.", s.step_time);

  header(out, "pagoda_http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, n] : http.responses_by_status)
    out += fmt::format("pagoda_http_responses_total{{code=\"{}\"}} {}\n", code, n);
  scalar(out, "pagoda_client_disconnects_total", "counter", "Requests aborted because the client went away.",
         http.client_disconnects);
  tenant_metrics(out, tenants);
  return out;
}

std::string render_grammar_cache_metrics(const GrammarCacheCounters& g) {
  std::string out;
  scalar(out, "pagoda_grammar_cache_grammars", "gauge", "Compiled structured-output grammars cached.", g.grammars);
  scalar(out, "pagoda_grammar_cache_bytes", "gauge",
         "Memory of the cached compiled grammars (states, transition tables, masks, windows).", g.bytes);
  scalar(out, "pagoda_grammar_compiled_total", "counter", "Structured-output grammars compiled (cache misses).",
         g.compiled);
  scalar(out, "pagoda_grammar_cache_evictions_total", "counter",
         "Compiled grammars dropped to stay under --grammar-cache-memory or the grammar count bound.", g.evictions);
  return out;
}

}  // namespace pagoda::server
