// pagoda_graph_attention_bench: decode step time of the whole model with CUDA
// graphs, attention by the backend's own kernel (paged_attention.cu) vs
// backend/cuda/attention's split-K decode in graph mode (fast_attention.h), on the same
// model and pool, in one process.
//
// Static batches: B sequences of `context` cached tokens decode together; every
// step advances each by one token (so the graph replays with new lengths and
// block tables). The cache holds random bf16 (no prefill is run: decode time
// does not depend on the values). Step time = host wall time of
// forward_greedy (plan + copies + graph replay + argmax + sync), median of
// the timed steps after warm-up; the first step of each (batch, attention)
// captures its graph and is not timed.
//
//   pagoda_graph_attention_bench --config tools/gpu_backend/llama3_8b_config.json [--json out.json]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/random_fill.h"

namespace {

using Clock = std::chrono::steady_clock;
using pagoda::ForwardBatch;
using pagoda::SequenceSlice;
using pagoda::cuda::CudaKvPool;
using pagoda::cuda::CudaModel;
using pagoda::cuda::CudaModelOptions;

[[noreturn]] void die(const pagoda::Status& s, const char* what) {
  std::fprintf(stderr, "error: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, json_out;
  int warmup = 5, steps = 30, block_size = 16;
  CLI::App app{"decode step time with CUDA graphs: builtin vs backend/cuda/attention attention"};
  app.add_option("--config", config_path, "config.json (random bf16 weights)")->required();
  app.add_option("--steps", steps, "timed steps per case")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps after the capture");
  app.add_option("--json", json_out, "write the figures here");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  std::ifstream in(config_path);
  if (!in) {
    std::fprintf(stderr, "error: cannot read %s\n", config_path.c_str());
    return 2;
  }
  auto config = pagoda::parse_model_config(nlohmann::json::parse(in, nullptr, false), config_path);
  if (!config.ok()) die(config.status(), "config");

  struct Case {
    int32_t batch, context;
  };
  const std::vector<Case> cases = {{1, 1024}, {1, 4096}, {64, 1024}, {64, 4096}, {256, 1024}};
  const int32_t max_len = 4096 + warmup + steps + 2;
  CudaModelOptions options;
  options.max_num_seqs = 256;
  options.max_num_tokens = 256;
  options.max_model_len = max_len;
  options.block_size = block_size;
  auto model = CudaModel::create_random(*config, 1, options);
  if (!model.ok()) die(model.status(), "model");
  CudaModel& m = **model;

  // Blocks each sequence of a case needs: context + every step's token.
  auto table_length = [&](const Case& c) { return (c.context + 1 + warmup + steps + block_size) / block_size; };
  int64_t blocks_needed = 0;
  for (const Case& c : cases) blocks_needed = std::max<int64_t>(blocks_needed, int64_t{c.batch} * table_length(c));
  auto pool = CudaKvPool::create(m.kv_pool_shape(static_cast<int32_t>(blocks_needed)));
  if (!pool.ok()) die(pool.status(), "KV pool");
  const size_t layer_elems = static_cast<size_t>(blocks_needed) * block_size * config->num_kv_heads * config->head_dim;
  for (int32_t l = 0; l < config->num_layers; ++l) {
    const auto layer = (*pool)->layer(l);
    if (pagoda::cuda::fill_random_bf16(layer.key, layer_elems, -1.0f, 1.0f, 2 * l + 1, nullptr) !=
            cudaSuccess ||
        pagoda::cuda::fill_random_bf16(layer.value, layer_elems, -1.0f, 1.0f, 2 * l + 2, nullptr) !=
            cudaSuccess) {
      std::fprintf(stderr, "error: filling the KV pool\n");
      return 1;
    }
  }
  cudaDeviceSynchronize();
  std::printf("model: %d layers, hidden %d, heads %d/%d, head_dim %d; %.2f GB weights; KV pool %d blocks (%.1f GB)\n",
              config->num_layers, config->hidden_size, config->num_q_heads, config->num_kv_heads, config->head_dim,
              m.weight_bytes() / 1e9, static_cast<int>(blocks_needed), (*pool)->total_bytes() / 1e9);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, config->vocab_size - 1);
  nlohmann::json out = nlohmann::json::array();
  const double kv_bytes_per_token = 2.0 * config->num_layers * config->num_kv_heads * config->head_dim * 2;
  for (const Case& c : cases) {
    const int32_t table_len = table_length(c);
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(c.batch));
    for (int32_t s = 0; s < c.batch; ++s)
      for (int32_t b = 0; b < table_len; ++b) tables[static_cast<size_t>(s)].push_back(s * table_len + b);
    double ms_by_variant[2] = {0, 0};
    for (int variant = 0; variant < 2; ++variant) {
      const bool fast = variant == 1;
      m.set_fast_attention(fast);
      const int64_t fast_before = m.fast_attention_steps(), replays_before = m.graph_replays();
      std::vector<double> ms;
      std::vector<int32_t> tokens;
      for (int32_t step = 0; step < 1 + warmup + steps; ++step) {
        ForwardBatch batch;
        for (int32_t s = 0; s < c.batch; ++s) {
          SequenceSlice slice;
          slice.token_offset = s;
          slice.num_new_tokens = 1;
          slice.num_cached_tokens = c.context + step;
          slice.block_table = tables[static_cast<size_t>(s)];
          batch.sequences.push_back(std::move(slice));
          batch.token_ids.push_back(token(rng));
          batch.positions.push_back(c.context + step);
        }
        const auto t0 = Clock::now();
        const pagoda::Status status = m.forward_greedy(batch, **pool, tokens);
        if (!status.ok()) die(status, "decode step");
        if (step > warmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      const double p50 = median(ms);
      ms_by_variant[variant] = p50;
      const bool used_fast = m.fast_attention_steps() - fast_before == 1 + warmup + steps;
      const int64_t replays = m.graph_replays() - replays_before;
      const double kv_gb = kv_bytes_per_token * c.batch * (c.context + warmup + steps / 2) / 1e9;
      std::printf("batch %3d context %5d  %-8s attention in graphs: %8.3f ms/step  %8.0f tok/s  (KV %.2f GB/step, "
                  "%lld replays%s)\n", c.batch, c.context, fast ? "fast" : "builtin", p50, c.batch / (p50 / 1e3),
                  kv_gb, static_cast<long long>(replays), fast && !used_fast ? ", FAST NOT USED" : "");
      out.push_back({{"batch", c.batch}, {"context", c.context}, {"attention", fast ? "fast" : "builtin"},
                     {"ms_per_step_p50", p50}, {"tok_per_s", c.batch / (p50 / 1e3)}, {"kv_gb_per_step", kv_gb},
                     {"graph_replays", replays}, {"fast_attention_used", fast && used_fast}});
    }
    std::printf("batch %3d context %5d  speed-up fast / builtin: %.2fx\n", c.batch, c.context,
                ms_by_variant[0] / ms_by_variant[1]);
  }
  if (!json_out.empty()) std::ofstream(json_out) << out.dump(2) << "\n";
  return 0;
}
