// Host cost of planning one CUDA decode step's attention (PagedAttentionPlan::create in graph mode), the
// work the CUDA runner does on the CPU before each decode graph replay, with the block tables embedded in
// the arena and with the runner's device tables (graph_block_tables). Runs on any machine (no GPU).
//
//   attention_plan_host_bench [--sequences 512] [--context 1400] [--block-size 16] [--stride 512] [--iters 200]
//                             [--kv fp8|bf16]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "pagoda/backend/cuda/attention/attention_plan.h"

namespace kc = pagoda::kernels::cuda;

int main(int argc, char** argv) {
  int sequences = 512, context = 1400, block_size = 16, stride = 512, iters = 200;
  bool fp8 = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--sequences")) sequences = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--context")) context = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--block-size")) block_size = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stride")) stride = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kv")) fp8 = !std::strcmp(argv[i + 1], "fp8");
  }
  const int blocks_per_seq = (context + 200 + block_size) / block_size + 1;
  kc::AttentionConfig config;
  config.num_q_heads = 32;
  config.num_kv_heads = 8;
  config.head_dim = 128;
  config.block_size = block_size;
  config.num_blocks = sequences * blocks_per_seq;
  config.key_element = config.value_element = fp8 ? kc::KvElement::kFP8E4M3 : kc::KvElement::kBF16;
  std::vector<int32_t> ids(static_cast<size_t>(config.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
  std::mt19937 rng(2);
  std::vector<kc::AttentionSequence> seqs;
  for (int s = 0; s < sequences; ++s) {
    const int cached = context - 200 + static_cast<int>(rng() % 400);
    seqs.push_back({1, cached, std::span<const int32_t>(ids.data() + size_t(s) * blocks_per_seq, blocks_per_seq)});
  }
  // Embedded tables (the arena carries graph_sequences x stride entries) and the
  // runner's device tables (graph_block_tables: the arena stops before them).
  const auto* device_tables = reinterpret_cast<const int32_t*>(uintptr_t{0x10000000});
  for (const bool external : {false, true}) {
    kc::AttentionPlanOptions options;
    options.graph_sequences = sequences;
    options.graph_block_table_stride = stride;
    if (external) options.graph_block_tables = device_tables;
    std::vector<double> us;
    size_t arena = 0;
    for (int it = 0; it < iters + 10; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      auto plan = kc::PagedAttentionPlan::create(config, seqs, kc::AttentionDeviceInfo{132}, options);
      const auto t1 = std::chrono::steady_clock::now();
      if (!plan.ok()) {
        std::fprintf(stderr, "plan: %s\n", std::string(plan.status().message()).c_str());
        return 1;
      }
      arena = plan->arena_bytes();
      if (it >= 10) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::printf("attention plan (graph mode, %s tables), %d sequences x ~%d tokens, blocks of %d, stride %d, %s KV: "
                "median %.1f us, p10 %.1f, p90 %.1f; arena %zu bytes\n",
                external ? "device" : "embedded", sequences, context, block_size, stride, fp8 ? "fp8" : "bf16",
                us[us.size() / 2], us[us.size() / 10], us[us.size() * 9 / 10], arena);
  }
  return 0;
}
