// CPU reference model speed on the bundled model (models/pagoda-tiny, or the
// directory in PAGODA_BENCH_MODEL): one-token decode steps at a given context
// length, and prefill of a prompt, both through the paged pool (block size 16).
//
//   build-*/bench/model/model_bench --benchmark_counters_tabular=true

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>

#include "pagoda/backend/cpu/cpu_model.h"

namespace pagoda {
namespace {

constexpr int32_t kBlockSize = 16;

CpuModel* bundled_model() {
  static std::unique_ptr<CpuModel> model = [] {
    const char* env = std::getenv("PAGODA_BENCH_MODEL");
    const std::string dir = env ? env : std::string(PAGODA_SOURCE_DIR) + "/models/pagoda-tiny";
    auto loaded = CpuModel::load(dir);
    return loaded.ok() ? std::move(*loaded) : nullptr;
  }();
  return model.get();
}

ForwardBatch one_sequence(int32_t cached, int32_t fresh, int32_t blocks) {
  ForwardBatch batch;
  for (int32_t i = 0; i < fresh; ++i) {
    batch.token_ids.push_back((cached + i) * 7 % 50 + 3);
    batch.positions.push_back(cached + i);
  }
  SequenceSlice s;
  s.num_cached_tokens = cached;
  s.num_new_tokens = fresh;
  for (int32_t b = 0; b < blocks; ++b) s.block_table.push_back(b);
  batch.sequences = {s};
  return batch;
}

// state.range(0): tokens already in the cache.
void BM_Decode(benchmark::State& state) {
  CpuModel* model = bundled_model();
  if (model == nullptr) return state.SkipWithError("bundled model not found");
  const int32_t context = static_cast<int32_t>(state.range(0));
  const int32_t blocks = (context + 1 + kBlockSize - 1) / kBlockSize;
  auto pool = CpuKvPool::create(model->kv_pool_shape(blocks, kBlockSize));
  std::vector<float> logits;
  if (!model->forward(one_sequence(0, context, blocks), *pool, logits).ok()) return state.SkipWithError("prefill");
  const ForwardBatch step = one_sequence(context, 1, blocks);
  for (auto _ : state) {
    if (!model->forward(step, *pool, logits).ok()) return state.SkipWithError("decode failed");
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Decode)->Arg(16)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

// state.range(0): prompt length.
void BM_Prefill(benchmark::State& state) {
  CpuModel* model = bundled_model();
  if (model == nullptr) return state.SkipWithError("bundled model not found");
  const int32_t prompt = static_cast<int32_t>(state.range(0));
  const int32_t blocks = (prompt + kBlockSize - 1) / kBlockSize;
  auto pool = CpuKvPool::create(model->kv_pool_shape(blocks, kBlockSize));
  const ForwardBatch batch = one_sequence(0, prompt, blocks);
  std::vector<float> logits;
  for (auto _ : state) {
    if (!model->forward(batch, *pool, logits).ok()) return state.SkipWithError("prefill failed");
  }
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * prompt, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Prefill)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace pagoda

BENCHMARK_MAIN();
