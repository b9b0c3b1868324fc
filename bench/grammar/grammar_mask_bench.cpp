// How long one token mask takes on a real vocabulary, the way the engine asks for it: for each
// token of JSON documents that a model would write (schema-valid documents tokenized with the
// tokenizer), time TokenMatcher::fill_mask, then accept the token.
//
// Four regimes, each over the same token sequences:
//   lazy    a fresh CompiledGrammar without precompute(): every window is computed on first use;
//   cold    a fresh CompiledGrammar after precompute(), as the server compiles it: the first
//           request with a new schema (every state is new; its mask is composed from windows),
//           or with json_object the first request after the server started (compiled then, with
//           the startup budget);
//   warm    the same CompiledGrammar, a new matcher: later requests with that schema (the server
//           keeps compiled grammars by schema text);
//   steady  per token within one document once its states recur (the second copy of each
//           document in one request).
// Prints p50 / p99 / max in microseconds per regime, the trie size and the vocabulary build time.
// With runs > 1 every regime is measured that many times (a fresh grammar each) and each figure
// is the median over the runs, which keeps a shared machine's preemptions out of the table (a
// single run's p99 of ~100 masks is its second-worst mask); "best run per mask" takes each
// mask's fastest run before the percentile (the masks' own cost, without preemptions).
//
// With slowest > 0, each run lists its slowest cold masks with what they did (stacks composed,
// windows computed, uncertain tokens checked, transitions computed, trie nodes walked).
//
//   pagoda_bench_grammar_mask [tokenizer_dir] [runs] [slowest] [wall|cpu]
//       ("" or nothing: .cache/npm/qwen3/package/models; 1; 0; wall)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/grammar/json_schema_to_grammar.h"
#include "pagoda/grammar/regex_to_grammar.h"
#include "pagoda/grammar/token_matcher.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

// Mask times: wall clock, or with "cpu" this thread's CPU time (a syscall each, ~0.3 us more per
// mask, but time the scheduler gives to other processes is not counted: for a loaded machine).
bool g_cpu_clock = false;
double now_us() {
  if (g_cpu_clock) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
  }
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}
using pagoda::grammar::CompiledGrammar;
using pagoda::grammar::TokenMatcher;

struct Case {
  const char* name;
  const char* schema;  // "" = json_object; "regex:PATTERN" = a guided_regex
  std::vector<const char*> documents;
};

const std::vector<Case> kCases = {
    {"person",
     R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"email":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age"]})",
     {R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "poetry", "engines"]})",
      R"({"name": "Alan Mathison Turing, who described the universal machine", "age": 41, "tags": []})",
      R"({"name": "Grace Hopper", "age": 85, "email": "grace.hopper@navy.example.mil"})"}},
    {"tool_call",
     R"({"type":"object","properties":{"name":{"enum":["get_weather","search_web"]},"arguments":{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},"required":["city"]}},"required":["name","arguments"]})",
     {R"({"name": "get_weather", "arguments": {"city": "San Francisco, California", "unit": "celsius", "days": 3}})",
      R"({"name": "search_web", "arguments": {"city": "Paris"}})"}},
    {"json_object",
     "",
     {R"({"summary": "The quick brown fox jumps over the lazy dog.", "scores": [0.91, 0.07, 0.02], "meta": {"model": "pagoda", "ok": true, "notes": null}})",
      "{\n  \"items\": [\n    {\"id\": 1, \"text\": \"first line\\nsecond line\"},\n    {\"id\": 2, \"text\": \"caf\u00e9 \u4e2d\u6587\"}\n  ]\n}"}},
    // The grammar of docs/API.md's throughput measurement: a loop that never has to end.
    {"regex_loop",
     "regex:[a-z ,.]*",
     {"it is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
      "want of a wife. however little known the feelings or views of such a man may be on his first entering a "
      "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered "
      "the rightful property of some one or other of their daughters."}},
};


double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

// Per-run samples of one regime; reported as the median over runs of each run's percentiles.
struct Regime {
  std::vector<std::vector<double>> runs;
  std::vector<double>& next() { return runs.emplace_back(); }
  void add(const Regime& other) {
    runs.resize(std::max(runs.size(), other.runs.size()));
    for (size_t r = 0; r < other.runs.size(); ++r) runs[r].insert(runs[r].end(), other.runs[r].begin(), other.runs[r].end());
  }
};

double median_over_runs(const Regime& regime, double p) {
  std::vector<double> per_run;
  for (const auto& run : regime.runs) per_run.push_back(percentile(run, p));
  return percentile(per_run, 0.5);
}

// Each mask's fastest run (the runs repeat the same masks in the same order): what the masks cost
// without the preemptions of a shared machine.
std::vector<double> best_of_runs(const Regime& regime) {
  std::vector<double> best = regime.runs.empty() ? std::vector<double>{} : regime.runs[0];
  for (const auto& run : regime.runs)
    for (size_t i = 0; i < std::min(best.size(), run.size()); ++i) best[i] = std::min(best[i], run[i]);
  return best;
}

void report(const char* label, const Regime& regime) {
  const size_t masks = regime.runs.empty() ? 0 : regime.runs[0].size();
  const std::vector<double> best = best_of_runs(regime);
  std::printf("  %-7s %5zu masks x %zu runs  p50 %8.1f us  p99 %8.1f us  max %8.1f us  | best run per mask: p99 %6.1f max %6.1f\n",
              label, masks, regime.runs.size(), median_over_runs(regime, 0.5), median_over_runs(regime, 0.99),
              median_over_runs(regime, 1.0), percentile(best, 0.99), percentile(best, 1.0));
}

// What one mask did (the grammar's counters around it), for the slowest-masks listing.
struct MaskDetail {
  double us = 0;
  size_t doc = 0, pos = 0;
  pagoda::grammar::MaskStats delta;
};

pagoda::grammar::MaskStats minus(const pagoda::grammar::MaskStats& a, const pagoda::grammar::MaskStats& b) {
  pagoda::grammar::MaskStats d;
  d.hits = a.hits - b.hits;
  d.misses = a.misses - b.misses;
  d.whole_walks = a.whole_walks - b.whole_walks;
  d.trie_nodes_visited = a.trie_nodes_visited - b.trie_nodes_visited;
  d.states = a.states - b.states;
  d.transitions_computed = a.transitions_computed - b.transitions_computed;
  d.windows = a.windows - b.windows;
  d.uncertain_checked = a.uncertain_checked - b.uncertain_checked;
  d.stacks_composed = a.stacks_composed - b.stacks_composed;
  return d;
}

// Runs every document once with a fresh matcher; appends per-token mask times (us). With
// `details`, also what each first-pass mask did.
bool run_documents(const std::shared_ptr<CompiledGrammar>& compiled, const std::vector<std::vector<int32_t>>& docs,
                   std::vector<double>& first_pass, std::vector<double>* second_pass,
                   std::vector<MaskDetail>* details = nullptr) {
  std::vector<uint64_t> mask(compiled->vocabulary().mask_words());
  for (size_t doc = 0; doc < docs.size(); ++doc) {
    const auto& ids = docs[doc];
    for (int copy = 0; copy < (second_pass ? 2 : 1); ++copy) {
      TokenMatcher matcher(compiled);
      for (size_t pos = 0; pos < ids.size(); ++pos) {
        const int32_t id = ids[pos];
        const bool detail = details != nullptr && copy == 0;
        const pagoda::grammar::MaskStats before = detail ? compiled->stats() : pagoda::grammar::MaskStats{};
        const double start = now_us();
        matcher.fill_mask(mask);
        const double us = now_us() - start;
        (copy == 0 ? first_pass : *second_pass).push_back(us);
        if (detail) details->push_back({us, doc, pos, minus(compiled->stats(), before)});
        if (!((mask[id >> 6] >> (id & 63)) & 1) || !matcher.accept(id)) {
          std::fprintf(stderr, "token %d is not allowed by the grammar\n", id);
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 && argv[1][0] != 0 ? argv[1] : std::string(PAGODA_SOURCE_DIR) + "/.cache/npm/qwen3/package/models";
  const int runs = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  const size_t slowest = argc > 3 ? static_cast<size_t>(std::max(0, std::atoi(argv[3]))) : 0;
  g_cpu_clock = argc > 4 && std::string(argv[4]) == "cpu";
  auto tok = pagoda::tokenizer::Tokenizer::load(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  auto start = Clock::now();
  auto vocab = pagoda::grammar::TokenVocabulary::from_tokenizer(**tok);
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("vocabulary %d ids, trie %zu nodes, depth %u, built in %.1f ms\n", vocab->size(), vocab->num_nodes(),
              vocab->max_depth(), build_ms);
  Regime all_cold, all_lazy, all_warm, all_steady;
  for (const Case& c : kCases) {
    std::shared_ptr<const pagoda::grammar::Grammar> grammar;
    const std::string schema = c.schema;
    if (schema.empty()) {
      grammar = pagoda::grammar::json_object_grammar();
    } else if (schema.starts_with("regex:")) {
      auto g = pagoda::grammar::regex_to_grammar(schema.substr(6));
      if (!g.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name, g.status().to_string().c_str());
        return 1;
      }
      grammar = *g;
    } else {
      auto g = pagoda::grammar::json_schema_to_grammar(nlohmann::ordered_json::parse(c.schema), "schema");
      if (!g.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name, g.status().to_string().c_str());
        return 1;
      }
      grammar = *g;
    }
    std::vector<std::vector<int32_t>> docs;
    for (const char* d : c.documents) docs.push_back((*tok)->encode(d, false));
    Regime cold, lazy, warm, steady;
    for (int run = 0; run < runs; ++run) {
      // cold: a fresh grammar after precompute() (what the server does when it compiles one);
      // lazy: a fresh grammar without it (every window computed on first use).
      std::vector<double> unused_steady;
      if (!run_documents(std::make_shared<CompiledGrammar>(grammar, vocab), docs, lazy.next(), &unused_steady))
        return 1;
      auto compiled = std::make_shared<CompiledGrammar>(grammar, vocab);
      // The server's budgets: json_object is compiled at start, other grammars on a request.
      const pagoda::grammar::PrecomputeBudget budget =
          schema.empty() ? pagoda::grammar::kStartupPrecompute : pagoda::grammar::kRequestPrecompute;
      const auto pre = compiled->precompute(budget.states, budget.seconds);
      std::vector<MaskDetail> details;
      if (!run_documents(compiled, docs, cold.next(), &steady.next(), &details)) return 1;
      if (slowest > 0) {
        std::sort(details.begin(), details.end(), [](const MaskDetail& a, const MaskDetail& b) { return a.us > b.us; });
        std::printf("%s run %d: slowest cold masks (us: doc/token, stacks, windows computed, uncertain checked, "
                    "transitions computed, trie nodes)\n", c.name, run);
        for (size_t i = 0; i < std::min<size_t>(slowest, details.size()); ++i) {
          const MaskDetail& d = details[i];
          std::printf("    %7.1f us  %zu/%-3zu %3llu stacks %2llu windows %5llu uncertain %4llu transitions %7llu nodes%s\n",
                      d.us, d.doc, d.pos, static_cast<unsigned long long>(d.delta.stacks_composed),
                      static_cast<unsigned long long>(d.delta.windows),
                      static_cast<unsigned long long>(d.delta.uncertain_checked),
                      static_cast<unsigned long long>(d.delta.transitions_computed),
                      static_cast<unsigned long long>(d.delta.trie_nodes_visited), d.delta.hits ? "  (hit)" : "");
        }
      }
      std::vector<double>& warm_run = warm.next();
      for (int rep = 0; rep < 5; ++rep)
        if (!run_documents(compiled, docs, warm_run, nullptr)) return 1;
      if (run > 0) continue;
      std::printf("%s: precompute %.1f ms, %llu states, %llu stacks with count siblings, %llu windows%s\n", c.name, pre.seconds * 1e3,
                  static_cast<unsigned long long>(pre.states), static_cast<unsigned long long>(pre.count_siblings), static_cast<unsigned long long>(pre.windows),
                  pre.complete ? " (every reachable state)" : "");
      const auto stats = compiled->stats();
      std::printf("%s: %zu tokens, %llu misses (%llu whole-trie walks), %llu states, %llu transitions, %llu windows, "
                  "%llu uncertain tokens checked, windows hold %.1f MB\n",
                  c.name, cold.runs[0].size(), static_cast<unsigned long long>(stats.misses),
                  static_cast<unsigned long long>(stats.whole_walks), static_cast<unsigned long long>(stats.states),
                  static_cast<unsigned long long>(stats.transitions_computed),
                  static_cast<unsigned long long>(stats.windows),
                  static_cast<unsigned long long>(stats.uncertain_checked),
                  static_cast<double>(stats.window_bytes) / 1e6);
    }
    report("lazy", lazy);
    report("cold", cold);
    report("steady", steady);
    report("warm", warm);
    all_cold.add(cold);
    all_lazy.add(lazy);
    all_warm.add(warm);
    all_steady.add(steady);
  }
  std::printf("all cases:\n");
  report("lazy", all_lazy);
  report("cold", all_cold);
  report("steady", all_steady);
  report("warm", all_warm);
  return 0;
}
