// Paged attention harness for the GPU machine: HBM copy ceiling, decode GB/s of
// KV read and causal prefill TFLOP/s, each the median of event-timed runs of a
// graph-captured launch after warm-up. Decode pools are ~1 GiB (far past the
// 60 MB L2, so every run reads HBM); prefill rotates among input sets that
// together exceed the L2. Where the naive GPU kernel can run (length <= 12,000)
// the fast output is checked against it at the benchmark shape.
//
//   attention_bench [--json FILE] [--iters N] [--only SUBSTRING]
// --only runs the figures whose name contains SUBSTRING ("copy", "decode", "prefill", ...).
// Prints one line per figure and a summary table last.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/kernels/cuda/attention_kernels.h"
#include "pagoda/kernels/cuda/attention_plan.h"
#include "pagoda/kernels/cuda/random_fill.h"

namespace {

using namespace pagoda::kernels::cuda;

#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

struct Figure {
  std::string name;
  double value;
  std::string unit;
  double micros;
  double check;  // rel L2 vs naive, or -1 when not checked
};
std::vector<Figure> figures;
std::string only_filter;
bool selected(const std::string& name) {
  return only_filter.empty() || name.find(only_filter) != std::string::npos;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `iters` event-timed launches of fn(i) (i rotates inputs).
template <typename Fn>
double time_median_ms(int warmup, int iters, cudaStream_t stream, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    fn(i);
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(ms);
}

double copy_ceiling(cudaStream_t stream, int iters) {
  const size_t bytes = size_t{2} << 30;
  void* a = device_alloc(bytes);
  void* b = device_alloc(bytes);
  CHECK_CUDA(launch_fill_random_bf16(a, bytes / 2, 1, -1, 1, stream));
  const double ms = time_median_ms(3, iters, stream, [&](int) {
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  cudaFree(a);
  cudaFree(b);
  const double gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
  std::printf("copy: %.0f GB/s (read + write, %.2f ms for 2 GiB)\n", gbps, ms);
  figures.push_back({"copy", gbps, "GB/s", ms * 1e3, -1});
  return gbps;
}

double compare_bf16(const void* got_dev, const void* want_dev, size_t count) {
  std::vector<uint16_t> got(count), want(count);
  CHECK_CUDA(cudaMemcpy(got.data(), got_dev, count * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(want.data(), want_dev, count * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < count; ++i) {
    const double g = pagoda::bf16_to_f32(got[i]), w = pagoda::bf16_to_f32(want[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - w) * (g - w);
    den += w * w;
  }
  return std::sqrt(num / den);
}

struct Shape {
  int q_heads = 32, kv_heads = 8, head_dim = 128, block_size = 16;
};

// One attention measurement. All sequences of the batch have `new_tokens` new
// tokens after `length - new_tokens` cached ones. sets: input sets rotated.
void run_case(const std::string& name, const Shape& shape, int batch, int length, int new_tokens,
              int split_tokens, int sets, int iters, const cudaDeviceProp& prop,
              cudaStream_t stream, bool portable_prefill = false) {
  if (!selected(name)) return;
  const int blocks_per_seq = (length + shape.block_size - 1) / shape.block_size;
  const int num_blocks = batch * blocks_per_seq;
  std::mt19937 rng(42);
  std::vector<int32_t> ids(num_blocks);
  for (int i = 0; i < num_blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);  // scattered, as after real allocation churn
  std::vector<AttentionSequence> seqs;
  for (int b = 0; b < batch; ++b)
    seqs.push_back({new_tokens, length - new_tokens,
                    std::span<const int32_t>(ids.data() + size_t(b) * blocks_per_seq, blocks_per_seq)});
  AttentionConfig config{shape.q_heads, shape.kv_heads, shape.head_dim, shape.block_size,
                         num_blocks, 0.0f, KvElement::kBF16};
  auto plan = PagedAttentionPlan::create(config, seqs, {prop.multiProcessorCount},
                                         {split_tokens, false, portable_prefill});
  if (!plan.ok()) {
    std::printf("%s: plan failed: %s\n", name.c_str(), plan.status().to_string().c_str());
    return;
  }
  const size_t pool_elems = size_t(num_blocks) * shape.block_size * shape.kv_heads * shape.head_dim;
  const size_t q_elems = size_t(batch) * new_tokens * shape.q_heads * shape.head_dim;
  std::vector<void*> keys(sets), values(sets), qs(sets), outs(sets);
  for (int s = 0; s < sets; ++s) {
    keys[s] = device_alloc(pool_elems * 2);
    values[s] = device_alloc(pool_elems * 2);
    qs[s] = device_alloc(q_elems * 2);
    outs[s] = device_alloc(q_elems * 2);
    CHECK_CUDA(launch_fill_random_bf16(keys[s], pool_elems, 10 + s, -2, 2, stream));
    CHECK_CUDA(launch_fill_random_bf16(values[s], pool_elems, 20 + s, -1, 1, stream));
    CHECK_CUDA(launch_fill_random_bf16(qs[s], q_elems, 30 + s, -2, 2, stream));
  }
  void* arena = device_alloc(plan->arena_bytes());
  void* workspace = device_alloc(plan->workspace_bytes());
  CHECK_CUDA(cudaMemcpy(arena, plan->arena().data(), plan->arena_bytes(), cudaMemcpyHostToDevice));
  std::vector<AttentionDescriptor> descs;
  for (int s = 0; s < sets; ++s)
    descs.push_back(plan->descriptor(static_cast<int32_t*>(arena), {keys[s], values[s]},
                                     static_cast<float*>(workspace)));

  // One graph per input set, as a model forward would replay it.
  std::vector<cudaGraphExec_t> graphs(sets);
  for (int s = 0; s < sets; ++s) {
    cudaGraph_t graph;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK_CUDA(launch_paged_attention(descs[s], qs[s], outs[s], stream));
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&graphs[s], graph, 0));
    cudaGraphDestroy(graph);
  }
  const double ms = time_median_ms(5, iters, stream, [&](int i) {
    CHECK_CUDA(cudaGraphLaunch(graphs[i % sets], stream));
  });
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGetLastError());

  double check = -1;
  if (length <= 12000) {
    void* naive_out = device_alloc(q_elems * 2);
    CHECK_CUDA(launch_naive_paged_attention(descs[0], qs[0], naive_out, length, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    check = compare_bf16(outs[0], naive_out, q_elems);
    cudaFree(naive_out);
  }

  const bool decode = plan->kernel() == AttentionKernel::kDecode;
  double value;
  std::string unit;
  if (decode) {
    const double kv_bytes = 2.0 * batch * length * shape.kv_heads * shape.head_dim * 2;
    value = kv_bytes / (ms * 1e-3) / 1e9;
    unit = "GB/s";
  } else {
    // Causal: each new token at position p scores p + 1 positions (for a whole
    // prompt that is the L * L / 2 the PyTorch baseline counts, to within L / 2).
    const int cached = length - new_tokens;
    const double scored = double(new_tokens) * cached + double(new_tokens) * (new_tokens + 1) / 2;
    const double flops = 4.0 * batch * shape.q_heads * shape.head_dim * scored;
    value = flops / (ms * 1e-3) / 1e12;
    unit = "TFLOP/s";
  }
  static const char* kKernelNames[] = {"decode", "prefill mma.sync", "prefill wgmma"};
  std::printf("%s: %.1f us, %.0f %s (%s, splits %d, items %d, rel L2 vs naive %s)\n", name.c_str(),
              ms * 1e3, value, unit.c_str(), kKernelNames[static_cast<int>(plan->kernel())],
              plan->max_splits(), plan->num_work_items(),
              check < 0 ? "n/a" : std::to_string(check).c_str());
  std::fflush(stdout);
  figures.push_back({name, value, unit, ms * 1e3, check});

  for (int s = 0; s < sets; ++s) {
    cudaGraphExecDestroy(graphs[s]);
    cudaFree(keys[s]);
    cudaFree(values[s]);
    cudaFree(qs[s]);
    cudaFree(outs[s]);
  }
  cudaFree(arena);
  cudaFree(workspace);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int iters = 30;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only_filter = argv[++i];
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_CUDA(prepare_paged_attention_kernels());

  if (selected("copy")) copy_ceiling(stream, iters);
  const Shape gqa;
  // Decode, GQA 32/8, d=128, block 16: the three shapes (automatic split).
  run_case("decode B=64 L=4096", gqa, 64, 4096, 1, 0, 1, iters, prop, stream);
  run_case("decode B=8 L=32768", gqa, 8, 32768, 1, 0, 1, iters, prop, stream);
  run_case("decode B=256 L=1024", gqa, 256, 1024, 1, 0, 1, iters, prop, stream);
  // What the split buys, and other block sizes.
  run_case("decode B=8 L=32768 unsplit", gqa, 8, 32768, 1, 1 << 20, 1, iters, prop, stream);
  for (int bs : {8, 32, 64}) {
    Shape s = gqa;
    s.block_size = bs;
    run_case("decode bs=" + std::to_string(bs) + " B=64 L=4096", s, 64, 4096, 1, 0, 1, iters, prop,
             stream);
  }
  {
    Shape mha64{32, 32, 64, 16};
    run_case("decode MHA 32 d=64 B=64 L=2048", mha64, 64, 2048, 1, 0, 1, iters, prop, stream);
  }
  // Prefill, causal, GQA 32/8, d=128, one sequence (rotating input sets past the L2).
  run_case("prefill L=4096", gqa, 1, 4096, 4096, 0, 4, iters, prop, stream);
  run_case("prefill L=16384", gqa, 1, 16384, 16384, 0, 2, std::max(5, iters / 3), prop, stream);
  // The mma.sync kernel on the same shapes (what wgmma buys).
  run_case("prefill mma.sync L=4096", gqa, 1, 4096, 4096, 0, 4, iters, prop, stream, true);
  run_case("prefill mma.sync L=16384", gqa, 1, 16384, 16384, 0, 2, std::max(5, iters / 3), prop,
           stream, true);
  // Chunked prefill after a cached prefix: 2048 new tokens after 6144 cached.
  {
    const int batch = 1, length = 8192, fresh = 2048;
    run_case("prefill chunk 2048 after 6144 cached", gqa, batch, length, fresh, 0, 4, iters, prop,
             stream);
  }

  std::printf("\n%-40s %12s %10s %12s\n", "figure", "value", "unit", "time_us");
  for (const auto& f : figures)
    std::printf("%-40s %12.1f %10s %12.1f\n", f.name.c_str(), f.value, f.unit.c_str(), f.micros);
  if (!json_path.empty()) {
    FILE* out = std::fopen(json_path.c_str(), "w");
    if (out) {
      std::fprintf(out, "{\n");
      for (size_t i = 0; i < figures.size(); ++i)
        std::fprintf(out, "  \"%s\": {\"value\": %.2f, \"unit\": \"%s\", \"us\": %.2f, \"rel_l2_vs_naive\": %.3g}%s\n",
                     figures[i].name.c_str(), figures[i].value, figures[i].unit.c_str(),
                     figures[i].micros, figures[i].check, i + 1 < figures.size() ? "," : "");
      std::fprintf(out, "}\n");
      std::fclose(out);
    }
  }
  return 0;
}
