#pragma once
// A multi-turn chat workload through a running engine, shared by the CPU and
// GPU benchmarks of the host KV tier (issue #18).
//
// `conversations` conversations of `turns` turns each: a turn's prompt is the
// whole conversation so far (earlier prompts and replies) plus `user_tokens`
// new tokens, and the reply is `output_tokens` tokens (ignore_eos), appended
// to the history. Turns go out round-robin (turn 1 of every conversation,
// then turn 2, ...), at most `concurrency` requests in flight, a
// conversation's next turn only after its previous reply is complete. So
// between two turns of one conversation every other conversation runs, and
// the working set (every conversation's history) is conversations x turns x
// (user_tokens + output_tokens) tokens: with a device pool a third of that,
// LRU on the device alone misses every history, and a host tier that holds it
// turns those misses into copies.
//
// Reported from the client side: TTFT (submit to first token) mean / p50 /
// p90 / p99, output tok/s over the whole run, prompt tokens sent and the
// cached ones (usage.cached_tokens), and the engine's counters (hits by tier,
// transfers, preemptions).
//
// Thread safety: run() drives one started engine from the calling thread.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/engine/engine.h"

namespace pagoda::bench {

struct MultiTurnConfig {
  int32_t conversations = 16;
  int32_t turns = 6;
  int32_t user_tokens = 64;
  int32_t output_tokens = 16;
  int32_t concurrency = 8;
  int32_t vocab_size = 4096;
  uint32_t seed = 1;
  double max_seconds = 600;

  int64_t working_set_tokens() const {
    return static_cast<int64_t>(conversations) * turns * (user_tokens + output_tokens);
  }
};

inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())))];
}

// The runner's transfer counters minus a snapshot taken before a run (a runner
// may serve several engines one after another).
inline runtime::TransferStats transfers_since(const runtime::TransferStats& now, const runtime::TransferStats& base) {
  runtime::TransferStats d = now;
  for (int i = 0; i < runtime::kNumTransferDirections; ++i) {
    d.blocks[i] -= base.blocks[i];
    d.bytes[i] -= base.bytes[i];
    d.seconds[i] -= base.seconds[i];
  }
  d.failed_calls -= base.failed_calls;
  return d;
}

// Request timelines collected from an engine (EngineConfig::timeline_sink =
// log.sink()), summarised per phase by run_multi_turn.
class TimelineLog {
 public:
  std::function<void(const engine::RequestTimeline&)> sink() {
    return [this](const engine::RequestTimeline& t) {
      std::lock_guard lock(mutex_);
      timelines_.push_back(t);
    };
  }
  std::vector<engine::RequestTimeline> take() {
    std::lock_guard lock(mutex_);
    return std::move(timelines_);
  }

 private:
  std::mutex mutex_;
  std::vector<engine::RequestTimeline> timelines_;
};

// Median per phase (ms) of the timelines that pass `keep`, printed as one line under `label`.
inline nlohmann::json summarise_timelines(const std::vector<engine::RequestTimeline>& all, const std::string& label,
                                          const std::function<bool(const engine::RequestTimeline&)>& keep) {
  std::vector<double> queue, issue, load, load_to_step, step, step_wait, after_load, counts[6];
  int64_t n = 0;
  for (const engine::RequestTimeline& t : all) {
    if (!keep(t) || t.admitted_s < 0 || t.first_step_start_s < 0 || t.first_step_end_s < 0) continue;
    ++n;
    queue.push_back(t.admitted_s * 1e3);
    const double ready = t.load_enqueued_s >= 0 ? t.load_enqueued_s : t.admitted_s;
    issue.push_back((ready - t.admitted_s) * 1e3);
    if (t.load_done_s >= 0 && t.load_enqueued_s >= 0) {
      load.push_back((t.load_done_s - t.load_enqueued_s) * 1e3);
      after_load.push_back((t.first_step_end_s - t.load_done_s) * 1e3);
    }
    step_wait.push_back((t.first_step_start_s - ready) * 1e3);
    step.push_back((t.first_step_end_s - t.first_step_start_s) * 1e3);
    load_to_step.push_back((t.first_token_s - t.first_step_end_s) * 1e3);
    counts[0].push_back(t.admitted_with);
    counts[1].push_back(t.first_step_sequences);
    counts[2].push_back(t.first_step_tokens);
    counts[3].push_back(t.admission_h2d_blocks);
    counts[4].push_back(t.steps_before_first_token);
    counts[5].push_back(t.host_hit_tokens);
  }
  auto p50 = [](const std::vector<double>& v) { return percentile(v, 50); };
  nlohmann::json j = {{"requests", n},
                      {"admitted_ms_p50", p50(queue)},
                      {"transfers_enqueued_after_admission_ms_p50", p50(issue)},
                      {"load_ms_p50", p50(load)},
                      {"loads_timed", static_cast<int64_t>(load.size())},
                      {"first_step_start_after_enqueue_ms_p50", p50(step_wait)},
                      {"first_step_ms_p50", p50(step)},
                      {"first_step_end_after_load_done_ms_p50", p50(after_load)},
                      {"first_token_after_first_step_ms_p50", p50(load_to_step)},
                      {"admitted_with_p50", p50(counts[0])},
                      {"first_step_sequences_p50", p50(counts[1])},
                      {"first_step_tokens_p50", p50(counts[2])},
                      {"admission_h2d_blocks_p50", p50(counts[3])},
                      {"steps_before_first_token_p50", p50(counts[4])},
                      {"host_hit_tokens_p50", p50(counts[5])}};
  std::printf("  timeline %s (%lld requests), medians: admitted %.1f ms after submit, transfers enqueued +%.1f, "
              "load %.1f ms (%zu timed), first step starts +%.1f after enqueue and takes %.1f ms (ends %.1f ms after "
              "the load), first token +%.1f; admitted with %.0f, first step %.0f seqs / %.0f tokens, %.0f blocks "
              "loaded in its step, %.0f host-hit tokens, %.0f steps to the first token\n",
              label.c_str(), static_cast<long long>(n), p50(queue), p50(issue), p50(load), load.size(), p50(step_wait),
              p50(step), p50(after_load), p50(load_to_step), p50(counts[0]), p50(counts[1]), p50(counts[2]),
              p50(counts[3]), p50(counts[5]), p50(counts[4]));
  return j;
}

// Runs the workload on `eng` (started) and returns its figures; prints one
// summary line. `base`: the runner's transfer counters before the run;
// `timelines`: the engine's timeline log, summarised per phase (all requests,
// host hits, the rest) when given.
inline nlohmann::json run_multi_turn(engine::Engine& eng, const MultiTurnConfig& c, const std::string& label,
                                     const runtime::TransferStats& base = {}, TimelineLog* timelines = nullptr) {
  using Clock = std::chrono::steady_clock;
  std::mt19937 rng(c.seed);
  std::uniform_int_distribution<int32_t> token(3, c.vocab_size - 1);
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(c.conversations));
  std::vector<int32_t> turns_done(static_cast<size_t>(c.conversations), 0);
  std::vector<bool> busy(static_cast<size_t>(c.conversations), false);
  std::deque<std::pair<int32_t, int32_t>> queue;  // (conversation, turn), round-robin
  for (int32_t t = 0; t < c.turns; ++t)
    for (int32_t i = 0; i < c.conversations; ++i) queue.emplace_back(i, t);

  struct InFlight {
    int32_t conversation = 0;
    int32_t turn = 0;
    std::shared_ptr<engine::RequestStream> stream;
    Clock::time_point submitted;
    bool first = false;
    std::vector<int32_t> reply;
  };
  std::vector<InFlight> in_flight;
  std::vector<double> ttft_ms;
  std::vector<std::vector<double>> ttft_by_turn(static_cast<size_t>(c.turns));
  int64_t prompt_tokens = 0, cached_tokens = 0, output_tokens = 0, failed = 0;
  const auto t0 = Clock::now();
  bool timed_out = false;
  while (!queue.empty() || !in_flight.empty()) {
    if (std::chrono::duration<double>(Clock::now() - t0).count() > c.max_seconds) {
      timed_out = true;
      break;
    }
    // Submit ready turns in order while there is room.
    for (auto it = queue.begin(); it != queue.end() && static_cast<int32_t>(in_flight.size()) < c.concurrency;) {
      const auto [conv, turn] = *it;
      if (busy[static_cast<size_t>(conv)] || turns_done[static_cast<size_t>(conv)] != turn) {
        ++it;
        continue;
      }
      std::vector<int32_t>& h = history[static_cast<size_t>(conv)];
      for (int32_t k = 0; k < c.user_tokens; ++k) h.push_back(token(rng));
      engine::GenerationRequest request;
      request.prompt_tokens = h;
      request.sampling.temperature = 0.0f;
      request.sampling.max_tokens = c.output_tokens;
      request.sampling.ignore_eos = true;
      auto stream = eng.submit(std::move(request));
      if (!stream.ok()) {
        std::fprintf(stderr, "%s: submit failed: %s\n", label.c_str(), stream.status().to_string().c_str());
        ++failed;
        it = queue.erase(it);
        ++turns_done[static_cast<size_t>(conv)];
        continue;
      }
      prompt_tokens += static_cast<int64_t>(h.size());
      busy[static_cast<size_t>(conv)] = true;
      in_flight.push_back(InFlight{conv, turn, *stream, Clock::now(), false, {}});
      it = queue.erase(it);
    }
    bool any = false;
    for (size_t i = 0; i < in_flight.size();) {
      InFlight& f = in_flight[i];
      bool finished = false;
      while (auto out = f.stream->next(std::chrono::milliseconds(0))) {
        any = true;
        for (const auto& ch : out->choices) {
          if (!ch.tokens.empty() && !f.first) {
            f.first = true;
            ttft_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - f.submitted).count());
            ttft_by_turn[static_cast<size_t>(f.turn)].push_back(ttft_ms.back());
          }
          f.reply.insert(f.reply.end(), ch.tokens.begin(), ch.tokens.end());
        }
        if (out->finished) {
          finished = true;
          cached_tokens += out->usage.cached_tokens;
          if (!out->error.empty()) {
            ++failed;
            std::fprintf(stderr, "%s: request failed: %s\n", label.c_str(), out->error.c_str());
          }
          break;
        }
      }
      if (!finished) {
        ++i;
        continue;
      }
      const size_t conv = static_cast<size_t>(f.conversation);
      output_tokens += static_cast<int64_t>(f.reply.size());
      history[conv].insert(history[conv].end(), f.reply.begin(), f.reply.end());
      busy[conv] = false;
      ++turns_done[conv];
      in_flight.erase(in_flight.begin() + static_cast<int64_t>(i));
    }
    if (!any) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  engine::EngineStats s = eng.stats();
  s.transfers = transfers_since(s.transfers, base);
  double mean_ttft = 0;
  for (double x : ttft_ms) mean_ttft += x;
  mean_ttft = ttft_ms.empty() ? 0.0 : mean_ttft / static_cast<double>(ttft_ms.size());
  const int d2h = static_cast<int>(runtime::TransferDirection::kDeviceToHost);
  const int h2d = static_cast<int>(runtime::TransferDirection::kHostToDevice);
  auto gbps = [&](int d) { return s.transfers.seconds[d] > 0 ? s.transfers.bytes[d] / s.transfers.seconds[d] / 1e9 : 0.0; };
  nlohmann::json r = {
      {"label", label},
      {"conversations", c.conversations},
      {"turns", c.turns},
      {"user_tokens", c.user_tokens},
      {"output_tokens_per_turn", c.output_tokens},
      {"concurrency", c.concurrency},
      {"working_set_tokens", c.working_set_tokens()},
      {"requests", static_cast<int64_t>(ttft_ms.size())},
      {"failed", failed},
      {"timed_out", timed_out},
      {"wall_s", wall},
      {"output_tokens", output_tokens},
      {"output_tok_per_s", output_tokens / wall},
      {"prompt_tokens", prompt_tokens},
      {"cached_prompt_tokens", cached_tokens},
      {"computed_prompt_tokens", prompt_tokens - cached_tokens},
      {"ttft_ms_mean", mean_ttft},
      {"ttft_ms_p50", percentile(ttft_ms, 50)},
      {"ttft_ms_p90", percentile(ttft_ms, 90)},
      {"ttft_ms_p99", percentile(ttft_ms, 99)},
      {"hit_tokens_device", s.kv.hit_tokens_by_tier[0]},
      {"hit_tokens_host", s.kv.hit_tokens_by_tier[1]},
      {"blocks_demoted", s.kv.blocks_demoted},
      {"blocks_written_back", s.kv.blocks_written_back},
      {"blocks_promoted", s.kv.blocks_promoted},
      {"host_blocks_evicted", s.kv.host_blocks_evicted},
      {"transfer_gb_device_to_host", s.transfers.bytes[d2h] / 1e9},
      {"transfer_gb_host_to_device", s.transfers.bytes[h2d] / 1e9},
      {"transfer_s_device_to_host", s.transfers.seconds[d2h]},
      {"transfer_s_host_to_device", s.transfers.seconds[h2d]},
      {"transfer_gbps_device_to_host", gbps(d2h)},
      {"transfer_gbps_host_to_device", gbps(h2d)},
      {"preemptions", s.preemptions},
      {"swap_preemptions", s.swap_preemptions},
      {"engine_steps", s.steps}};
  nlohmann::json by_turn = nlohmann::json::array(), by_turn_p90 = nlohmann::json::array();
  std::string by_turn_text, by_turn_p90_text;
  for (const auto& t : ttft_by_turn) {
    by_turn.push_back(percentile(t, 50));
    by_turn_p90.push_back(percentile(t, 90));
    by_turn_text += (by_turn_text.empty() ? "" : " / ") + std::to_string(static_cast<int>(percentile(t, 50)));
    by_turn_p90_text +=
        (by_turn_p90_text.empty() ? "" : " / ") + std::to_string(static_cast<int>(percentile(t, 90)));
  }
  if (timelines != nullptr) {
    const std::vector<engine::RequestTimeline> all = timelines->take();
    r["timeline_all"] = summarise_timelines(all, "all", [](const engine::RequestTimeline&) { return true; });
    r["timeline_host_hits"] =
        summarise_timelines(all, "host hits", [](const engine::RequestTimeline& t) { return t.host_hit_tokens > 0; });
    r["timeline_others"] =
        summarise_timelines(all, "others", [](const engine::RequestTimeline& t) { return t.host_hit_tokens == 0; });
    // Every request's, one row each (ms after submit; -1: did not happen).
    nlohmann::json rows = nlohmann::json::array();
    for (const engine::RequestTimeline& t : all)
      rows.push_back({t.request_id, t.prompt_tokens, t.cached_tokens, t.host_hit_tokens, t.admitted_s * 1e3,
                      t.load_enqueued_s * 1e3, t.load_done_s * 1e3, t.first_step_start_s * 1e3,
                      t.first_step_end_s * 1e3, t.first_token_s * 1e3, t.admission_h2d_blocks,
                      t.admission_d2h_blocks, t.admitted_with, t.first_step_sequences, t.first_step_tokens,
                      t.steps_before_first_token});
    r["timeline_columns"] = {"request", "prompt", "cached", "host_hit", "admitted_ms", "load_enqueued_ms",
                             "load_done_ms", "first_step_start_ms", "first_step_end_ms", "first_token_ms",
                             "h2d_blocks", "d2h_blocks", "admitted_with", "step_seqs", "step_tokens", "steps"};
    r["timelines"] = std::move(rows);
  }
  r["ttft_ms_p50_by_turn"] = by_turn;
  r["ttft_ms_p90_by_turn"] = by_turn_p90;
  std::printf("%s: TTFT p50 by turn (ms): %s; p90 by turn: %s\n", label.c_str(), by_turn_text.c_str(),
              by_turn_p90_text.c_str());
  std::printf("%s: %lld requests in %.1f s%s: %.1f output tok/s; TTFT mean %.1f ms p50 %.1f p90 %.1f p99 %.1f; "
              "prompt tokens %lld, cached %lld (device %lld, host %lld); demoted %lld (copied %lld), promoted "
              "%lld; moved %.2f GB to host in %.3f s, %.2f GB to device in %.3f s; %lld preemptions (%lld by swap)\n",
              label.c_str(), static_cast<long long>(ttft_ms.size()), wall, timed_out ? " (TIME LIMIT)" : "",
              output_tokens / wall, mean_ttft, percentile(ttft_ms, 50), percentile(ttft_ms, 90),
              percentile(ttft_ms, 99), static_cast<long long>(prompt_tokens), static_cast<long long>(cached_tokens),
              static_cast<long long>(s.kv.hit_tokens_by_tier[0]), static_cast<long long>(s.kv.hit_tokens_by_tier[1]),
              static_cast<long long>(s.kv.blocks_demoted), static_cast<long long>(s.kv.blocks_written_back),
              static_cast<long long>(s.kv.blocks_promoted), s.transfers.bytes[d2h] / 1e9, s.transfers.seconds[d2h],
              s.transfers.bytes[h2d] / 1e9, s.transfers.seconds[h2d], static_cast<long long>(s.preemptions),
              static_cast<long long>(s.swap_preemptions));
  std::fflush(stdout);
  return r;
}

// Preemption under memory pressure: `requests` requests of `input_tokens`
// random tokens and `output_tokens` replies, all submitted at once, into a
// pool that cannot hold them all: throughput and preemptions.
inline nlohmann::json run_pressure(engine::Engine& eng, int32_t requests, int32_t input_tokens, int32_t output_tokens,
                                   int32_t vocab_size, const std::string& label, double max_seconds = 600,
                                   const runtime::TransferStats& base = {}) {
  using Clock = std::chrono::steady_clock;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(3, vocab_size - 1);
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  const auto t0 = Clock::now();
  for (int32_t i = 0; i < requests; ++i) {
    engine::GenerationRequest request;
    for (int32_t k = 0; k < input_tokens; ++k) request.prompt_tokens.push_back(token(rng));
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = output_tokens;
    request.sampling.ignore_eos = true;
    auto s = eng.submit(std::move(request));
    if (s.ok()) streams.push_back(*s);
  }
  std::vector<double> ttft_ms(streams.size(), -1);
  std::vector<bool> done(streams.size(), false);
  size_t finished = 0;
  int64_t tokens = 0, failed = 0;
  bool timed_out = false;
  while (finished < streams.size()) {
    if (std::chrono::duration<double>(Clock::now() - t0).count() > max_seconds) {
      timed_out = true;
      break;
    }
    bool any = false;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (done[i]) continue;
      while (auto out = streams[i]->next(std::chrono::milliseconds(0))) {
        any = true;
        for (const auto& ch : out->choices) {
          if (!ch.tokens.empty() && ttft_ms[i] < 0)
            ttft_ms[i] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          tokens += static_cast<int64_t>(ch.tokens.size());
        }
        if (out->finished) {
          done[i] = true;
          ++finished;
          failed += out->error.empty() ? 0 : 1;
          break;
        }
      }
    }
    if (!any) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  engine::EngineStats s = eng.stats();
  s.transfers = transfers_since(s.transfers, base);
  std::vector<double> got;
  for (double t : ttft_ms)
    if (t >= 0) got.push_back(t);
  nlohmann::json r = {{"label", label},
                      {"requests", requests},
                      {"input_tokens", input_tokens},
                      {"output_tokens_per_request", output_tokens},
                      {"finished", finished},
                      {"failed", failed},
                      {"timed_out", timed_out},
                      {"wall_s", wall},
                      {"output_tokens", tokens},
                      {"output_tok_per_s", tokens / wall},
                      {"ttft_ms_p50", percentile(got, 50)},
                      {"preemptions", s.preemptions},
                      {"swap_preemptions", s.swap_preemptions},
                      {"swap_ins", s.kv.swap_ins},
                      {"transfer_gb_device_to_host", s.transfers.bytes[0] / 1e9},
                      {"transfer_gb_host_to_device", s.transfers.bytes[1] / 1e9},
                      {"prompt_tokens_computed", s.kv.miss_tokens},
                      {"engine_steps", s.steps}};
  std::printf("%s: %zu/%d requests in %.1f s%s: %.1f output tok/s; TTFT p50 %.0f ms; %lld preemptions (%lld by "
              "swap, %lld swapped back in); %.2f GB to host, %.2f GB back\n",
              label.c_str(), finished, requests, wall, timed_out ? " (TIME LIMIT)" : "", tokens / wall,
              percentile(got, 50), static_cast<long long>(s.preemptions), static_cast<long long>(s.swap_preemptions),
              static_cast<long long>(s.kv.swap_ins), s.transfers.bytes[0] / 1e9, s.transfers.bytes[1] / 1e9);
  std::fflush(stdout);
  return r;
}

}  // namespace pagoda::bench
