// CPU paged attention of one Llama-shaped model step (issue 27): every layer's
// attention for a batch of one sequence, at a given context length and KV
// dtype, each layer over its own pool so a step reads the whole cache from
// memory as a real step does. Decode (1 new token) or prefill (N new tokens
// after C cached ones). Norms, projections and KV writes are left out.
//
//   pagoda_cpu_attention_bench KV_DTYPE [CONTEXT] [NEW_TOKENS] [STEPS] [LAYERS]
//     KV_DTYPE: f32 | f16 | bf16 | fp8 | int8 | int4; CONTEXT: cached tokens (512);
//     NEW_TOKENS: 1 for a decode step (default), N for a prefill chunk; STEPS 20; LAYERS 16
//     env: PAGODA_THREADS (pool size); PAGODA_VECTOR_DOT (vector_dot.h implementation, for A/B)
//
// Shape: 32 query / 8 KV heads of 64, block size 16 (the side-by-side model).
// Prints the median and best step time, the KV bytes read per second, the
// process CPU time per step and the 1-minute load average before and after.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"
#include "pagoda/backend/cpu/kernels/vector_dot.h"
#include "pagoda/core/dtype.h"

namespace {

using pagoda::DType;
namespace kernels = pagoda::kernels;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double load_average() {
  double l = 0.0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = 0.0;
    std::fclose(f);
  }
  return l;
}

struct Store {
  std::vector<std::byte> data, scales;
};

// One pool of `blocks` blocks, every vector written through the KV quantizer from seeded values.
Store make_store(DType dtype, int32_t blocks, int32_t block_size, int32_t heads, int32_t dim, uint64_t seed) {
  Store s;
  const size_t vectors = static_cast<size_t>(blocks) * block_size * heads;
  const size_t head_bytes = kernels::kv_head_bytes(dim, dtype), scale_bytes = kernels::kv_head_scale_bytes(dim, dtype);
  s.data.resize(vectors * head_bytes);
  s.scales.resize(vectors * scale_bytes);
  std::vector<float> x(static_cast<size_t>(dim));
  for (size_t v = 0; v < vectors; ++v) {
    for (float& e : x) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      e = static_cast<float>(static_cast<int64_t>(seed >> 33) % 2000 - 1000) / 1000.0f;
    }
    const int64_t slot = static_cast<int64_t>(v / heads);
    const int32_t head = static_cast<int32_t>(v % heads);
    std::byte* scales = scale_bytes > 0
                            ? s.scales.data() + kernels::kv_scale_vector(slot, head, block_size, heads) * scale_bytes
                            : nullptr;
    kernels::quantize_kv_vector(x.data(), dim, dtype, s.data.data() + v * head_bytes, scales);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s f32|f16|bf16|fp8|int8|int4 [CONTEXT] [NEW_TOKENS] [STEPS] [LAYERS]\n", argv[0]);
    return 2;
  }
  const auto dtype = pagoda::dtype_from_name(argv[1]);
  if (!dtype || !(*dtype == DType::kF32 || *dtype == DType::kF16 || *dtype == DType::kBF16 ||
                  *dtype == DType::kFP8E4M3 || *dtype == DType::kInt8 || *dtype == DType::kInt4)) {
    std::fprintf(stderr, "KV_DTYPE must be f32, f16, bf16, fp8, int8 or int4, got '%s'\n", argv[1]);
    return 2;
  }
  const int32_t context = argc > 2 ? std::max(0, std::atoi(argv[2])) : 512;
  const int32_t fresh = argc > 3 ? std::max(1, std::atoi(argv[3])) : 1;
  const int steps = argc > 4 ? std::max(1, std::atoi(argv[4])) : 20;
  const int layers = argc > 5 ? std::max(1, std::atoi(argv[5])) : 16;
  if (const char* impl = std::getenv("PAGODA_VECTOR_DOT"); impl != nullptr && *impl != '\0') {
    if (!kernels::select_vector_dot_implementation(impl)) {
      std::fprintf(stderr, "PAGODA_VECTOR_DOT=%s: unknown, or this CPU lacks its instructions\n", impl);
      return 2;
    }
  }
  constexpr int32_t kBlock = 16, kKvHeads = 8, kQHeads = 32, kDim = 64;
  const int32_t tokens = context + fresh;
  const int32_t blocks = (tokens + kBlock - 1) / kBlock;

  std::vector<Store> keys, values;
  for (int l = 0; l < layers; ++l) {
    keys.push_back(make_store(*dtype, blocks, kBlock, kKvHeads, kDim, 2 * l + 1));
    values.push_back(make_store(*dtype, blocks, kBlock, kKvHeads, kDim, 2 * l + 2));
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> q(static_cast<size_t>(fresh) * kQHeads * kDim), out(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(static_cast<float>(i)) * 0.5f;
  kernels::PagedSequence seq;
  seq.token_offset = 0;
  seq.num_new_tokens = fresh;
  seq.num_cached_tokens = context;
  seq.block_table = table;
  const kernels::PagedAttentionParams params{kQHeads, 1.0f / std::sqrt(static_cast<float>(kDim)), 0};

  std::vector<double> times;
  const double load_before = load_average(), cpu0 = process_cpu_seconds();
  for (int s = 0; s < steps + 1; ++s) {  // the first step warms up and is not timed
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < layers; ++l) {
      kernels::PagedKvLayer layer;
      layer.key = keys[l].data.data();
      layer.value = values[l].data.data();
      layer.key_scales = keys[l].scales.empty() ? nullptr : keys[l].scales.data();
      layer.value_scales = values[l].scales.empty() ? nullptr : values[l].scales.data();
      layer.num_blocks = blocks;
      layer.block_size = kBlock;
      layer.num_kv_heads = kKvHeads;
      layer.head_dim = kDim;
      layer.key_dtype = layer.value_dtype = *dtype;
      kernels::paged_attention(q.data(), layer, std::span<const kernels::PagedSequence>(&seq, 1), params, out.data());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) times.push_back(ms);
  }
  const double cpu_ms = (process_cpu_seconds() - cpu0) * 1e3 / (steps + 1);
  std::sort(times.begin(), times.end());
  const double kv_bytes = static_cast<double>(layers) * 2.0 * tokens * kKvHeads *
                          static_cast<double>(kernels::kv_head_bytes(kDim, *dtype) + kernels::kv_head_scale_bytes(kDim, *dtype));
  std::printf("kv %s context %d new %d layers %d (vector_dot %s): median %.2f ms (%.1f GB/s of KV), best %.2f ms, "
              "CPU %.2f ms/step (load %.2f -> %.2f)\n",
              argv[1], context, fresh, layers, kernels::vector_dot_implementation(), times[times.size() / 2],
              kv_bytes / (times[times.size() / 2] * 1e6), times.front(), cpu_ms, load_before, load_average());
  return 0;
}
