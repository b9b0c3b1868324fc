// MlaDecodePlan: validation, the segment schedule and the arena (mla_decode.h).
//
// Schedule. The kernel's unit of KV is a tile of 64 positions; a CTA runs a
// list of segments (row, [kv_begin, kv_end)) one after the other, each costing
// its tiles plus about one tile of overhead (loading the row's query, the
// epilogue). The automatic plan spreads the rows' tiles evenly over one wave
// (num_sms / head_tiles CTAs per head tile, one CTA per SM: the kernels hold
// ~190-226 KB of shared memory; twice that many for kTmaPair / kTmaPairTile,
// which hold 112 KB so that two share an SM), cutting rows at tile boundaries where a CTA's
// share ends, so a batch of few long rows and one of many short rows both
// fill the GPU without a second, mostly idle wave.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "pagoda/backend/cuda/attention/mla_decode.h"

namespace pagoda::kernels::cuda {
namespace {

constexpr int32_t kTile = 64;          // positions per kernel tile
constexpr int32_t kHeadTile = 64;      // heads per CTA
constexpr int64_t kSegmentOverhead = 1;  // tiles' worth of time a segment costs beyond its tiles
constexpr int64_t kMinSegmentTiles = 2;  // a CTA's leftover share smaller than this goes to the next CTA
// A segment's overhead in quarter tiles under spread budgets: its Q (18 KB, a
// quarter of a tile's bytes) and epilogue, the next segment's tiles already
// streaming (a guess to be measured against kSegmentOverhead's whole tile).
constexpr int64_t kSpreadSegmentOverhead = 1;

// PAGODA_MLA_DECODE_KERNEL, read once: "tma", "tma_tile",
// "tma_pair", "tma_pair_tile", "tma_pingpong",
// "tma_fast_exp", "tma_pingpong_fast_exp", "tma_pingpong_turns", "tma_pingpong_2chain",
// "tma_pingpong_all", "tma_pingpong_split", "tma_pingpong_split_2chain", "tma_fp8", "bulk_pingpong_2chain",
// "cp_async" or
// "auto" (unset or empty: auto); anything else is reported at plan creation.
const char* environment_kernel() {
  static const char* value = [] {
    const char* v = std::getenv("PAGODA_MLA_DECODE_KERNEL");
    return v == nullptr ? "" : v;
  }();
  return value;
}

// PAGODA_MLA_MERGE, read once: "pass", "fused", or unset / empty (fused).
const char* environment_merge() {
  static const char* value = [] {
    const char* v = std::getenv("PAGODA_MLA_MERGE");
    return v == nullptr ? "" : v;
  }();
  return value;
}

// Whether every split row is two segments that are the only segments of CTAs
// 2i and 2i + 1, in that order, over an even number of CTAs: the plans whose
// merge the CTA pairs of a cluster can fold (mla_decode_pair.cuh). Rows of one
// segment may lie anywhere.
bool rows_split_in_pairs(const std::vector<int32_t>& row_start, const std::vector<int32_t>& cta_start) {
  const size_t ctas = cta_start.size() - 1;
  if (ctas % 2 != 0) return false;
  bool any = false;
  for (size_t r = 0; r + 1 < row_start.size(); ++r) {
    const int32_t first = row_start[r], count = row_start[r + 1] - first;
    if (count < 2) continue;
    if (count != 2) return false;
    const auto at = std::lower_bound(cta_start.begin(), cta_start.end(), first);
    if (at == cta_start.end() || *at != first) return false;  // the segment is not its CTA's first
    const size_t cta = size_t(at - cta_start.begin());
    if (cta % 2 != 0 || cta + 2 > ctas || cta_start[cta + 1] != first + 1 || cta_start[cta + 2] != first + 2)
      return false;
    any = true;
  }
  return any;
}

// Where the TMA kernel applies: bf16 token-major rows (its tensor map's boxes
// read rows of 1,152 bytes; swizzled pages take the cp.async kernels), one
// narrow head tile, and pages that a 64-position tile either divides into
// boxes of >= 8 rows (1 KB, so each box starts on a 128-byte-swizzle atom) or
// lies within.
// kTmaFp8: FlashMLA's fp8 records, one narrow head tile, pages that a slot of
// 16 positions either lies within or divides into whole pages.
bool tma_fp8_applies(const MlaDecodeConfig& c) {
  return c.latent_element == KvElement::kFP8E4M3 && c.latent_layout == MlaLatentLayout::kFlashMla656 &&
         c.num_heads <= 16 && (c.block_size % 16 == 0 || 16 % c.block_size == 0);
}
bool tma_applies(const MlaDecodeConfig& c, MlaDecodeKernel k) {
  if (k == MlaDecodeKernel::kTmaFp8) return tma_fp8_applies(c);
  if (k == MlaDecodeKernel::kBulkPingPongTwoChains)  // byte offsets in 64 bits: no slot-count limit
    return c.latent_element == KvElement::kBF16 && c.latent_layout == MlaLatentLayout::kBf16SwizzledPages &&
           c.num_heads <= 16 && mla_tile_pieces_fit(c.block_size);
  return c.latent_element == KvElement::kBF16 && c.latent_layout == MlaLatentLayout::kPerVectorScale &&
         c.num_heads <= 16 && int64_t{c.num_blocks} * c.block_size < (int64_t{1} << 31) &&
         mla_tile_pieces_fit(c.block_size);
}

// The automatic choice: a TMA kernel where it applies and was measured
// faster than cp.async (pages of a multiple of 64 positions: one box a column
// block of a tile; at blocks of 16 it measured no faster, docs/BENCHMARKS.md),
// kTmaFp8 for FlashMLA fp8 records (below), else the cp.async kernels (per-vector
// fp8 latents, more than 16 heads, other block sizes).
// The TMA kernel taken: the ping-pong kernel with two S^T chains and the
// mbarrier hand-over (docs/KERNELS.md v14: clean under racecheck and synccheck,
// and the fastest of the clean kernels, ahead of kTma and of the split kernels
// without a hand-over).
constexpr MlaDecodeKernel kAutomaticTmaKernel = MlaDecodeKernel::kTmaPingPongTwoChains;
// FlashMLA fp8 records take kTmaFp8 at pages of a multiple of 16 positions
// (one bulk copy a slot): ~1.45x the cp.async path's GB/s at blocks of 64 and
// 16, clean under racecheck and synccheck, and since its slots have barriers
// per group (docs/KERNELS.md v17) the V2-Lite-shaped engine run that failed
// with CUDA error 719 passes (docs/BENCHMARKS.md, "MLA decode v17"). Pages
// that divide 16 (several copies a slot) were not measured and stay on cp.async.
// Swizzled bf16 pages take the bulk-copy kernel (kTmaPingPongTwoChains' bits, one
// cp.async.bulk a page and column block) by the same page rule as the tensor-map
// kernel: at pages of 64 it measured at or above the tensor-map kernel on
// token-major pages and ~8% above cp.async on the same pages (H100); at smaller
// pages it was not measured on the H200, where cp.async leads the tensor-map kernel.
// Pages of 16 and 32 positions: which kernel leads depends on the card. On the
// H200 (4.8 TB/s) cp.async led the tensor-map kernel by 6% at pages of 16; on
// the H100 (3.35 TB/s) the tensor-map and bulk kernels lead cp.async by 6-8% at
// pages of 16 and 32 (docs/BENCHMARKS.md, "MLA decode at small pages by card").
// A likely cause is the bytes in flight: a page of 16 rows is a 2 KB box per
// column block, and a faster memory needs more of them outstanding than the
// producer warp's ring keeps, where cp.async's 256 threads keep more. Two cards
// are two data points, so the rule keys on the peak bandwidth between them, and
// an unknown card keeps cp.async (the choice before). Pages of 8 stay cp.async
// (not measured in the real kernel; the load probe lost 14% there).
constexpr double kSmallPagesTmaBelowGbps = 4000.0;
MlaDecodeKernel automatic_kernel(const MlaDecodeConfig& c, const AttentionDeviceInfo& device) {
  if (tma_fp8_applies(c) && c.block_size % 16 == 0) return MlaDecodeKernel::kTmaFp8;
  const MlaDecodeKernel tma = c.latent_layout == MlaLatentLayout::kBf16SwizzledPages
                                  ? MlaDecodeKernel::kBulkPingPongTwoChains
                                  : kAutomaticTmaKernel;
  const bool small_pages_take_tma = (c.block_size == 16 || c.block_size == 32) && device.peak_dram_gbps > 0.0 &&
                                    device.peak_dram_gbps < kSmallPagesTmaBelowGbps;
  return tma_applies(c, tma) && (c.block_size % 64 == 0 || small_pages_take_tma) ? tma : MlaDecodeKernel::kCpAsync;
}

}  // namespace

cudaError_t query_attention_device_info(int device, AttentionDeviceInfo* info) {
  int sms = 0, memory_khz = 0, bus_bits = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  if (e != cudaSuccess) return e;
  info->num_sms = sms;
  // Double data rate: two transfers a clock over bus_bits / 8 bytes.
  info->peak_dram_gbps = 2.0 * double(memory_khz) * 1e3 * double(bus_bits) / 8.0 / 1e9;
  return cudaSuccess;
}

StatusOr<MlaDecodePlan> MlaDecodePlan::create(const MlaDecodeConfig& config, std::span<const MlaDecodeRow> rows,
                                              const AttentionDeviceInfo& device, const MlaDecodeOptions& options) {
  if (config.num_heads < 1 || config.num_heads > 1024)
    return invalid_argument_error("mla decode: num_heads {} must be in [1, 1024]", config.num_heads);
  if (config.block_size < 1) return invalid_argument_error("mla decode: block_size {} must be >= 1", config.block_size);
  if (config.num_blocks < 1)
    return invalid_argument_error("mla decode: num_blocks {} must be positive", config.num_blocks);
  if (!(config.scale > 0.0f) || !std::isfinite(config.scale))
    return invalid_argument_error("mla decode: scale {} must be positive and finite", config.scale);
  if (config.latent_element != KvElement::kBF16 && config.latent_element != KvElement::kFP8E4M3)
    return unimplemented_error("mla decode: latent_element {} (supported: bf16, fp8 e4m3)",
                               static_cast<int>(config.latent_element));
  if (config.latent_layout == MlaLatentLayout::kFlashMla656) {
    if (config.latent_element != KvElement::kFP8E4M3)
      return invalid_argument_error("mla decode: latent_layout flashmla_656 needs latent_element fp8 e4m3, got {}",
                                    static_cast<int>(config.latent_element));
  } else if (config.latent_layout == MlaLatentLayout::kBf16SwizzledPages) {
    if (config.latent_element != KvElement::kBF16)
      return invalid_argument_error("mla decode: latent_layout bf16_swizzled_pages needs latent_element bf16, got {}",
                                    static_cast<int>(config.latent_element));
    if (config.block_size % 8 != 0)
      return invalid_argument_error("mla decode: latent_layout bf16_swizzled_pages needs block_size % 8 == 0, got {}",
                                    config.block_size);
  } else if (config.latent_layout != MlaLatentLayout::kPerVectorScale) {
    return invalid_argument_error("mla decode: latent_layout {} unknown", static_cast<int>(config.latent_layout));
  }
  MlaDecodeKernel kernel = options.kernel;
  if (kernel == MlaDecodeKernel::kDefault) {
    const char* env = environment_kernel();
    if (*env == '\0' || std::strcmp(env, "auto") == 0) kernel = automatic_kernel(config, device);
    else if (std::strcmp(env, "cp_async") == 0) kernel = MlaDecodeKernel::kCpAsync;
    else if (std::strcmp(env, "tma") == 0) kernel = MlaDecodeKernel::kTma;
    else if (std::strcmp(env, "tma_tile") == 0) kernel = MlaDecodeKernel::kTmaTile;
    else if (std::strcmp(env, "tma_pair") == 0) kernel = MlaDecodeKernel::kTmaPair;
    else if (std::strcmp(env, "tma_pair_tile") == 0) kernel = MlaDecodeKernel::kTmaPairTile;
    else if (std::strcmp(env, "tma_pingpong") == 0) kernel = MlaDecodeKernel::kTmaPingPong;
    else if (std::strcmp(env, "tma_fast_exp") == 0) kernel = MlaDecodeKernel::kTmaFastExp;
    else if (std::strcmp(env, "tma_pingpong_fast_exp") == 0) kernel = MlaDecodeKernel::kTmaPingPongFastExp;
    else if (std::strcmp(env, "tma_pingpong_turns") == 0) kernel = MlaDecodeKernel::kTmaPingPongTurns;
    else if (std::strcmp(env, "tma_pingpong_2chain") == 0) kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
    else if (std::strcmp(env, "tma_pingpong_all") == 0) kernel = MlaDecodeKernel::kTmaPingPongAll;
    else if (std::strcmp(env, "tma_pingpong_split") == 0) kernel = MlaDecodeKernel::kTmaPingPongSplit;
    else if (std::strcmp(env, "tma_pingpong_split_2chain") == 0) kernel = MlaDecodeKernel::kTmaPingPongSplitTwoChains;
    else if (std::strcmp(env, "tma_fp8") == 0) kernel = MlaDecodeKernel::kTmaFp8;
    else if (std::strcmp(env, "bulk_pingpong_2chain") == 0) kernel = MlaDecodeKernel::kBulkPingPongTwoChains;
    else
      return invalid_argument_error("mla decode: PAGODA_MLA_DECODE_KERNEL '{}' (auto, tma, tma_tile, "
                                    "tma_pair, tma_pair_tile, tma_pingpong, "
                                    "tma_fast_exp, tma_pingpong_fast_exp, tma_pingpong_turns, tma_pingpong_2chain, "
                                    "tma_pingpong_all, tma_pingpong_split, tma_pingpong_split_2chain, tma_fp8, "
                                    "bulk_pingpong_2chain or cp_async)",
                                    env);
  }
  const bool tma = is_tma_kernel(kernel);
  if (kernel != MlaDecodeKernel::kCpAsync && !tma)
    return invalid_argument_error("mla decode: kernel {} unknown", static_cast<int>(options.kernel));
  if (tma && !tma_applies(config, kernel)) kernel = MlaDecodeKernel::kCpAsync;
  if (options.split_tokens < 0)
    return invalid_argument_error("mla decode: split_tokens {} must be >= 0", options.split_tokens);
  if (device.num_sms < 1) return invalid_argument_error("mla decode: num_sms {} must be positive", device.num_sms);
  MlaMergeMode merge = options.merge;
  if (merge == MlaMergeMode::kDefault) {
    const char* env = environment_merge();
    if (std::strcmp(env, "pass") == 0) merge = MlaMergeMode::kPass;
    else if (*env == '\0' || std::strcmp(env, "fused") == 0) merge = MlaMergeMode::kFused;
    else if (std::strcmp(env, "fused_global") == 0) merge = MlaMergeMode::kFusedGlobal;
    else return invalid_argument_error("mla decode: PAGODA_MLA_MERGE '{}' (pass, fused or fused_global)", env);
  } else if (merge != MlaMergeMode::kPass && merge != MlaMergeMode::kFused && merge != MlaMergeMode::kFusedGlobal) {
    return invalid_argument_error("mla decode: merge mode {} unknown", static_cast<int>(merge));
  }
  if (!(device.peak_dram_gbps >= 0.0) || !std::isfinite(device.peak_dram_gbps))
    return invalid_argument_error("mla decode: peak_dram_gbps {} must be >= 0 and finite", device.peak_dram_gbps);
  if (rows.size() > size_t{1} << 24)
    return invalid_argument_error("mla decode: {} rows (at most 16M)", rows.size());
  const bool fixed = options.fixed_rows > 0;
  if (options.fixed_rows < 0)
    return invalid_argument_error("mla decode: fixed_rows {} must be >= 0", options.fixed_rows);
  if (!fixed && options.fixed_block_tables != nullptr)
    return invalid_argument_error("mla decode: fixed_block_tables is for fixed mode (fixed_rows is 0)");
  if (fixed) {
    if (options.split_tokens != 0)
      return invalid_argument_error("mla decode: split_tokens {} with fixed_rows (must be 0)", options.split_tokens);
    if (rows.size() > size_t(options.fixed_rows))
      return invalid_argument_error("mla decode: {} rows, more than fixed_rows {}", rows.size(), options.fixed_rows);
    if (options.fixed_block_table_stride < 1)
      return invalid_argument_error("mla decode: fixed_block_table_stride {} must be >= 1",
                                    options.fixed_block_table_stride);
    if (int64_t{options.fixed_rows} * options.fixed_block_table_stride > int64_t{1} << 30)
      return invalid_argument_error("mla decode: fixed_rows {} x fixed_block_table_stride {} too large",
                                    options.fixed_rows, options.fixed_block_table_stride);
  }

  // Costs in quarter tiles: a tile is 4, a segment's overhead 4 (whole-tile
  // budgets) or 1 (spread budgets, options.spread_budget).
  constexpr int64_t kTileCost = 4;
  const int64_t segment_cost = options.spread_budget ? kSpreadSegmentOverhead : kSegmentOverhead * kTileCost;
  int64_t total_cost = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const MlaDecodeRow& r = rows[i];
    if (r.context_len < 1)
      return invalid_argument_error("mla decode: rows[{}].context_len {} must be >= 1", i, r.context_len);
    const int64_t needed = (int64_t{r.context_len} + config.block_size - 1) / config.block_size;
    if (int64_t(r.block_table.size()) < needed)
      return invalid_argument_error("mla decode: rows[{}].block_table has {} ids, context_len {} needs {}", i,
                                    r.block_table.size(), r.context_len, needed);
    for (int64_t b = 0; b < needed; ++b) {
      const int32_t id = r.block_table[size_t(b)];
      if (id < 0 || id >= config.num_blocks)
        return invalid_argument_error("mla decode: rows[{}].block_table[{}] = {} outside [0, {})", i, b, id,
                                      config.num_blocks);
    }
    if (fixed && needed > options.fixed_block_table_stride)
      return invalid_argument_error("mla decode: rows[{}] needs {} blocks, more than fixed_block_table_stride {}", i,
                                    needed, options.fixed_block_table_stride);
    total_cost += (r.context_len + kTile - 1) / kTile * kTileCost + segment_cost;
  }

  MlaDecodePlan plan;
  plan.config_ = config;
  plan.kernel_ = kernel;
  plan.num_rows_ = int32_t(rows.size());
  const int32_t head_tiles = (config.num_heads + kHeadTile - 1) / kHeadTile;

  // Segments (row, begin, end), rows in order, and where each CTA's list starts.
  std::vector<int32_t> segments, row_start, cta_start;
  row_start.reserve(rows.size() + 1);
  cta_start.push_back(0);
  if (options.split_tokens > 0) {
    const int64_t split = (int64_t{options.split_tokens} + kTile - 1) / kTile * kTile;
    for (size_t i = 0; i < rows.size(); ++i) {
      row_start.push_back(int32_t(segments.size() / 3));
      for (int64_t b = 0; b < rows[i].context_len; b += split) {
        segments.insert(segments.end(),
                        {int32_t(i), int32_t(b), int32_t(std::min<int64_t>(b + split, rows[i].context_len))});
        cta_start.push_back(int32_t(segments.size() / 3));
      }
    }
  } else if (!rows.empty()) {
    // Greedy fill with a per-CTA budget of tiles; a budget that spills past one
    // wave (the overheads of cut rows add up) is raised until it fits. Whole
    // budgets: every CTA the same whole number of tiles (so the rounding can
    // leave SMs idle: 64 x 4K on 132 SMs fills 128). Spread budgets: a total
    // over all CTAs, CTA k getting floor((k + 1) total / ctas) - floor(k total /
    // ctas), so budgets differ by at most a quarter tile and every SM runs.
    const int64_t ctas = std::max<int64_t>(1, int64_t{device.num_sms} * mla_decode_ctas_per_sm(kernel) / head_tiles);
    const int64_t min_budget = kMinSegmentTiles * kTileCost + segment_cost;
    int64_t budget = std::max<int64_t>(min_budget, (total_cost + ctas - 1) / ctas / kTileCost * kTileCost +
                                                       ((total_cost + ctas - 1) / ctas % kTileCost ? kTileCost : 0));
    int64_t spread_total = std::max(min_budget * ctas, total_cost);
    for (;;) {
      segments.clear();
      row_start.clear();
      cta_start.assign(1, 0);
      auto budget_of = [&](int64_t cta) {
        return options.spread_budget ? (cta + 1) * spread_total / ctas - cta * spread_total / ctas : budget;
      };
      int64_t left = budget_of(0);  // of the current CTA
      auto next_cta = [&] {
        if (int32_t(segments.size() / 3) != cta_start.back()) cta_start.push_back(int32_t(segments.size() / 3));
        left = budget_of(int64_t(cta_start.size()) - 1);
      };
      for (size_t i = 0; i < rows.size(); ++i) {
        row_start.push_back(int32_t(segments.size() / 3));
        const int64_t tiles = (rows[i].context_len + kTile - 1) / kTile;
        int64_t done = 0;
        while (done < tiles) {
          const int64_t take = std::min(tiles - done, (left - segment_cost) / kTileCost);
          // A share too small to be worth a segment of its own goes to the next
          // CTA, unless it finishes the row.
          if (take < std::min(kMinSegmentTiles, tiles - done)) {
            next_cta();
            continue;
          }
          segments.insert(segments.end(), {int32_t(i), int32_t(done * kTile),
                                           int32_t(std::min<int64_t>((done + take) * kTile, rows[i].context_len))});
          done += take;
          left -= take * kTileCost + segment_cost;
          if (left < min_budget) next_cta();
        }
      }
      if (int32_t(segments.size() / 3) != cta_start.back()) cta_start.push_back(int32_t(segments.size() / 3));
      if (int64_t(cta_start.size()) - 1 <= ctas) break;
      budget += kTileCost * std::max<int64_t>(1, budget / kTileCost / 64);
      spread_total += std::max<int64_t>(1, spread_total / 512);
    }
  }
  row_start.push_back(int32_t(segments.size() / 3));

  plan.num_segments_ = int32_t(segments.size() / 3);
  plan.num_ctas_ = int32_t(cta_start.size()) - 1;
  for (size_t i = 0; i + 1 < row_start.size(); ++i)
    plan.max_splits_ = std::max(plan.max_splits_, row_start[i + 1] - row_start[i]);
  // The folded merge waits inside the grid for the CTAs of a row, so every CTA must be resident at once: one
  // head tile of at most one CTA per SM (fixed plans: one whole wave).
  const int32_t grid_ctas = fixed ? std::max(1, device.num_sms * mla_decode_ctas_per_sm(kernel) / head_tiles)
                                  : plan.num_ctas_;
  plan.fused_merge_ = merge != MlaMergeMode::kPass && mla_decode_can_fuse_merge(kernel) && head_tiles == 1 &&
                      mla_decode_ctas_per_sm(kernel) == 1 && grid_ctas <= device.num_sms &&
                      (fixed || plan.max_splits_ > 1);
  if (fixed) return lay_out_fixed(std::move(plan), rows, device, options, std::move(segments), std::move(row_start),
                                  std::move(cta_start));
  // Where the split rows pair up on neighbouring CTAs, those pairs trade their records in shared memory
  // (clusters of two) instead of through the counters and the workspace. Fixed plans do not pair: a graph's
  // launch shape outlives the rows it was captured with.
  plan.paired_merge_ = plan.fused_merge_ && merge == MlaMergeMode::kFused && mla_decode_can_pair_merge(kernel) &&
                       rows_split_in_pairs(row_start, cta_start);
  // The merge pass's records: split rows' segments, or every segment's
  // per-group records (kTmaPingPongSplit).
  const size_t partials = size_t(mla_decode_partials_per_segment(kernel));
  if ((plan.max_splits_ > 1 && !plan.paired_merge_) || partials > 1)
    plan.workspace_bytes_ =
        size_t(plan.num_segments_) * partials * size_t(config.num_heads) * (kMlaLatentDim + 1) * sizeof(float);

  // Arena: segments | row starts | CTA starts | merge counters (fused merge) | block table starts | block tables.
  // Rows that share a block table (a prefill's rows of one sequence) share its copy.
  auto& a = plan.arena_;
  a = std::move(segments);
  plan.row_segment_start_at_ = a.size();
  a.insert(a.end(), row_start.begin(), row_start.end());
  plan.cta_segment_start_at_ = a.size();
  a.insert(a.end(), cta_start.begin(), cta_start.end());
  plan.merge_counters_at_ = a.size();
  if (plan.fused_merge_ && !plan.paired_merge_) a.resize(a.size() + 2 * rows.size(), 0);
  plan.block_table_start_at_ = a.size();
  a.resize(a.size() + rows.size());
  plan.block_tables_at_ = a.size();
  auto needed = [&](size_t i) {
    return (size_t(rows[i].context_len) + size_t(config.block_size) - 1) / size_t(config.block_size);
  };
  for (size_t i = 0; i < rows.size();) {
    // Consecutive rows on the same table (by address) share one copy of its longest used prefix.
    size_t end = i + 1, longest = i;
    for (; end < rows.size() && rows[end].block_table.data() == rows[i].block_table.data(); ++end)
      if (needed(end) > needed(longest)) longest = end;
    const int32_t start = int32_t(a.size() - plan.block_tables_at_);
    const auto& src = rows[longest].block_table;
    a.insert(a.end(), src.begin(), src.begin() + ptrdiff_t(needed(longest)));
    for (; i < end; ++i) a[plan.block_table_start_at_ + i] = start;
  }
  if (a.size() > size_t{1} << 31) return invalid_argument_error("mla decode: plan arena of {} entries too large", a.size());
  return plan;
}

// Fixed mode: capacities instead of this plan's counts. A new segment starts
// only with a new row or a new CTA, so rows + CTAs bounds the segments.
MlaDecodePlan MlaDecodePlan::lay_out_fixed(MlaDecodePlan plan, std::span<const MlaDecodeRow> rows,
                                           const AttentionDeviceInfo& device, const MlaDecodeOptions& options,
                                           std::vector<int32_t> segments, std::vector<int32_t> row_start,
                                           std::vector<int32_t> cta_start) {
  const int32_t head_tiles = (plan.config_.num_heads + kHeadTile - 1) / kHeadTile;
  const int32_t ctas =
      int32_t(std::max<int64_t>(1, int64_t{device.num_sms} * mla_decode_ctas_per_sm(plan.kernel_) / head_tiles));
  const int32_t capacity = options.fixed_rows + ctas;
  const int32_t used = int32_t(segments.size() / 3);
  const size_t stride = size_t(options.fixed_block_table_stride);
  plan.num_rows_ = options.fixed_rows;
  plan.num_ctas_ = ctas;
  plan.num_segments_ = capacity;
  plan.max_splits_ = 2;  // the merge always runs (and zeroes padding rows), whatever this step's splits
  plan.workspace_bytes_ = size_t(capacity) * size_t(mla_decode_partials_per_segment(plan.kernel_)) *
                         size_t(plan.config_.num_heads) * (kMlaLatentDim + 1) * sizeof(float);
  const bool external = options.fixed_block_tables != nullptr;
  auto& a = plan.arena_;
  const size_t counters = plan.fused_merge_ ? 2 * size_t(options.fixed_rows) : 0;
  a.assign(size_t(capacity) * 3 + size_t(options.fixed_rows) + 1 + size_t(ctas) + 1 + counters +
               size_t(options.fixed_rows) + (external ? 0 : size_t(options.fixed_rows) * stride),
           0);
  std::copy(segments.begin(), segments.end(), a.begin());
  plan.row_segment_start_at_ = size_t(capacity) * 3;
  std::copy(row_start.begin(), row_start.end(), a.begin() + ptrdiff_t(plan.row_segment_start_at_));
  for (size_t i = row_start.size(); i < size_t(options.fixed_rows) + 1; ++i) a[plan.row_segment_start_at_ + i] = used;
  plan.cta_segment_start_at_ = plan.row_segment_start_at_ + size_t(options.fixed_rows) + 1;
  std::copy(cta_start.begin(), cta_start.end(), a.begin() + ptrdiff_t(plan.cta_segment_start_at_));
  for (size_t i = cta_start.size(); i < size_t(ctas) + 1; ++i) a[plan.cta_segment_start_at_ + i] = used;
  plan.merge_counters_at_ = plan.cta_segment_start_at_ + size_t(ctas) + 1;
  plan.block_table_start_at_ = plan.merge_counters_at_ + counters;
  plan.block_tables_at_ = plan.block_table_start_at_ + size_t(options.fixed_rows);
  plan.external_block_tables_ = options.fixed_block_tables;
  for (size_t i = 0; i < rows.size(); ++i) {
    a[plan.block_table_start_at_ + i] = int32_t(i * stride);
    if (external) continue;
    const size_t needed = (size_t(rows[i].context_len) + size_t(plan.config_.block_size) - 1) /
                          size_t(plan.config_.block_size);
    std::copy(rows[i].block_table.begin(), rows[i].block_table.begin() + ptrdiff_t(needed),
              a.begin() + ptrdiff_t(plan.block_tables_at_ + i * stride));
  }
  return plan;
}

MlaDecodeDescriptor MlaDecodePlan::descriptor(int32_t* device_arena, const void* latent,
                                              const void* latent_scale, float* workspace) const {
  MlaDecodeDescriptor d;
  d.num_rows = num_rows_;
  d.num_heads = config_.num_heads;
  d.block_size = config_.block_size;
  d.num_blocks = config_.num_blocks;
  d.num_ctas = num_ctas_;
  d.num_segments = num_segments_;
  d.max_splits = max_splits_;
  d.partials_per_segment = mla_decode_partials_per_segment(kernel_);
  d.scale_log2 = config_.scale * 1.4426950408889634f;
  d.latent_element = config_.latent_element;
  d.latent_layout = config_.latent_layout;
  d.kernel = kernel_;
  d.segments = device_arena;
  d.row_segment_start = device_arena + row_segment_start_at_;
  d.cta_segment_start = device_arena + cta_segment_start_at_;
  d.block_table_start = device_arena + block_table_start_at_;
  d.block_tables = external_block_tables_ != nullptr ? external_block_tables_ : device_arena + block_tables_at_;
  d.latent = latent;
  d.latent_scale = static_cast<const float*>(latent_scale);
  d.workspace = workspace;
  d.fused_merge = fused_merge_ && !paired_merge_;
  d.paired_merge = paired_merge_;
  d.merge_counters = d.fused_merge && device_arena != nullptr ? device_arena + merge_counters_at_ : nullptr;
  return d;
}

}  // namespace pagoda::kernels::cuda
