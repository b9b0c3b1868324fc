// mla_load_probe: how fast can the MLA decode kernel's loading pattern stream the
// paged latent, as a function of the compute time a tile costs its warpgroup?
//
// The kernel (mla_decode_tma.cu, tma_pingpong_*) streams 64-token tiles of the
// bf16 latent (9 column blocks of 64 rows x 128 B, one tensor-map box each) into
// shared memory, and two compute warpgroups own alternate tiles. This probe keeps
// that loading pattern (the same tensor map, boxes, swizzle, L2 hint and
// barriers) and replaces the math by a spin of a chosen number of cycles a tile
// (split as the real tile is: S^T over the column blocks as they land, softmax,
// P V), so one H200 run says
//   - the pattern's own ceiling (no compute),
//   - how much compute a tile can afford before bandwidth drops,
//   - what the alternatives buy at the compute the real kernel has: more slots
//     (a partial or whole third stage), the owning group refilling its own
//     slots instead of a producer warp ("self"), releasing the first half of V
//     halfway through P V, all 132 SMs instead of 128, tiles prefetched into
//     L2 a few tiles ahead ("L2 +d"), whole pages as 1-D bulk copies ("bulk"),
//     and plain loads of the same pages (the read ceiling).
// Timing as mla_decode_bench --timing spin: a memory-free kernel ahead of each
// start event, 20 launches a point, medians. Output: one line a point.
//
//   mla_load_probe [--tokens 262144] [--iters 20] [--cycles "0 1000 ..."] [--sequential]
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_spin.h"
#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/prefill_sm90_sync.cuh"

namespace {

using namespace pagoda::kernels::cuda::device;

constexpr int kColumnBlocks = 9;
constexpr int kTileRows = 64;
constexpr int kBlockBytes = kTileRows * 128;  // one column block of a tile
constexpr int kGroupThreads = 128;
constexpr int kThreads = 2 * kGroupThreads + 32;  // two "compute" warpgroups + a producer warp

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    const cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

__device__ __forceinline__ uint64_t evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void load_box(void* dst, const CUtensorMap* map, int cb, int row, uint64_t* bar,
                                         uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%2, %3, %4}], [%5], %6;\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(cb), "r"(row), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

// Asks the copy engine to bring one box into L2 only (no shared memory, no
// barrier): a later load_box of it then reads L2 instead of HBM.
__device__ __forceinline__ void prefetch_box_l2(const CUtensorMap* map, int cb, int row) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(0), "r"(cb), "r"(row)
               : "memory");
}

// Busy-waits `cycles` SM clocks (the stand-in for a stretch of a tile's math).
__device__ __forceinline__ void spin_cycles(int cycles) {
  if (cycles <= 0) return;
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

struct Work {
  const int* pages;       // tile i of the pool walk is page pages[i] (64 slots from pages[i] * 64)
  const int* cta_begin;   // [ctas + 1]: CTA b walks tiles [cta_begin[b], cta_begin[b + 1])
  int cycles_s;           // a tile's S^T, spread over its 9 column blocks as they land
  int cycles_softmax;
  int cycles_pv;
  // The column-block ring over swizzled pages (kPieceRows > 0): the pool as pages of kPieceRows tokens laid
  // out as runtime/mla_latent_layout.h's swizzled pages; tile i's k-th piece is page blocks[i * (64 /
  // kPieceRows) + k] (a shuffle at page granularity, as an engine's block tables scatter pages).
  const uint8_t* pool = nullptr;
  const int* blocks = nullptr;
};

// What both probes' CTAs start with: the shared-memory ring of `slots` buffers
// of `slot_bytes` on a 1,024-byte boundary (the 128-byte swizzle's atom), then
// a "full" (one arrival + transaction bytes) and an "empty" (one arrival from
// each of the 4 warps of the group that read the use) mbarrier a slot,
// initialized by thread 0 before the CTA barrier; the CTA's tiles [begin,
// begin + count) of the walk; the L2 evict-first policy of the copies.
struct ProbeCta {
  uint8_t* slots;
  uint64_t* full;
  uint64_t* empty;
  int begin, count;
  uint64_t policy;
};
__device__ ProbeCta start_cta(uint8_t* smem_raw, const Work& w, int slots, int slot_bytes) {
  ProbeCta c;
  c.slots = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  c.full = reinterpret_cast<uint64_t*>(c.slots + slots * slot_bytes);
  c.empty = c.full + slots;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) {
      mbarrier_init(&c.full[i], 1);
      mbarrier_init(&c.empty[i], 4);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  c.begin = w.cta_begin[blockIdx.x];
  c.count = w.cta_begin[blockIdx.x + 1] - c.begin;
  c.policy = evict_first();
  return c;
}

// kSlots: the ring of column-block slots (tile n's column block c in slot
// (9 n + c) % kSlots); 18 = two stages (one a group, as the real kernel), 27 =
// three whole stages. kSelf: no producer warp; the group owning tile n issues
// tile n + 2's boxes into the slots it has just freed (kSlots must be 18).
// kHalfPv: V's column blocks 0-3 are released halfway through P V.
// kL2Ahead > 0: before tile n's boxes, the producer prefetches tile n + kL2Ahead
// into L2 (its 9 boxes, one lane each), so HBM keeps streaming while every slot
// is held by the groups' math: deeper buffering without shared memory.
// kPieceRows > 0: the producer fills a column block's slot from swizzled pages of kPieceRows tokens (the
// planned bulk-copy decode kernel, docs/MLA_SWIZZLED_PAGES.md stage 0): 64 / kPieceRows 1-D bulk copies of
// kPieceRows x 128 B, one a lane, each already in the slot's swizzled layout (no tensor map).
template <int kSlots, bool kSelf, bool kHalfPv, int kL2Ahead = 0, int kPieceRows = 0>
__global__ void __launch_bounds__(kThreads, 1) probe_kernel(const Work w, const __grid_constant__ CUtensorMap map) {
  static_assert(!kSelf || kSlots == 2 * kColumnBlocks, "self-refill keeps one stage a group");
  static_assert(kPieceRows == 0 || (!kSelf && kL2Ahead == 0 && kTileRows % (kPieceRows > 0 ? kPieceRows : 1) == 0 && kPieceRows % 8 == 0),
                "bulk pieces: producer warp only, whole 8-row swizzle atoms");
  extern __shared__ uint8_t smem_raw[];
  const ProbeCta c = start_cta(smem_raw, w, kSlots, kBlockBytes);
  const int tid = threadIdx.x;
  const int lane = tid & 31;

  // Issue tile n's column block cb (one thread).
  auto issue = [&](int n, int cb) {
    const int slot = (n * kColumnBlocks + cb) % kSlots;
    mbarrier_arrive_expect_tx(&c.full[slot], kBlockBytes);
    load_box(c.slots + slot * kBlockBytes, &map, cb, w.pages[c.begin + n] * kTileRows, &c.full[slot], c.policy);
  };

  if (tid >= 2 * kGroupThreads) {
    if (kSelf) return;
    // Producer warp: every column block in order, each once its slot's last use is released.
    int next = 0;
    for (int n = 0; n < c.count; ++n) {
      if (kL2Ahead > 0 && n + kL2Ahead < c.count && lane < kColumnBlocks)
        prefetch_box_l2(&map, lane, w.pages[c.begin + n + kL2Ahead] * kTileRows);
      for (int cb = 0; cb < kColumnBlocks; ++cb, ++next) {
        const int slot = next % kSlots;
        const int use = next / kSlots;
        if (use > 0) mbarrier_wait(&c.empty[slot], (use - 1) & 1);
        if constexpr (kPieceRows > 0) {
          constexpr int kPieces = kTileRows / kPieceRows;
          constexpr uint32_t kPieceBytes = kPieceRows * 128;
          if (lane == 0) mbarrier_arrive_expect_tx(&c.full[slot], kBlockBytes);
          __syncwarp();
          for (int k = lane; k < kPieces; k += 32) {
            const uint8_t* src = w.pool + int64_t{w.blocks[(c.begin + n) * kPieces + k]} * kPieceRows * 1152 +
                                 cb * kPieceBytes;
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
                "[%3], %4;\n" ::"r"(smem_address(c.slots + slot * kBlockBytes + k * kPieceBytes)),
                "l"(src), "r"(kPieceBytes), "r"(smem_address(&c.full[slot])), "l"(c.policy)
                : "memory");
          }
        } else if (lane == 0) {
          issue(n, cb);
        }
        __syncwarp();
      }
    }
    return;
  }

  const int g = tid / kGroupThreads;
  const bool leader = (tid & (kGroupThreads - 1)) == 0;
  if (kSelf && leader) {
    // This group's first tile (n = g).
    if (g < c.count)
      for (int cb = 0; cb < kColumnBlocks; ++cb) issue(g, cb);
  }
  auto release = [&](int n, int cb) {
    __syncwarp();
    if (kSelf) {
      // One stage a group: the group's threads are the only readers of the
      // slot, so once all 4 warps are past it (a group barrier) its leader refills.
      return;
    }
    if (lane == 0) mbarrier_arrive(&c.empty[(n * kColumnBlocks + cb) % kSlots]);
  };
  auto group_sync_and_refill = [&](int n, int cb_from, int cb_to) {
    named_barrier_sync(1 + g, kGroupThreads);
    if (leader && n + 2 < c.count)
      for (int cb = cb_from; cb < cb_to; ++cb) issue(n + 2, cb);
  };
  for (int n = g; n < c.count; n += 2) {
    const int first = n * kColumnBlocks;
    for (int cb = 0; cb < kColumnBlocks; ++cb) {
      const int slot = (first + cb) % kSlots;
      mbarrier_wait(&c.full[slot], ((first + cb) / kSlots) & 1);
      spin_cycles(w.cycles_s / kColumnBlocks);
    }
    // The rope block is read by S^T only.
    if (kSelf) group_sync_and_refill(n, 8, 9);
    else release(n, 8);
    spin_cycles(w.cycles_softmax);
    if (kHalfPv) {
      spin_cycles(w.cycles_pv / 2);
      if (kSelf) group_sync_and_refill(n, 0, 4);
      else
        for (int cb = 0; cb < 4; ++cb) release(n, cb);
      spin_cycles(w.cycles_pv - w.cycles_pv / 2);
      if (kSelf) group_sync_and_refill(n, 4, 8);
      else
        for (int cb = 4; cb < 8; ++cb) release(n, cb);
    } else {
      spin_cycles(w.cycles_pv);
      if (kSelf) group_sync_and_refill(n, 0, 8);
      else
        for (int cb = 0; cb < 8; ++cb) release(n, cb);
    }
  }
}

// The same walk with another copy shape: a tile's page (64 tokens x 1,152 B,
// contiguous in the pool) as kCopies 1-D bulk copies (cp.async.bulk, no tensor
// map, no swizzle) of equal contiguous chunks into a whole-tile stage: 1 (the
// page at once), 9 (8 KB each, a column block's bytes but contiguous) or 64
// (one token each). kStages whole tiles of 73,728 B (3 fits the probe's shared
// memory, not the real kernel's). The groups own alternate tiles as above; a
// tile is waited for whole, then the spin, then the stage is released.
constexpr int kTileBytes = kColumnBlocks * kBlockBytes;
template <int kStages, int kCopies>
__global__ void __launch_bounds__(kThreads, 1) bulk_probe_kernel(const Work w, const uint8_t* __restrict__ pool) {
  static_assert(kTileBytes % kCopies == 0 && (kTileBytes / kCopies) % 16 == 0, "chunks of 16-byte multiples");
  extern __shared__ uint8_t smem_raw[];
  const ProbeCta c = start_cta(smem_raw, w, kStages, kTileBytes);
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  constexpr uint32_t kChunk = kTileBytes / kCopies;
  if (tid >= 2 * kGroupThreads) {
    for (int n = 0; n < c.count; ++n) {
      const int stage = n % kStages, use = n / kStages;
      if (use > 0) mbarrier_wait(&c.empty[stage], (use - 1) & 1);
      if (lane == 0) mbarrier_arrive_expect_tx(&c.full[stage], kTileBytes);
      __syncwarp();
      const uint8_t* page = pool + int64_t{w.pages[c.begin + n]} * kTileBytes;
      for (int k = lane; k < kCopies; k += 32)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
            "%4;\n" ::"r"(smem_address(c.slots + stage * kTileBytes + k * kChunk)),
            "l"(page + k * kChunk), "r"(kChunk), "r"(smem_address(&c.full[stage])), "l"(c.policy)
            : "memory");
      __syncwarp();
    }
    return;
  }
  const int g = tid / kGroupThreads;
  for (int n = g; n < c.count; n += 2) {
    const int stage = n % kStages;
    mbarrier_wait(&c.full[stage], (n / kStages) & 1);
    spin_cycles(w.cycles_s + w.cycles_softmax + w.cycles_pv);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&c.empty[stage]);
  }
}

// The read ceiling of the same walk without shared memory: each CTA streams its
// pages with 16-byte loads that skip L1 (as the GEMV's weights), 4 CTAs of 256
// threads an SM; the sum keeps the loads alive.
__global__ void __launch_bounds__(256) read_probe_kernel(const Work w, const uint8_t* __restrict__ pool,
                                                         uint32_t* sink) {
  const int begin = w.cta_begin[blockIdx.x];
  const int count = w.cta_begin[blockIdx.x + 1] - begin;
  uint32_t acc = 0;
  constexpr int kVectors = kTileBytes / 16;
  for (int n = 0; n < count; ++n) {
    const uint4* page = reinterpret_cast<const uint4*>(pool + int64_t{w.pages[begin + n]} * kTileBytes);
    uint4 v[(kVectors + 255) / 256];
#pragma unroll
    for (int i = 0; i < (kVectors + 255) / 256; ++i) {
      const int at = i * 256 + threadIdx.x;
      if (at < kVectors)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w)
                     : "l"(page + at));
      else
        v[i] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < (kVectors + 255) / 256; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

template <int kSlots>
constexpr int smem_bytes() {
  return kSlots * kBlockBytes + 2 * kSlots * 8 + 1024;
}

using Launch = void (*)(const Work&, const CUtensorMap&, const uint8_t* pool, int ctas);

template <int kSlots, bool kSelf, bool kHalfPv, int kL2Ahead = 0, int kPieceRows = 0>
void launch(const Work& w, const CUtensorMap& map, const uint8_t*, int ctas) {
  static bool configured = false;
  if (!configured) {
    CHECK_CUDA(cudaFuncSetAttribute(probe_kernel<kSlots, kSelf, kHalfPv, kL2Ahead, kPieceRows>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<kSlots>()));
    configured = true;
  }
  probe_kernel<kSlots, kSelf, kHalfPv, kL2Ahead, kPieceRows><<<ctas, kThreads, smem_bytes<kSlots>()>>>(w, map);
}

template <int kStages, int kCopies>
void launch_bulk(const Work& w, const CUtensorMap&, const uint8_t* pool, int ctas) {
  constexpr int bytes = kStages * kTileBytes + 2 * kStages * 8 + 1024;
  static bool configured = false;
  if (!configured) {
    CHECK_CUDA(cudaFuncSetAttribute(bulk_probe_kernel<kStages, kCopies>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    bytes));
    configured = true;
  }
  bulk_probe_kernel<kStages, kCopies><<<ctas, kThreads, bytes>>>(w, pool);
}

struct Variant {
  const char* name;
  Launch fn;
};

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// GB/s of `bytes` read by `launch`, the median of `iters` event-timed runs (after
// two warm-ups), each behind a 50 us memory-free kernel (mla_decode_bench's --timing spin).
template <typename Launch>
double median_gbps(int iters, size_t bytes, cudaEvent_t start, cudaEvent_t stop, Launch&& launch) {
  std::vector<float> ms;
  for (int it = 0; it < iters + 2; ++it) {
    CHECK_CUDA(spin_gpu(50.0, nullptr));
    CHECK_CUDA(cudaEventRecord(start));
    launch();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (it >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

// CTA b walks tiles [begin[b], begin[b + 1]) of `pages`: an even split, on the device.
int* device_cta_begin(int pages, int ctas) {
  std::vector<int> cta_begin(ctas + 1);
  for (int b = 0; b <= ctas; ++b) cta_begin[b] = int(int64_t{pages} * b / ctas);
  int* d_begin = nullptr;
  CHECK_CUDA(cudaMalloc(&d_begin, cta_begin.size() * sizeof(int)));
  CHECK_CUDA(cudaMemcpy(d_begin, cta_begin.data(), cta_begin.size() * sizeof(int), cudaMemcpyHostToDevice));
  return d_begin;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 262144;  // 64 x 4K
  int iters = 20;
  bool sequential = false;
  std::string only;  // run the variants whose name contains it
  std::vector<int> cycle_points = {0, 1000, 2000, 3000, 4000, 5000, 6000};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--sequential")) sequential = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--cycles") && i + 1 < argc) {
      cycle_points.clear();
      std::istringstream in(argv[++i]);
      for (int c; in >> c;) cycle_points.push_back(c);
    } else {
      std::fprintf(stderr, "usage: %s [--tokens N] [--iters N] [--cycles \"0 1000 ...\"] [--sequential] [--only NAME]\n", argv[0]);
      return 2;
    }
  }
  const int pages = int(tokens / kTileRows);
  const size_t pool_bytes = size_t(pages) * kTileRows * 576 * sizeof(__nv_bfloat16);
  void* pool = nullptr;
  CHECK_CUDA(cudaMalloc(&pool, pool_bytes));
  CHECK_CUDA(cudaMemset(pool, 0x3c, pool_bytes));
  std::vector<int> order(pages);
  for (int i = 0; i < pages; ++i) order[i] = i;
  if (!sequential) std::shuffle(order.begin(), order.end(), std::mt19937(7));
  int* d_pages = nullptr;
  CHECK_CUDA(cudaMalloc(&d_pages, pages * sizeof(int)));
  CHECK_CUDA(cudaMemcpy(d_pages, order.data(), pages * sizeof(int), cudaMemcpyHostToDevice));
  // The ring variants' page tables, one a page size: every page of `rows` tokens once, shuffled (or in order).
  auto device_blocks = [&](int rows) {
    std::vector<int> blocks(size_t(pages) * (kTileRows / rows));
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = int(i);
    if (!sequential) std::shuffle(blocks.begin(), blocks.end(), std::mt19937(11));
    int* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, blocks.size() * sizeof(int)));
    CHECK_CUDA(cudaMemcpy(d, blocks.data(), blocks.size() * sizeof(int), cudaMemcpyHostToDevice));
    return d;
  };
  const int* d_blocks64 = device_blocks(64);
  const int* d_blocks16 = device_blocks(16);
  const int* d_blocks8 = device_blocks(8);

  CUtensorMap map;
  const cuuint64_t dims[3] = {64, kColumnBlocks, cuuint64_t(int64_t{pages} * kTileRows)};
  const cuuint64_t strides[2] = {64 * sizeof(__nv_bfloat16), 576 * sizeof(__nv_bfloat16)};
  const cuuint32_t box[3] = {64, 1, kTileRows};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  if (encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, pool, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "tensor map encode failed\n");
    return 1;
  }

  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Variant variants[] = {
      {"producer 18 slots", launch<18, false, false>}, {"producer 18, half PV", launch<18, false, true>},
      {"producer 22 slots", launch<22, false, false>}, {"producer 25 slots", launch<25, false, false>},
      {"producer 27 slots", launch<27, false, false>}, {"self 18", launch<18, true, false>},
      {"self 18, half PV", launch<18, true, true>},
      {"producer 18, L2 +2 tiles", launch<18, false, false, 2>}, {"producer 18, L2 +3 tiles", launch<18, false, false, 3>},
      {"producer 18, L2 +4 tiles", launch<18, false, false, 4>},
      {"bulk 2 stages x 1 copy", launch_bulk<2, 1>}, {"bulk 2 stages x 9 copies", launch_bulk<2, 9>},
      {"bulk 2 stages x 64 copies", launch_bulk<2, 64>}, {"bulk 3 stages x 1 copy", launch_bulk<3, 1>},
      {"bulk 3 stages x 9 copies", launch_bulk<3, 9>},
      {"ring 18, pages of 64", launch<18, false, false, 0, 64>},
      {"ring 18, pages of 16", launch<18, false, false, 0, 16>},
      {"ring 18, pages of 8", launch<18, false, false, 0, 8>},
  };
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::printf("pool %d pages of 64 x 576 bf16 (%.1f MB), %s order, %d SMs, %d launches a point (medians)\n", pages,
              pool_bytes / 1e6, sequential ? "sequential" : "shuffled", sms, iters);
  for (const int ctas : {128, sms}) {
    int* d_begin = device_cta_begin(pages, ctas);
    for (const Variant& v : variants) {
      if (!only.empty() && std::string(v.name).find(only) == std::string::npos) continue;
      std::printf("%3d CTAs  %-22s", ctas, v.name);
      for (const int c : cycle_points) {
        // S^T 45%, softmax 15%, P V 40% of a tile's math (the real kernel's MMA split, roughly).
        const std::string name = v.name;
        const int* blocks = name.find("pages of 64") != std::string::npos   ? d_blocks64
                            : name.find("pages of 16") != std::string::npos ? d_blocks16
                                                                            : d_blocks8;
        const Work w{d_pages, d_begin, c * 45 / 100, c * 15 / 100, c - c * 45 / 100 - c * 15 / 100,
                     static_cast<const uint8_t*>(pool), blocks};
        std::printf("  %5d:%5.0f", c, median_gbps(iters, pool_bytes, start, stop, [&] {
                      v.fn(w, map, static_cast<const uint8_t*>(pool), ctas);
                    }));
      }
      std::printf("   (cycles a tile: GB/s)\n");
      std::fflush(stdout);
    }
    CHECK_CUDA(cudaFree(d_begin));
  }
  // The read ceiling: the same pages, plain 16-byte loads, 4 CTAs an SM.
  {
    const int ctas = 4 * sms;
    int* d_begin = device_cta_begin(pages, ctas);
    uint32_t* d_sink = nullptr;
    CHECK_CUDA(cudaMalloc(&d_sink, sizeof(uint32_t)));
    const Work w{d_pages, d_begin, 0, 0, 0};
    std::printf("%3d CTAs  %-22s  %5.0f GB/s (plain 16-byte loads, no shared memory)\n", ctas, "read ceiling",
                median_gbps(iters, pool_bytes, start, stop, [&] {
                  read_probe_kernel<<<ctas, 256>>>(w, static_cast<const uint8_t*>(pool), d_sink);
                }));
    CHECK_CUDA(cudaFree(d_begin));
    CHECK_CUDA(cudaFree(d_sink));
  }
  CHECK_CUDA(cudaGetLastError());
  return 0;
}
