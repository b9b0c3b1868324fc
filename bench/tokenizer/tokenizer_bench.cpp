// Tokenizer speed on one thread, the figures of docs/BENCHMARKS.md "## Tokenizer":
//   - encode of one ~4 MiB English+Chinese string (the fixture corpus joined with "\n" and
//     repeated, the same recipe as tools/make_tokenizer_fixtures.py uses for HF tokenizers), with
//     and without the BPE word cache;
//   - loading tokenizer.json (+ config) from disk;
//   - streaming detokenization, per token.
// Needs scripts/fetch-test-data.sh. Run: build-*/bench/tokenizer/pagoda_bench_tokenizer

#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "pagoda/tokenizer/tokenizer.h"

namespace {

using pagoda::tokenizer::IncrementalDetokenizer;
using pagoda::tokenizer::Tokenizer;

std::filesystem::path model_dir(const std::string& name) {
  return std::filesystem::path(PAGODA_SOURCE_DIR) / ".cache/npm" / name / "package/models";
}

const std::string& bench_text() {
  static const std::string text = [] {
    std::ifstream in(std::filesystem::path(PAGODA_SOURCE_DIR) / "tests/fixtures/tokenizer/corpus.jsonl");
    std::string unit, line;
    bool first = true;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (!first) unit += "\n";
      unit += nlohmann::json::parse(line)["text"].get<std::string>();
      first = false;
    }
    unit += "\n";
    // Same as the fixture script: repeat until at least 4 MiB. (Python counts the length of
    // the UTF-8 encoding, as here.)
    constexpr size_t kMinBytes = 4 * 1024 * 1024;
    const size_t repeats = (kMinBytes + unit.size() - 1) / unit.size();
    std::string text;
    text.reserve(repeats * unit.size());
    for (size_t i = 0; i < repeats; ++i) text += unit;
    return text;
  }();
  return text;
}

std::shared_ptr<const Tokenizer> load_or_skip(benchmark::State& state, const std::string& name) {
  auto tok = Tokenizer::load(model_dir(name));
  if (!tok.ok()) {
    state.SkipWithError((tok.status().to_string() + " (run scripts/fetch-test-data.sh)").c_str());
    return nullptr;
  }
  return *tok;
}

void BM_Encode4MiB(benchmark::State& state, const std::string& name) {
  auto tok = load_or_skip(state, name);
  if (!tok) return;
  const std::string& text = bench_text();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["MB_per_s"] = benchmark::Counter(static_cast<double>(text.size()) / 1e6,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// The same text with every line made unique, so the word cache cannot help (worst case).
void BM_Encode4MiBUniqueWords(benchmark::State& state, const std::string& name) {
  auto tok = load_or_skip(state, name);
  if (!tok) return;
  const std::string& base = bench_text();
  std::string text;
  text.reserve(base.size() + base.size() / 8);
  size_t line = 0;
  for (char c : base) {
    text.push_back(c);
    if (c == '\n') text += "w" + std::to_string(line++ * 7919) + "x ";
  }
  for (auto _ : state) {
    // A fresh tokenizer each time: its cache starts empty.
    state.PauseTiming();
    auto fresh = Tokenizer::load(model_dir(name));
    state.ResumeTiming();
    auto ids = (*fresh)->encode(text, false);
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["MB_per_s"] = benchmark::Counter(static_cast<double>(text.size()) / 1e6,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Load(benchmark::State& state, const std::string& name) {
  for (auto _ : state) {
    auto tok = Tokenizer::load(model_dir(name));
    if (!tok.ok()) {
      state.SkipWithError(tok.status().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(tok->get());
  }
}

void BM_StreamDetokenize(benchmark::State& state, const std::string& name) {
  auto tok = load_or_skip(state, name);
  if (!tok) return;
  const auto ids = tok->encode(bench_text().substr(0, 64 * 1024), false);
  for (auto _ : state) {
    IncrementalDetokenizer stream(*tok);
    size_t bytes = 0;
    for (auto id : ids) bytes += stream.feed(id).size();
    bytes += stream.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}

}  // namespace

BENCHMARK_CAPTURE(BM_Encode4MiB, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_CAPTURE(BM_Encode4MiB, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_CAPTURE(BM_Encode4MiB, llama2, std::string("llama2"))->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_CAPTURE(BM_Encode4MiBUniqueWords, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_Encode4MiBUniqueWords, llama2, std::string("llama2"))->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_Load, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(BM_Load, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(BM_Load, llama2, std::string("llama2"))->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(BM_StreamDetokenize, qwen3, std::string("qwen3"))->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
