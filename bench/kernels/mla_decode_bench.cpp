// MLA decode kernel harness for the GPU machine (backend/cuda/attention/mla_decode.h):
// GB/s over the paged latent bytes read (codes + fp8 scale records) at the
// issue's shapes, batch 64 x 4K and 8 x 32K context, bf16 and fp8 latent (per-vector
// scale records, 580 B a token, and FlashMLA's 656-byte records),
// 16 and 128 heads, blocks of 64 (and 16 for some shapes), next to the HBM copy
// ceiling. Each figure is the median of event-timed launches after warm-up;
// the pools (150-300 MB) are far past the 60 MB L2. The start event must find
// the GPU busy, or the host's launch work (the tensor maps' encode, the
// launches: a few microseconds) falls inside the window (METHOD.md's pitfall).
// --timing spin (the default since session 17) queues a 50 us kernel that
// touches no memory ahead of each start event: the window holds GPU time only
// (decode + merge and the gap between them), and the L2 holds what the
// previous launch left (a pool's tail, which the next launch evicts before it
// reaches it). --timing busy (session 16's default) queues a 256 MB memset
// instead: also GPU time only, but the memset's dirty L2 lines are written
// back while the timed kernel reads, which slows a memory-bound kernel
// (docs/BENCHMARKS.md "MLA decode v19"). --timing idle is the method
// of the figures before session 16 (the start event on an idle GPU).
// --merge pdl launches the merge pass as a programmatic dependent launch
// (MlaDecodeDescriptor::programmatic_merge); --merge none times the TMA kernels'
// main pass alone (a diagnostic: where the merge's share of the time goes; one
// full launch after the timed ones still writes the checked output; the cp.async
// kernel keeps its merge); --merge fused folds the merge into the kernels that can
// (MlaMergeMode::kFused: " fused" in the name where the plan took it, " fused paired" where it
// took cluster pairs); --merge fused_global folds it through the counters only (kFusedGlobal);
// plain is the default (the merge pass, whatever PAGODA_MLA_MERGE says). Row 0's first 16 heads are
// checked against a float64 reference at every shape (rel L2 printed), and
// every output is checked finite. Where the TMA-fed kernel applies (bf16, 16
// heads) every kernel runs on the same pool, one row each ("[cp_async]",
// "[tma]", "[tma_tile]", "[tma_pair]",
// "[tma_pair_tile]", "[tma_pingpong]", "[tma_fast_exp]",
// "[tma_pingpong_fast_exp]", "[tma_pingpong_turns]", "[tma_pingpong_2chain]", "[tma_pingpong_all]",
// "[tma_pingpong_split]", "[tma_pingpong_split_2chain]" (their times include
// the merge pass they always run) in the name; over FlashMLA's fp8 records
// (fp8-656, 16 heads) "[cp_async]" and "[tma_fp8]" in
// the name); --kernel
// picks one. --schedule runs the plan's whole-tile budgets ("whole", the
// default plan), spread budgets ("spread": MlaDecodeOptions::spread_budget,
// " spread" in the name) or both; "bits==tma" says whether a TMA variant's
// output equals the first TMA variant's of the same schedule bit for bit
// (tma_pingpong* and tma_fast_exp round differently: "NO" is expected there, its check
// against float64 is what counts).
//
//   mla_decode_bench [--iters N] [--only SUBSTRING] [--kernel all|NAME] [--schedule all|whole|spread]
//                    [--timing busy|idle|spin] [--merge plain|pdl|none|fused|fused_global]
//                    [--pages token|swizzled]
// --pages swizzled stores the bf16 pools (block sizes of a multiple of 8) as swizzled pages
// (runtime/mla_latent_layout.h, " swizzled" in the name): the cp.async kernel's loads from them, beside the
// same shapes run with --pages token (the default).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_spin.h"
#include "pagoda/backend/cuda/attention/mla_decode.h"
#include "pagoda/core/dtype.h"
#include "pagoda/runtime/mla_fp8_layout.h"
#include "pagoda/runtime/mla_latent_layout.h"

namespace {

using namespace pagoda::kernels::cuda;

#define CHECK_CUDA(call)                                                                           \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return p;
}

struct Xorshift {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float unit() { return float(next() >> 40) / float(1 << 24) * 2.0f - 1.0f; }  // [-1, 1)
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  std::string name;
  double gbps, tflops, micros, check;
};

int iters = 50;
std::string only;
std::string kernel_choice = "all";  // "auto": the plan's automatic choice on this card
AttentionDeviceInfo bench_device;  // this card (query_attention_device_info)
std::string schedule_choice = "whole";
std::string timing_choice = "spin";
bool programmatic_merge = false;
// --pages swizzled: bf16 pools at block sizes of a multiple of 8 as swizzled pages (runtime/mla_latent_layout.h);
// the TMA kernels then fall back to cp.async (their boxes read token-major rows).
bool swizzled_pages = false;
bool decode_only = false;  // --merge none
MlaMergeMode merge_mode = MlaMergeMode::kPass;  // --merge plain / pdl / none: kPass

// The timed launch: decode + merge, or (--merge none) a TMA kernel's main pass alone.
cudaError_t timed_launch(const MlaDecodeDescriptor& desc, const void* q, void* out) {
  if (decode_only && desc.kernel == MlaDecodeKernel::kTmaFp8) return launch_mla_decode_tma_fp8_main(desc, q, out, nullptr);
  if (decode_only && is_tma_kernel(desc.kernel)) return launch_mla_decode_tma_main(desc, q, out, nullptr);
  return launch_mla_decode(desc, q, out, nullptr);
}

// --timing spin / busy: work queued ahead of a start event so that the launch
// after it is timed on the GPU alone (see the header). One memset buffer for
// the whole run.
void occupy_gpu_and_flush_l2() {
  if (timing_choice == "spin") CHECK_CUDA(spin_gpu(50.0, nullptr));
  if (timing_choice != "busy") return;
  static const size_t bytes = size_t{256} << 20;
  static void* buffer = device_alloc(bytes);
  static int fill = 0;
  CHECK_CUDA(cudaMemsetAsync(buffer, ++fill & 0xff, bytes));
}

constexpr MlaDecodeKernel kKernels[] = {MlaDecodeKernel::kCpAsync, MlaDecodeKernel::kTma,
                                        MlaDecodeKernel::kTmaTile, MlaDecodeKernel::kTmaPair,
                                        MlaDecodeKernel::kTmaPairTile, MlaDecodeKernel::kTmaPingPong,
                                        MlaDecodeKernel::kTmaFastExp,
                                        MlaDecodeKernel::kTmaPingPongFastExp, MlaDecodeKernel::kTmaPingPongTurns,
                                        MlaDecodeKernel::kTmaPingPongTwoChains, MlaDecodeKernel::kTmaPingPongAll,
                                        MlaDecodeKernel::kTmaPingPongSplit,
                                        MlaDecodeKernel::kTmaPingPongSplitTwoChains, MlaDecodeKernel::kTmaFp8,
                                        MlaDecodeKernel::kBulkPingPongTwoChains};

const char* kernel_name(MlaDecodeKernel k) {
  switch (k) {
    case MlaDecodeKernel::kTma: return "tma";
    case MlaDecodeKernel::kTmaTile: return "tma_tile";
    case MlaDecodeKernel::kTmaPair: return "tma_pair";
    case MlaDecodeKernel::kTmaPairTile: return "tma_pair_tile";
    case MlaDecodeKernel::kTmaPingPong: return "tma_pingpong";
    case MlaDecodeKernel::kTmaFastExp: return "tma_fast_exp";
    case MlaDecodeKernel::kTmaPingPongFastExp: return "tma_pingpong_fast_exp";
    case MlaDecodeKernel::kTmaPingPongTurns: return "tma_pingpong_turns";
    case MlaDecodeKernel::kTmaPingPongTwoChains: return "tma_pingpong_2chain";
    case MlaDecodeKernel::kTmaPingPongAll: return "tma_pingpong_all";
    case MlaDecodeKernel::kTmaPingPongSplit: return "tma_pingpong_split";
    case MlaDecodeKernel::kTmaPingPongSplitTwoChains: return "tma_pingpong_split_2chain";
    case MlaDecodeKernel::kTmaFp8: return "tma_fp8";
    case MlaDecodeKernel::kBulkPingPongTwoChains: return "bulk_pingpong_2chain";
    default: return "cp_async";
  }
}

double copy_ceiling() {
  const size_t bytes = size_t{1} << 30;
  void* a = device_alloc(bytes);
  void* b = device_alloc(bytes);
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (i >= 3) ms.push_back(t);
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 2.0 * double(bytes) / (median(ms) * 1e-3) / 1e9;
}

std::vector<Result> run_shape(int batch, int context, int heads, bool fp8, int block_size, int num_sms, uint64_t seed,
                 bool flash = false) {
  const bool swizzled = swizzled_pages && !fp8 && block_size % 8 == 0;
  char name[128];
  std::snprintf(name, sizeof(name), "mla decode %s H=%d B=%d L=%d bs=%d%s", flash ? "fp8-656" : fp8 ? "fp8" : "bf16",
                heads, batch, context, block_size, swizzled ? " swizzled" : "");
  const int blocks_per_row = (context + block_size - 1) / block_size;
  const int num_blocks = batch * blocks_per_row;
  const size_t slots = size_t(num_blocks) * block_size;
  const size_t record_bytes = flash ? size_t(pagoda::kernels::kMlaFp8VectorBytes) : kMlaKeyDim * (fp8 ? 1 : 2);
  const size_t code_bytes = slots * record_bytes;
  Xorshift rng{seed};

  // Pool: bf16 values in [-1, 1), or fp8 codes (never NaN) with scales in [0.002, 0.004).
  std::vector<uint8_t> codes(code_bytes);
  std::vector<float> scales(fp8 && !flash ? slots : 0);
  if (flash) {
    // Records drawn directly (as the fp8 pool's codes below): codes never NaN,
    // group scales in [0.002, 0.004), bf16 rope values in [-1, 1).
    for (size_t t = 0; t < slots; ++t) {
      uint8_t* r = codes.data() + t * record_bytes;
      for (int i = 0; i < pagoda::kernels::kMlaFp8LatentValues; ++i) {
        r[i] = uint8_t(rng.next() >> 56);
        if ((r[i] & 0x7f) == 0x7f) r[i] ^= 1;
      }
      for (int g = 0; g < pagoda::kernels::kMlaFp8Groups; ++g) {
        const float sc = 0.002f + 0.002f * (rng.unit() + 1.0f) / 2.0f;
        std::memcpy(r + pagoda::kernels::kMlaFp8ScalesAt + 4 * g, &sc, 4);
      }
      for (int i = 0; i < pagoda::kernels::kMlaFp8RopeValues; ++i) {
        const uint16_t h = pagoda::f32_to_bf16(rng.unit());
        std::memcpy(r + pagoda::kernels::kMlaFp8RopeAt + 2 * i, &h, 2);
      }
    }
  } else if (fp8) {
    for (auto& c : codes) {
      c = uint8_t(rng.next() >> 56);
      if ((c & 0x7f) == 0x7f) c ^= 1;
    }
    for (auto& s : scales) s = 0.002f + 0.002f * (rng.unit() + 1.0f) / 2.0f;
  } else {
    auto* v = reinterpret_cast<uint16_t*>(codes.data());
    for (size_t i = 0; i < slots * kMlaKeyDim; ++i) v[i] = pagoda::f32_to_bf16(rng.unit());
  }
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(uint32_t(seed)));
  std::vector<MlaDecodeRow> rows;
  for (int r = 0; r < batch; ++r)
    rows.push_back({context, std::span<const int32_t>(ids.data() + size_t(r) * blocks_per_row, blocks_per_row)});
  std::vector<uint16_t> q(size_t(batch) * heads * kMlaKeyDim);
  for (auto& e : q) e = pagoda::f32_to_bf16(rng.unit());

  const float scale = 1.0f / std::sqrt(192.0f);
  const MlaDecodeConfig config{heads, block_size, num_blocks, scale,
                               fp8 ? pagoda::kernels::cuda::KvElement::kFP8E4M3 : pagoda::kernels::cuda::KvElement::kBF16,
                               flash      ? MlaLatentLayout::kFlashMla656
                               : swizzled ? MlaLatentLayout::kBf16SwizzledPages
                                          : MlaLatentLayout::kPerVectorScale};
  std::vector<std::pair<MlaDecodeKernel, bool>> kernels;  // (kernel, spread budgets)
  for (const bool spread : {false, true}) {
    if (schedule_choice != "all" && (schedule_choice == "spread") != spread) continue;
    if (kernel_choice == "auto") kernels.push_back({MlaDecodeKernel::kDefault, spread});
    for (MlaDecodeKernel k : kKernels)
      if (kernel_choice == "all" || kernel_choice == kernel_name(k)) kernels.push_back({k, spread});
  }
  const size_t out_elems = size_t(batch) * heads * kMlaLatentDim;
  void* d_codes = device_alloc(code_bytes);
  void* d_scales = device_alloc(scales.size() * 4);
  void* d_q = device_alloc(q.size() * 2);
  void* d_out = device_alloc(out_elems * 2);
  if (swizzled) {  // the device pool swizzled; `codes` stays token-major for the float64 check
    std::vector<uint8_t> paged(code_bytes);
    pagoda::runtime::mla_latent_relayout(reinterpret_cast<const std::byte*>(codes.data()),
                                         reinterpret_cast<std::byte*>(paged.data()), num_blocks, block_size,
                                         kMlaKeyDim, pagoda::runtime::MlaLatentPages::kTokenMajor,
                                         pagoda::runtime::MlaLatentPages::kSwizzled128);
    CHECK_CUDA(cudaMemcpy(d_codes, paged.data(), code_bytes, cudaMemcpyHostToDevice));
  } else {
    CHECK_CUDA(cudaMemcpy(d_codes, codes.data(), code_bytes, cudaMemcpyHostToDevice));
  }
  if (!scales.empty()) CHECK_CUDA(cudaMemcpy(d_scales, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_q, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));

  struct Timed {
    MlaDecodeKernel kernel;
    bool spread;
    bool fused, paired;
    double seconds;
    int ctas, segments;
    std::vector<uint16_t> out;
  };
  std::vector<Timed> timed;
  for (const auto& [kernel, spread] : kernels) {
    MlaDecodeOptions options;
    options.kernel = kernel;
    options.spread_budget = spread;
    options.merge = merge_mode;
    AttentionDeviceInfo device = bench_device;
    device.num_sms = num_sms;
    auto plan = MlaDecodePlan::create(config, rows, device, options);
    if (!plan.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, std::string(plan.status().message()).c_str());
      std::exit(1);
    }
    if (kernel != MlaDecodeKernel::kDefault && plan->kernel() != kernel) continue;  // the TMA kernel does not apply
    void* d_arena = device_alloc(plan->arena_bytes());
    void* d_work = device_alloc(plan->workspace_bytes());
    CHECK_CUDA(cudaMemcpy(d_arena, plan->arena().data(), plan->arena_bytes(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(d_out, 0xff, out_elems * 2));
    auto desc = plan->descriptor(static_cast<int32_t*>(d_arena), d_codes, scales.empty() ? nullptr : d_scales,
                                 static_cast<float*>(d_work));
    desc.programmatic_merge = programmatic_merge;
    for (int i = 0; i < 5; ++i) CHECK_CUDA(launch_mla_decode(desc, d_q, d_out, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < iters; ++i) {
      occupy_gpu_and_flush_l2();
      CHECK_CUDA(cudaEventRecord(start));
      CHECK_CUDA(timed_launch(desc, d_q, d_out));
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    if (decode_only) {  // the checked output: one complete launch
      CHECK_CUDA(launch_mla_decode(desc, d_q, d_out, nullptr));
      CHECK_CUDA(cudaDeviceSynchronize());
    }
    Timed t{plan->kernel(),  spread,           plan->fused_merge(),
            plan->paired_merge(), median(ms) * 1e-3, plan->num_ctas(),
            plan->num_segments(), std::vector<uint16_t>(out_elems)};
    CHECK_CUDA(cudaMemcpy(t.out.data(), d_out, out_elems * 2, cudaMemcpyDeviceToHost));
    for (uint16_t v : t.out)
      if (!std::isfinite(pagoda::bf16_to_f32(v))) {
        std::fprintf(stderr, "%s [%s]: non-finite output\n", name, kernel_name(plan->kernel()));
        std::exit(1);
      }
    CHECK_CUDA(cudaFree(d_arena));
    CHECK_CUDA(cudaFree(d_work));
    timed.push_back(std::move(t));
  }

  // Check: row 0, heads 0..15 against float64 (one reference for every kernel).
  std::vector<double> num(timed.size(), 0.0);
  double den = 0;
  std::vector<double> sc(context);
  for (int h = 0; h < std::min(heads, 16); ++h) {
    const uint16_t* qv = &q[size_t(h) * kMlaKeyDim];
    auto value = [&](int p, int i) -> double {
      const size_t slot = size_t(ids[p / block_size]) * block_size + p % block_size;
      if (flash) return pagoda::kernels::mla_fp8_value(codes.data() + slot * record_bytes, i);
      if (fp8) return pagoda::fp8e4m3_to_f32(codes[slot * kMlaKeyDim + i]) * double(scales[slot]);
      return pagoda::bf16_to_f32(reinterpret_cast<const uint16_t*>(codes.data())[slot * kMlaKeyDim + i]);
    };
    double mx = -1e300;
    for (int p = 0; p < context; ++p) {
      double dot = 0;
      for (int i = 0; i < kMlaKeyDim; ++i) dot += double(pagoda::bf16_to_f32(qv[i])) * value(p, i);
      sc[p] = dot * scale;
      mx = std::max(mx, sc[p]);
    }
    double sum = 0;
    for (auto& s : sc) sum += (s = std::exp(s - mx));
    for (int i = 0; i < kMlaLatentDim; ++i) {
      double o = 0;
      for (int p = 0; p < context; ++p) o += sc[p] * value(p, i);
      o /= sum;
      den += o * o;
      for (size_t k = 0; k < timed.size(); ++k) {
        const double g = pagoda::bf16_to_f32(timed[k].out[size_t(h) * kMlaLatentDim + i]);
        num[k] += (g - o) * (g - o);
      }
    }
  }
  const double bytes = double(batch) * context * (flash ? double(record_bytes) : fp8 ? kMlaKeyDim + 4 : 2 * kMlaKeyDim);
  const double flops = 2.0 * batch * context * heads * double(kMlaKeyDim + kMlaLatentDim);
  for (void* p : {d_codes, d_scales, d_q, d_out}) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::vector<Result> results;
  for (size_t k = 0; k < timed.size(); ++k) {
    const double seconds = timed[k].seconds;
    const std::string full = std::string(name) + " [" + (kernel_choice == "auto" ? "auto: " : "") +
                             kernel_name(timed[k].kernel) + "]" +
                             (timed[k].spread ? " spread" : "") + (timed[k].fused ? " fused" : "") +
                             (timed[k].paired ? " paired" : "");
    Result r{full, bytes / seconds / 1e9, flops / seconds / 1e12, seconds * 1e6, std::sqrt(num[k] / den)};
    // The first TMA variant of the same schedule: the others must match it bit for bit.
    const char* bits = "";
    if (is_tma_kernel(timed[k].kernel))
      for (size_t j = 0; j < k; ++j)
        if (is_tma_kernel(timed[j].kernel) && timed[j].spread == timed[k].spread) {
          bits = timed[j].out == timed[k].out ? "  bits==tma yes" : "  bits==tma NO";
          break;
        }
    std::printf("%-64s %8.1f us %7.0f GB/s %6.0f TFLOP/s  ctas %d x %d segments %d  check %.1e%s\n", full.c_str(),
                r.micros, r.gbps, r.tflops, timed[k].ctas, (heads + 63) / 64, timed[k].segments, r.check, bits);
    std::fflush(stdout);
    results.push_back(r);
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--kernel") && i + 1 < argc &&
             (!std::strcmp(argv[i + 1], "all") || !std::strcmp(argv[i + 1], "auto") ||
              std::any_of(std::begin(kKernels), std::end(kKernels),
                          [&](MlaDecodeKernel k) { return !std::strcmp(argv[i + 1], kernel_name(k)); })))
      kernel_choice = argv[++i];
    else if (!std::strcmp(argv[i], "--schedule") && i + 1 < argc &&
             (!std::strcmp(argv[i + 1], "all") || !std::strcmp(argv[i + 1], "whole") ||
              !std::strcmp(argv[i + 1], "spread")))
      schedule_choice = argv[++i];
    else if (!std::strcmp(argv[i], "--timing") && i + 1 < argc &&
             (!std::strcmp(argv[i + 1], "busy") || !std::strcmp(argv[i + 1], "idle") ||
              !std::strcmp(argv[i + 1], "spin")))
      timing_choice = argv[++i];
    else if (!std::strcmp(argv[i], "--merge") && i + 1 < argc &&
             (!std::strcmp(argv[i + 1], "plain") || !std::strcmp(argv[i + 1], "pdl") ||
              !std::strcmp(argv[i + 1], "none") || !std::strcmp(argv[i + 1], "fused") ||
              !std::strcmp(argv[i + 1], "fused_global"))) {
      programmatic_merge = !std::strcmp(argv[i + 1], "pdl");
      merge_mode = !std::strcmp(argv[i + 1], "fused")          ? MlaMergeMode::kFused
                   : !std::strcmp(argv[i + 1], "fused_global") ? MlaMergeMode::kFusedGlobal
                                                                : MlaMergeMode::kPass;
      decode_only = !std::strcmp(argv[++i], "none");
    } else if (!std::strcmp(argv[i], "--pages") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "token") || !std::strcmp(argv[i + 1], "swizzled"))) {
      swizzled_pages = !std::strcmp(argv[++i], "swizzled");
    }
    else {
      std::fprintf(stderr,
                   "usage: mla_decode_bench [--iters N] [--only SUBSTRING] [--kernel all|auto|cp_async|tma|"
                   "tma_tile|tma_pair|tma_pair_tile|tma_pingpong|tma_fast_exp|"
                   "tma_pingpong_fast_exp|tma_pingpong_turns|tma_pingpong_2chain|tma_pingpong_all|tma_pingpong_split|"
                   "tma_pingpong_split_2chain|tma_fp8|bulk_pingpong_2chain] "
                   "[--schedule all|whole|spread] [--timing busy|idle|spin] "
                   "[--merge plain|pdl|none|fused|fused_global] [--pages token|swizzled]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  CHECK_CUDA(query_attention_device_info(0, &bench_device));
  CHECK_CUDA(prepare_mla_decode_kernels());
  std::printf("device %s, %d SMs, peak DRAM %.0f GB/s; merge %s; timing %s\n", prop.name, prop.multiProcessorCount,
              bench_device.peak_dram_gbps,
              decode_only                                ? "none (TMA main pass alone)"
              : programmatic_merge                         ? "pdl"
              : merge_mode == MlaMergeMode::kFused         ? "fused (folded where it can be; by cluster pairs "
                                                             "where the plan pairs)"
              : merge_mode == MlaMergeMode::kFusedGlobal ? "fused_global (folded, through counters only)"
                                                         : "plain",
              timing_choice == "busy"   ? "busy (a 256 MB memset ahead of each start event: GPU time only, cold L2)"
              : timing_choice == "spin" ? "spin (a 50 us memory-free kernel ahead of each start event: GPU time only)"
                                        : "idle (the start event on an idle GPU: host launch work inside the window)");
  for (MlaDecodeKernel k : kKernels) {
    int ctas = 0;
    if (is_tma_kernel(k) && mla_decode_tma_occupancy(k, &ctas) == cudaSuccess)
      std::printf("occupancy %s: %d CTA(s) per SM\n", kernel_name(k), ctas);
  }
  const double ceiling = copy_ceiling();
  std::printf("HBM copy ceiling (read + write): %.0f GB/s\n", ceiling);
  struct Shape {
    int batch, context, heads;
    bool fp8;
    int block_size;
    bool flash = false;
  };
  std::vector<Shape> shapes;
  for (int heads : {16, 128})
    for (bool fp8 : {false, true}) {
      shapes.push_back({64, 4096, heads, fp8, 64});
      shapes.push_back({8, 32768, heads, fp8, 64});
    }
  shapes.push_back({64, 4096, 16, false, 32});
  shapes.push_back({64, 4096, 16, false, 16});
  shapes.push_back({64, 4096, 16, true, 16});
  for (int heads : {16, 128}) {
    for (int bs : {64, 16}) shapes.push_back({64, 4096, heads, true, bs, true});
    shapes.push_back({8, 32768, heads, true, 64, true});
  }
  std::vector<Result> results;
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (const auto& s : shapes) {
    char name[128];
    std::snprintf(name, sizeof(name), "mla decode %s H=%d B=%d L=%d bs=%d", s.flash ? "fp8-656" : s.fp8 ? "fp8" : "bf16",
                  s.heads, s.batch, s.context, s.block_size);
    if (!only.empty() && std::string(name).find(only) == std::string::npos) continue;
    for (auto& r : run_shape(s.batch, s.context, s.heads, s.fp8, s.block_size, prop.multiProcessorCount, seed++, s.flash))
      results.push_back(std::move(r));
  }
  std::printf("\n| figure | us | GB/s | TFLOP/s | check (rel L2) |\n|---|---|---|---|---|\n");
  for (const auto& r : results)
    std::printf("| %s | %.1f | %.0f | %.0f | %.1e |\n", r.name.c_str(), r.micros, r.gbps, r.tflops, r.check);
  std::printf("| HBM copy ceiling | | %.0f | | |\n", ceiling);
  return 0;
}
