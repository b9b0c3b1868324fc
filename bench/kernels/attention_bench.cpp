// Paged attention harness for the GPU machine: HBM copy ceiling, decode GB/s of
// KV read and causal prefill TFLOP/s, each the median of event-timed runs of a
// graph-captured launch after warm-up. Decode pools are ~1 GiB (far past the
// 60 MB L2, so every run reads HBM); prefill rotates among input sets that
// together exceed the L2. Where the naive GPU kernel can run (length <= 12,000)
// the fast output is checked against it at the benchmark shape.
//
//   attention_bench [--json FILE] [--iters N] [--only SUBSTRING] [--kv-dtype LIST]
// --only runs the figures whose name contains SUBSTRING ("copy", "decode", "prefill", ...);
// "A|B" selects either, "=NAME" one figure exactly ("=decode fp8 B=8 L=32768").
// Prefill runs on the default wgmma schedule, then on each PAGODA_PREFILL_SM90
// schedule ("prefill v2 ...", "prefill v4 ...", "prefill v4-lockstep ...").
// --kv-dtype bf16,fp8,fp8-tensor,int8,int4,int8/int4 (default bf16): the KV
// formats the decode figures sweep (K/V for a mixed pair), side by side in one
// run; fp8-tensor is fp8 with per-tensor scales (no scale records read). A
// quantized pool holds random codes (fp8 codes all finite) and random scales;
// its effective GB/s counts the bytes actually read (codes + scale records),
// and every decode figure also reports tokens/s = sequences per second x context.
// Prints one line per figure and a summary table last.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/backend/cuda/attention/attention_kernels.h"
#include "pagoda/backend/cuda/attention/attention_plan.h"
#include "pagoda/backend/cuda/random_fill.h"

namespace {

using namespace pagoda::kernels::cuda;
using pagoda::cuda::fill_random_bf16;

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
  if (only_filter.empty()) return true;
  // "A|B": any of the alternatives; "=NAME": exactly that figure.
  size_t begin = 0;
  while (begin <= only_filter.size()) {
    const size_t bar = std::min(only_filter.find('|', begin), only_filter.size());
    const std::string alternative = only_filter.substr(begin, bar - begin);
    if (!alternative.empty() && alternative[0] == '=' ? name == alternative.substr(1)
                                                      : name.find(alternative) != std::string::npos)
      return true;
    begin = bar + 1;
  }
  return false;
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

// Median milliseconds of `iters` event-timed launches of fn(i) (i rotates inputs),
// after at least `warmup` launches and kWarmupMs of them: the GPU's clocks
// settle to this kernel's own load (power draw differs by kernel), so a short
// case is not timed at the clocks the case before it left behind. (Five
// launches alone let one 4K prefill read 508 or 434 TFLOP/s depending on what
// ran before it, 2026-11-29.)
// PAGODA_BENCH_WARMUP_MS overrides it (e.g. 0: the launches alone; 500: sustained clocks).
const double kWarmupMs = [] {
  const char* v = std::getenv("PAGODA_BENCH_WARMUP_MS");
  return v != nullptr ? std::atof(v) : 50.0;
}();

template <typename Fn>
double time_median_ms(int warmup, int iters, cudaStream_t stream, Fn fn) {
  const auto warm_start = std::chrono::steady_clock::now();
  for (int launched = 0, round = std::max(warmup, 1); launched < 100000; launched += round) {
    for (int i = 0; i < round; ++i) fn(launched + i);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - warm_start).count();
    if (elapsed >= kWarmupMs) break;
  }
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
  CHECK_CUDA(fill_random_bf16(a, bytes / 2, -1, 1, 1, stream));
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
  KvElement key = KvElement::kBF16, value = KvElement::kBF16;
  bool cuda_cores = false;  // decode: the CUDA-core loop instead of tensor cores
  // fp8: one K and one V scale for the whole pool (a checkpoint's k_scale /
  // v_scale); the kernel gets no scale records.
  bool tensor_scales = false;
};

const char* element_name(KvElement e) {
  switch (e) {
    case KvElement::kBF16: return "bf16";
    case KvElement::kFP8E4M3: return "fp8";
    case KvElement::kInt8: return "int8";
    case KvElement::kInt4: return "int4";
  }
  return "?";
}

// Bytes of one (token, head) vector's codes and of its scale records (kv_quant.h).
size_t code_bytes(int head_dim, KvElement e) {
  return e == KvElement::kBF16 ? size_t(head_dim) * 2 : e == KvElement::kInt4 ? size_t(head_dim) / 2 : head_dim;
}
size_t scale_bytes(int head_dim, KvElement e) {
  return e == KvElement::kBF16 ? 0 : e == KvElement::kInt4 ? size_t(head_dim + 31) / 32 * 4 : 4;
}

// Random contents for one pool. bf16: values in [low, high). Codes: the bytes
// of bf16 values in [0.5, 0.99) (high byte 0x3f, low byte <= 0x7d), which are
// all finite fp8 e4m3 codes and any int8 / int4 codes. Scale records: bf16 pairs
// in [1e-29, 2e-29), which read as an f32 scale (fp8) or as f16 scale and zero
// (int, about 3e-4) keep every value finite and small.
void fill_pool(void* codes, void* scales, size_t vectors, int head_dim, KvElement e, uint64_t seed, float low,
               float high, cudaStream_t stream) {
  if (e == KvElement::kBF16) {
    CHECK_CUDA(fill_random_bf16(codes, vectors * head_dim, low, high, seed, stream));
    return;
  }
  CHECK_CUDA(fill_random_bf16(codes, vectors * code_bytes(head_dim, e) / 2, 0.5f, 0.99f, seed, stream));
  CHECK_CUDA(fill_random_bf16(scales, vectors * scale_bytes(head_dim, e) / 2, 1e-29f, 2e-29f, seed + 7, stream));
}

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
                         num_blocks, 0.0f, shape.key, shape.value};
  AttentionPlanOptions options{split_tokens, false, portable_prefill};
  options.decode_cuda_cores = shape.cuda_cores;
  auto plan = PagedAttentionPlan::create(config, seqs, {prop.multiProcessorCount}, options);
  if (!plan.ok()) {
    std::printf("%s: plan failed: %s\n", name.c_str(), plan.status().to_string().c_str());
    return;
  }
  const size_t vectors = size_t(num_blocks) * shape.block_size * shape.kv_heads;
  const size_t q_elems = size_t(batch) * new_tokens * shape.q_heads * shape.head_dim;
  std::vector<void*> keys(sets), values(sets), key_scales(sets), value_scales(sets), qs(sets), outs(sets);
  for (int s = 0; s < sets; ++s) {
    keys[s] = device_alloc(vectors * code_bytes(shape.head_dim, shape.key));
    values[s] = device_alloc(vectors * code_bytes(shape.head_dim, shape.value));
    key_scales[s] = device_alloc(vectors * scale_bytes(shape.head_dim, shape.key));
    value_scales[s] = device_alloc(vectors * scale_bytes(shape.head_dim, shape.value));
    qs[s] = device_alloc(q_elems * 2);
    outs[s] = device_alloc(q_elems * 2);
    fill_pool(keys[s], key_scales[s], vectors, shape.head_dim, shape.key, 10 + s, -2, 2, stream);
    fill_pool(values[s], value_scales[s], vectors, shape.head_dim, shape.value, 20 + s, -1, 1, stream);
    CHECK_CUDA(fill_random_bf16(qs[s], q_elems, -2, 2, 30 + s, stream));
  }
  void* arena = device_alloc(plan->arena_bytes());
  void* workspace = device_alloc(plan->workspace_bytes());
  CHECK_CUDA(cudaMemcpy(arena, plan->arena().data(), plan->arena_bytes(), cudaMemcpyHostToDevice));
  std::vector<AttentionDescriptor> descs;
  for (int s = 0; s < sets; ++s) {
    PagedKvPointers kv{keys[s], values[s], key_scales[s], value_scales[s]};
    // The random codes read as values of about 0.5-1 x 2^k: a scale of 1e-29 keeps them as small as
    // the random records do.
    if (shape.tensor_scales) kv = {keys[s], values[s], nullptr, nullptr, 1.5e-29f, 1.5e-29f};
    descs.push_back(plan->descriptor(static_cast<int32_t*>(arena), kv, static_cast<float*>(workspace)));
  }

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
  if (length <= 12000 && !shape.tensor_scales) {  // the naive kernel reads records
    void* naive_out = device_alloc(q_elems * 2);
    CHECK_CUDA(launch_naive_paged_attention(descs[0], qs[0], naive_out, length, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    check = compare_bf16(outs[0], naive_out, q_elems);
    cudaFree(naive_out);
  }

  const bool decode = plan->kernel() == AttentionKernel::kDecode;
  double value;
  std::string unit;
  double tokens_per_s = 0;
  if (decode) {
    // The bytes actually read: codes (or bf16 elements) and scale records of K and V.
    const size_t records = shape.tensor_scales ? 0
                                               : scale_bytes(shape.head_dim, shape.key) +
                                                     scale_bytes(shape.head_dim, shape.value);
    const double per_token =
        double(shape.kv_heads) *
        (code_bytes(shape.head_dim, shape.key) + code_bytes(shape.head_dim, shape.value) + records);
    const double kv_bytes = double(batch) * length * per_token;
    value = kv_bytes / (ms * 1e-3) / 1e9;
    unit = "GB/s";
    tokens_per_s = double(batch) * length / (ms * 1e-3);  // sequences per second x context
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
  std::printf("%s: %.1f us, %.0f %s%s (%s, splits %d, items %d, rel L2 vs naive %s)\n", name.c_str(),
              ms * 1e3, value, unit.c_str(),
              decode ? (", " + std::to_string(static_cast<long long>(tokens_per_s / 1e6)) + "M tokens/s").c_str()
                     : "",
              kKernelNames[static_cast<int>(plan->kernel())], plan->max_splits(), plan->num_work_items(),
              check < 0 ? "n/a" : std::to_string(check).c_str());
  std::fflush(stdout);
  figures.push_back({name, value, unit, ms * 1e3, check});
  if (decode) figures.push_back({name + " tokens/s", tokens_per_s / 1e6, "M tok/s", ms * 1e3, check});

  for (int s = 0; s < sets; ++s) {
    cudaGraphExecDestroy(graphs[s]);
    cudaFree(keys[s]);
    cudaFree(values[s]);
    cudaFree(key_scales[s]);
    cudaFree(value_scales[s]);
    cudaFree(qs[s]);
    cudaFree(outs[s]);
  }
  cudaFree(arena);
  cudaFree(workspace);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::string kv_list = "bf16";
  int iters = 30;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only_filter = argv[++i];
    else if (!std::strcmp(argv[i], "--kv-dtype") && i + 1 < argc) kv_list = argv[++i];
  }
  // The KV formats of the decode sweep: "fp8" or "K/V" pairs.
  struct KvFormat {
    KvElement key, value;
    bool tensor_scales;
  };
  std::vector<KvFormat> kv_formats;
  {
    auto parse = [](const std::string& n, KvElement* e) {
      if (n == "bf16") *e = KvElement::kBF16;
      else if (n == "fp8") *e = KvElement::kFP8E4M3;
      else if (n == "int8") *e = KvElement::kInt8;
      else if (n == "int4") *e = KvElement::kInt4;
      else return false;
      return true;
    };
    size_t begin = 0;
    while (begin <= kv_list.size()) {
      const size_t comma = std::min(kv_list.find(',', begin), kv_list.size());
      const std::string item = kv_list.substr(begin, comma - begin);
      const size_t slash = item.find('/');
      KvElement k, v;
      const bool tensor_scales = item == "fp8-tensor";
      if (tensor_scales) {
        k = v = KvElement::kFP8E4M3;
      } else if (!parse(item.substr(0, slash), &k) ||
                 !parse(slash == std::string::npos ? item : item.substr(slash + 1), &v)) {
        std::fprintf(stderr, "--kv-dtype: '%s' is not bf16, fp8, fp8-tensor, int8, int4 or K/V\n", item.c_str());
        return 2;
      }
      kv_formats.push_back({k, v, tensor_scales});
      begin = comma + 1;
    }
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
  for (const auto& [key, value, tensor_scales] : kv_formats) {
    // "decode" for bf16 (the names earlier runs used), "decode fp8", "decode int8/int4", ...
    std::string tag = "decode";
    if (key != KvElement::kBF16 || value != KvElement::kBF16) {
      tag += std::string(" ") + element_name(key);
      if (value != key) tag += std::string("/") + element_name(value);
      if (tensor_scales) tag += "-tensor";
    }
    Shape g = gqa;
    g.key = key;
    g.value = value;
    g.tensor_scales = tensor_scales;
    // Decode, GQA 32/8, d=128, block 16: the three shapes (automatic split).
    run_case(tag + " B=64 L=4096", g, 64, 4096, 1, 0, 1, iters, prop, stream);
    run_case(tag + " B=8 L=32768", g, 8, 32768, 1, 0, 1, iters, prop, stream);
    run_case(tag + " B=256 L=1024", g, 256, 1024, 1, 0, 1, iters, prop, stream);
    // What the split buys (and a split of one wave or of four), and other block sizes.
    run_case(tag + " B=8 L=32768 unsplit", g, 8, 32768, 1, 1 << 20, 1, iters, prop, stream);
    run_case(tag + " B=8 L=32768 split 8192", g, 8, 32768, 1, 8192, 1, iters, prop, stream);
    run_case(tag + " B=8 L=32768 split 4096", g, 8, 32768, 1, 4096, 1, iters, prop, stream);
    run_case(tag + " B=8 L=32768 split 2048", g, 8, 32768, 1, 2048, 1, iters, prop, stream);
    run_case(tag + " B=8 L=32768 split 16384", g, 8, 32768, 1, 16384, 1, iters, prop, stream);
    // One KV head: each block's codes are contiguous per head (is the 8-head
    // interleave, 128-byte pieces per head and token for fp8, costing HBM efficiency?).
    Shape one_kv_head{4, 1, 128, 16, key, value, false, tensor_scales};
    run_case(tag + " GQA 4/1 B=512 L=4096", one_kv_head, 512, 4096, 1, 0, 1, iters, prop, stream);
    for (int bs : {8, 32, 64}) {
      Shape s = g;
      s.block_size = bs;
      run_case(tag + " bs=" + std::to_string(bs) + " B=64 L=4096", s, 64, 4096, 1, 0, 1, iters, prop, stream);
    }
    Shape mha64{32, 32, 64, 16, key, value, false, tensor_scales};
    run_case(tag + " MHA 32 d=64 B=64 L=2048", mha64, 64, 2048, 1, 0, 1, iters, prop, stream);
    if (key == value && !tensor_scales) {
      // What the tensor cores buy: the same shapes on the CUDA-core loop.
      Shape cc = g;
      cc.cuda_cores = true;
      run_case(tag + " cuda-cores B=64 L=4096", cc, 64, 4096, 1, 0, 1, iters, prop, stream);
      run_case(tag + " cuda-cores B=8 L=32768", cc, 8, 32768, 1, 0, 1, iters, prop, stream);
      run_case(tag + " cuda-cores B=256 L=1024", cc, 256, 1024, 1, 0, 1, iters, prop, stream);
    }
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
  // Each schedule of the wgmma kernel (PAGODA_PREFILL_SM90, read at launch and
  // baked into the captured graph) on the same shapes, side by side in this run.
  {
    const char* before = std::getenv("PAGODA_PREFILL_SM90");
    const std::string saved = before ? before : "";
    for (const char* schedule : {"v2", "v4", "v4-lockstep"}) {
      setenv("PAGODA_PREFILL_SM90", schedule, 1);
      const std::string tag = std::string("prefill ") + schedule;
      run_case(tag + " L=4096", gqa, 1, 4096, 4096, 0, 4, iters, prop, stream);
      run_case(tag + " L=16384", gqa, 1, 16384, 16384, 0, 2, std::max(5, iters / 3), prop, stream);
      run_case(tag + " chunk 2048 after 6144 cached", gqa, 1, 8192, 2048, 0, 4, iters, prop, stream);
      Shape pages64 = gqa;  // 4x fewer, larger copies per tile
      pages64.block_size = 64;
      run_case(tag + " bs=64 L=16384", pages64, 1, 16384, 16384, 0, 2, std::max(5, iters / 3), prop, stream);
    }
    if (before) setenv("PAGODA_PREFILL_SM90", saved.c_str(), 1);
    else unsetenv("PAGODA_PREFILL_SM90");
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
