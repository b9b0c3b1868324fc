#include "pagoda/backend/cuda/attention/attention_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pagoda/backend/cuda/attention/attention_launch_internal.h"

namespace pagoda::kernels::cuda {
namespace {

constexpr int32_t kPrefillRowsPerTile = 128;  // prefill_attention.cu and prefill_attention_sm90.cu
constexpr int32_t kMaxGridY = 65535;
// Decode: CTAs per SM that fit (shared memory bound, decode_attention.cu), and
// how many waves of them the automatic split aims for (bf16; decode_waves).
constexpr int64_t kDecodeCtasPerSm = 2;
constexpr int64_t kDecodeWaves = 2;
constexpr int32_t kSplitGranule = 256;  // split boundaries on multiples of this many positions

const char* kv_element_name(KvElement e) {
  switch (e) {
    case KvElement::kBF16: return "bf16";
    case KvElement::kFP8E4M3: return "fp8";
    case KvElement::kInt8: return "int8";
    case KvElement::kInt4: return "int4";
  }
  return "unknown";
}

bool is_quantized(const AttentionConfig& c) {
  return c.key_element != KvElement::kBF16 || c.value_element != KvElement::kBF16;
}

bool is_power_of_two(int32_t x) { return x > 0 && (x & (x - 1)) == 0; }

int32_t log2_exact(int32_t x) {
  int32_t n = 0;
  while ((1 << n) < x) ++n;
  return n;
}

Status validate(const AttentionConfig& c, std::span<const AttentionSequence> sequences) {
  if (c.num_q_heads <= 0 || c.num_kv_heads <= 0 || c.num_q_heads % c.num_kv_heads != 0)
    return invalid_argument_error(
        "attention: num_q_heads ({}) must be a positive multiple of num_kv_heads ({})",
        c.num_q_heads, c.num_kv_heads);
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256)
    return unimplemented_error("attention: head_dim {} (supported: 64, 128, 256)", c.head_dim);
  if (!is_power_of_two(c.block_size) || c.block_size > 256)
    return invalid_argument_error("attention: block_size {} must be a power of two <= 256",
                                  c.block_size);
  if (c.num_blocks <= 0)
    return invalid_argument_error("attention: num_blocks {} must be positive", c.num_blocks);
  if (is_quantized(c) && !decode_attention_quantized_supports(c.key_element, c.value_element, c.head_dim))
    return unimplemented_error(
        "attention: KV K {} / V {} at head_dim {} (quantized KV runs at head_dim 64 or 128, K and V in the "
        "same format or K int8 with V int4)", kv_element_name(c.key_element), kv_element_name(c.value_element),
        c.head_dim);
  if (!(c.scale >= 0.0f) || !std::isfinite(c.scale))
    return invalid_argument_error("attention: scale {} must be finite and >= 0", c.scale);
  if (sequences.empty()) return invalid_argument_error("attention: no sequences");
  int64_t total_tokens = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& s = sequences[i];
    if (s.num_new_tokens < 1)
      return invalid_argument_error("attention: sequence {} has num_new_tokens {} (need >= 1)", i,
                                    s.num_new_tokens);
    if (s.num_cached_tokens < 0)
      return invalid_argument_error("attention: sequence {} has num_cached_tokens {}", i,
                                    s.num_cached_tokens);
    const int64_t length = int64_t{s.num_cached_tokens} + s.num_new_tokens;
    if (length > (int64_t{1} << 30))
      return invalid_argument_error("attention: sequence {} is {} positions long", i, length);
    const int64_t blocks_needed = (length + c.block_size - 1) / c.block_size;
    if (static_cast<int64_t>(s.block_table.size()) < blocks_needed)
      return invalid_argument_error(
          "attention: sequence {} needs {} blocks for {} positions but its block table has {}", i,
          blocks_needed, length, s.block_table.size());
    for (int64_t j = 0; j < blocks_needed; ++j) {
      const int32_t block = s.block_table[static_cast<size_t>(j)];
      if (block < 0 || block >= c.num_blocks)
        return invalid_argument_error(
            "attention: sequence {} block_table[{}] = {} is outside the pool [0, {})", i, j, block,
            c.num_blocks);
    }
    total_tokens += s.num_new_tokens;
  }
  if (total_tokens > (int64_t{1} << 30))
    return invalid_argument_error("attention: {} query tokens in one step", total_tokens);
  return ok_status();
}

// Decode: query heads per CTA (all heads of a GQA group share each K/V load).
int32_t decode_heads_per_cta(const AttentionConfig& c) {
  const int32_t group = c.num_q_heads / c.num_kv_heads;
  return group % 4 == 0 ? 4 : (group % 2 == 0 ? 2 : 1);
}

// Decode: waves of CTAs the automatic split aims for. A unit's fixed costs
// (pipeline fill, warp merge, output, the next CTA's start) are paid per CTA,
// so units are sized by bytes, not positions: the pools the tensor-core decode
// reads in 1-byte codes or less (fp8, int8, int4; K and V alike) get one wave,
// at least the bytes per unit of bf16's two, which shortened fp8's long-context
// decode. bf16 keeps two waves: one wave gained it nothing measurable, and two
// balance uneven lengths better (docs/KERNELS.md has the figures).
int64_t decode_waves(const AttentionConfig& c) {
  const bool compact = c.key_element == c.value_element &&
                       (c.key_element == KvElement::kFP8E4M3 || c.key_element == KvElement::kInt8 ||
                        c.key_element == KvElement::kInt4);
  return compact ? 1 : kDecodeWaves;
}

// Decode: the automatic split (KV positions per work item) for these lengths,
// so that the grid fills about decode_waves waves of kDecodeCtasPerSm CTAs per SM.
int64_t automatic_split(std::span<const int32_t> lengths, int64_t head_tiles, const AttentionConfig& config,
                        const AttentionDeviceInfo& device) {
  int64_t total_positions = 0;
  for (int32_t len : lengths) total_positions += len;
  const int64_t target_ctas = int64_t{device.num_sms} * kDecodeCtasPerSm * decode_waves(config);
  int64_t split = (total_positions * head_tiles + target_ctas - 1) / std::max<int64_t>(target_ctas, 1);
  return std::max<int64_t>(kSplitGranule, (split + kSplitGranule - 1) / kSplitGranule * kSplitGranule);
}

// A caller's split, rounded up to a multiple of 4: the tensor-core decode copies
// the scale records of 4 positions at a time, from 4-aligned positions.
int64_t round_split(int32_t split_tokens) { return (int64_t{split_tokens} + 3) / 4 * 4; }

int64_t count_decode_items(std::span<const int32_t> lengths, int64_t split) {
  int64_t items = 0;
  for (int32_t len : lengths) items += (len + split - 1) / split;
  return items;
}

}  // namespace

int32_t PagedAttentionPlan::graph_work_item_capacity(const AttentionConfig& config, int32_t graph_sequences,
                                                     const AttentionDeviceInfo& device) {
  if (config.num_kv_heads <= 0 || config.num_q_heads <= 0) return graph_sequences;
  const int64_t head_tiles = std::max(1, config.num_q_heads / decode_heads_per_cta(config));
  const int64_t target_ctas = int64_t{std::max(device.num_sms, 1)} * kDecodeCtasPerSm * kDecodeWaves;
  return static_cast<int32_t>(graph_sequences + (target_ctas + head_tiles - 1) / head_tiles);
}

size_t PagedAttentionPlan::graph_workspace_bytes(const AttentionConfig& config, int32_t graph_sequences,
                                                 const AttentionDeviceInfo& device) {
  const size_t floats = size_t(graph_work_item_capacity(config, graph_sequences, device)) *
                        std::max(config.num_q_heads, 0) * (std::max(config.head_dim, 0) + 1);
  return (floats * sizeof(float) + 255) / 256 * 256;
}

StatusOr<PagedAttentionPlan> PagedAttentionPlan::create_graph_decode(
    const AttentionConfig& config, std::span<const AttentionSequence> sequences,
    const AttentionDeviceInfo& device, const AttentionPlanOptions& options) {
  const int32_t capacity = options.graph_sequences;
  const int32_t stride = options.graph_block_table_stride;
  const int32_t n = static_cast<int32_t>(sequences.size());
  if (stride < 1)
    return invalid_argument_error("attention (graph mode): graph_block_table_stride {} must be >= 1", stride);
  if (n > capacity)
    return invalid_argument_error("attention (graph mode): {} sequences, over graph_sequences {}", n, capacity);
  const int32_t item_capacity = graph_work_item_capacity(config, capacity, device);
  if (item_capacity > kMaxGridY)
    return invalid_argument_error("attention (graph mode): graph_sequences {} needs {} work items (at most {})",
                                  capacity, item_capacity, kMaxGridY);
  std::vector<int32_t> lengths(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const AttentionSequence& s = sequences[static_cast<size_t>(i)];
    if (s.num_new_tokens != 1)
      return invalid_argument_error(
          "attention (graph mode): decode only, but sequence {} has num_new_tokens {}", i, s.num_new_tokens);
    lengths[static_cast<size_t>(i)] = s.num_cached_tokens + 1;
    const int64_t blocks = (int64_t{lengths[static_cast<size_t>(i)]} + config.block_size - 1) / config.block_size;
    if (blocks > stride)
      return invalid_argument_error(
          "attention (graph mode): sequence {} needs {} blocks, over graph_block_table_stride {}", i, blocks, stride);
  }

  PagedAttentionPlan plan;
  plan.config_ = config;
  plan.kernel_ = AttentionKernel::kDecode;
  plan.graph_mode_ = true;
  plan.num_sequences_ = capacity;
  plan.num_tokens_ = capacity;
  plan.q_heads_per_cta_ = decode_heads_per_cta(config);
  const int64_t head_tiles = config.num_q_heads / plan.q_heads_per_cta_;
  // The same split as an eager plan of these sequences (so both give the same
  // bits), grown only if the fixed capacity would overflow (a small
  // split_tokens from a test).
  int64_t split = options.split_tokens > 0 ? round_split(options.split_tokens) : automatic_split(lengths, head_tiles, config, device);
  while (count_decode_items(lengths, split) + (capacity - n) > item_capacity) split *= 2;

  auto& a = plan.arena_;
  const bool external = options.graph_block_tables != nullptr;
  // Every entry before the tables, and the tables of the step's sequences when they are embedded.
  a.reserve(size_t(capacity) * 3 + 3 + size_t(item_capacity) * 3 + size_t(capacity) + 1 +
            (external ? 0 : size_t(n) * size_t(stride)));
  plan.query_start_at_ = a.size();
  for (int32_t i = 0; i <= capacity; ++i) a.push_back(i);
  plan.kv_length_at_ = a.size();
  for (int32_t i = 0; i < capacity; ++i) a.push_back(i < n ? lengths[static_cast<size_t>(i)] : 0);
  plan.block_table_start_at_ = a.size();
  for (int32_t i = 0; i <= capacity; ++i) a.push_back(i * stride);

  plan.work_items_at_ = a.size();
  std::vector<int32_t> split_start{0};
  for (int32_t i = 0; i < capacity; ++i) {
    const int32_t len = i < n ? lengths[static_cast<size_t>(i)] : 0;
    const int32_t pieces = len == 0 ? 1 : static_cast<int32_t>((len + split - 1) / split);
    for (int32_t p = 0; p < pieces; ++p) {
      a.push_back(i);
      a.push_back(static_cast<int32_t>(std::min<int64_t>(len, p * split)));
      a.push_back(static_cast<int32_t>(std::min<int64_t>(len, (p + 1) * split)));
    }
    split_start.push_back(split_start.back() + pieces);
  }
  for (int32_t item = split_start.back(); item < item_capacity; ++item) {
    a.push_back(-1);  // unused: the CTA exits at once
    a.push_back(0);
    a.push_back(0);
  }
  plan.num_work_items_ = item_capacity;
  // The most items one sequence can get; > 1, so the merge pass is always launched.
  plan.max_splits_ = item_capacity - (capacity - 1);
  plan.split_start_at_ = a.size();
  a.insert(a.end(), split_start.begin(), split_start.end());

  plan.block_tables_at_ = a.size();
  if (external) {
    plan.external_block_tables_ = options.graph_block_tables;
    plan.arena_capacity_bytes_ = a.size() * sizeof(int32_t);
  } else {
    for (int32_t i = 0; i < n; ++i) {
      const auto& table = sequences[static_cast<size_t>(i)].block_table;
      const int32_t blocks = (lengths[static_cast<size_t>(i)] + config.block_size - 1) / config.block_size;
      a.insert(a.end(), table.begin(), table.begin() + blocks);
      a.insert(a.end(), static_cast<size_t>(stride - blocks), 0);
    }
    plan.arena_capacity_bytes_ = (plan.block_tables_at_ + size_t(capacity) * stride) * sizeof(int32_t);
  }
  plan.workspace_bytes_ = graph_workspace_bytes(config, capacity, device);
  return plan;
}

StatusOr<PagedAttentionPlan> PagedAttentionPlan::create(
    const AttentionConfig& config, std::span<const AttentionSequence> sequences,
    const AttentionDeviceInfo& device, const AttentionPlanOptions& options) {
  PAGODA_RETURN_IF_ERROR(validate(config, sequences));
  if (options.split_tokens < 0)
    return invalid_argument_error("attention: split_tokens {} must be >= 0", options.split_tokens);

  if (options.graph_sequences < 0)
    return invalid_argument_error("attention: graph_sequences {} must be >= 0", options.graph_sequences);
  if (options.graph_sequences == 0 && options.graph_block_tables != nullptr)
    return invalid_argument_error("attention: graph_block_tables is for graph mode (graph_sequences is 0)");
  if (options.graph_sequences > 0) {
    if (options.force_prefill)
      return invalid_argument_error("attention: graph mode plans decode only (force_prefill is set)");
    AttentionConfig scaled = config;
    if (scaled.scale == 0.0f) scaled.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
    auto graph_plan = create_graph_decode(scaled, sequences, device, options);
    if (graph_plan.ok()) graph_plan->decode_cuda_cores_ = options.decode_cuda_cores;
    return graph_plan;
  }

  PagedAttentionPlan plan;
  plan.decode_cuda_cores_ = options.decode_cuda_cores;
  plan.config_ = config;
  if (plan.config_.scale == 0.0f)
    plan.config_.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  const int32_t n = static_cast<int32_t>(sequences.size());
  plan.num_sequences_ = n;
  const int32_t group = config.num_q_heads / config.num_kv_heads;

  const bool all_decode = std::all_of(sequences.begin(), sequences.end(),
                                      [](const AttentionSequence& s) { return s.num_new_tokens == 1; });
  plan.kernel_ = (all_decode && !options.force_prefill) ? AttentionKernel::kDecode
                                                        : AttentionKernel::kPrefill;
  if (plan.kernel_ == AttentionKernel::kPrefill && config.head_dim == 128 &&
      !options.portable_prefill)
    plan.kernel_ = AttentionKernel::kPrefillSm90;
  if (plan.kernel_ != AttentionKernel::kDecode) {
    if (is_quantized(config))
      return unimplemented_error(
          "attention: quantized KV (K {} / V {}) runs only in decode (one new token per sequence); the prefill "
          "kernels read bf16", kv_element_name(config.key_element), kv_element_name(config.value_element));
    if (config.head_dim == 256)
      return unimplemented_error(
          "attention: head_dim 256 runs only in decode (one new token per sequence)");
    if (group > kPrefillRowsPerTile)
      return unimplemented_error("attention: {} query heads per KV head (prefill supports <= {})",
                                 group, kPrefillRowsPerTile);
  }

  auto& a = plan.arena_;
  plan.query_start_at_ = a.size();
  a.push_back(0);
  for (const auto& s : sequences) a.push_back(a.back() + s.num_new_tokens);
  plan.num_tokens_ = a.back();

  plan.kv_length_at_ = a.size();
  std::vector<int32_t> lengths(n);
  for (int32_t i = 0; i < n; ++i) {
    lengths[i] = sequences[i].num_cached_tokens + sequences[i].num_new_tokens;
    a.push_back(lengths[i]);
  }

  plan.block_table_start_at_ = a.size();
  std::vector<int32_t> table_sizes(n);
  int32_t table_total = 0;
  a.push_back(0);
  for (int32_t i = 0; i < n; ++i) {
    table_sizes[i] = (lengths[i] + config.block_size - 1) / config.block_size;
    table_total += table_sizes[i];
    a.push_back(table_total);
  }
  plan.block_tables_at_ = a.size();
  for (int32_t i = 0; i < n; ++i)
    a.insert(a.end(), sequences[i].block_table.begin(),
             sequences[i].block_table.begin() + table_sizes[i]);

  plan.work_items_at_ = a.size();
  if (plan.kernel_ == AttentionKernel::kDecode) {
    plan.q_heads_per_cta_ = decode_heads_per_cta(config);
    const int64_t head_tiles = config.num_q_heads / plan.q_heads_per_cta_;
    int64_t split = round_split(options.split_tokens);
    if (split == 0) split = automatic_split(lengths, head_tiles, config, device);
    // Keep the grid within CUDA's y limit by growing the split if needed.
    while (count_decode_items(lengths, split) > kMaxGridY) split *= 2;

    std::vector<int32_t> split_start{0};
    for (int32_t i = 0; i < n; ++i) {
      const int32_t pieces = static_cast<int32_t>((lengths[i] + split - 1) / split);
      plan.max_splits_ = std::max(plan.max_splits_, pieces);
      for (int32_t p = 0; p < pieces; ++p) {
        const int64_t begin = p * split;
        const int64_t end = std::min<int64_t>(lengths[i], begin + split);
        a.push_back(i);
        a.push_back(static_cast<int32_t>(begin));
        a.push_back(static_cast<int32_t>(end));
      }
      split_start.push_back(split_start.back() + pieces);
    }
    plan.num_work_items_ = split_start.back();
    plan.split_start_at_ = a.size();
    a.insert(a.end(), split_start.begin(), split_start.end());
    if (plan.max_splits_ > 1) {
      const size_t partial_floats = size_t(plan.num_work_items_) * config.num_q_heads *
                                    (config.head_dim + 1);
      plan.workspace_bytes_ = (partial_floats * sizeof(float) + 255) / 256 * 256;
    }
  } else {  // both prefill kernels: 128 rows per tile
    plan.tokens_per_tile_ = kPrefillRowsPerTile / group;
    struct Item {
      int32_t sequence, first_token;
      int64_t cost;  // KV positions the tile visits (causal)
    };
    std::vector<Item> items;
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t t = 0; t < sequences[i].num_new_tokens; t += plan.tokens_per_tile_) {
        const int32_t last = std::min(sequences[i].num_new_tokens, t + plan.tokens_per_tile_);
        items.push_back({i, t, int64_t{sequences[i].num_cached_tokens} + last});
      }
    }
    if (static_cast<int64_t>(items.size()) > kMaxGridY)
      return unimplemented_error("attention: {} prefill tiles in one step (at most {})",
                                 items.size(), kMaxGridY);
    // Heaviest tiles first so the causal tail does not idle the GPU.
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& x, const Item& y) { return x.cost > y.cost; });
    for (const Item& it : items) {
      a.push_back(it.sequence);
      a.push_back(it.first_token);
    }
    plan.num_work_items_ = static_cast<int32_t>(items.size());
    plan.split_start_at_ = a.size();  // unused by prefill
  }
  plan.arena_capacity_bytes_ = plan.arena_bytes();
  return plan;
}

AttentionDescriptor PagedAttentionPlan::descriptor(const int32_t* device_arena,
                                                   const PagedKvPointers& kv,
                                                   float* workspace) const {
  AttentionDescriptor d;
  d.kernel = kernel_;
  d.num_sequences = num_sequences_;
  d.num_tokens = num_tokens_;
  d.num_q_heads = config_.num_q_heads;
  d.num_kv_heads = config_.num_kv_heads;
  d.head_dim = config_.head_dim;
  d.block_size = config_.block_size;
  d.log2_block_size = log2_exact(config_.block_size);
  d.scale = config_.scale;
  d.scale_log2 = config_.scale * 1.4426950408889634f;
  d.query_start = device_arena + query_start_at_;
  d.kv_length = device_arena + kv_length_at_;
  d.block_table_start = device_arena + block_table_start_at_;
  d.block_tables = external_block_tables_ != nullptr ? external_block_tables_ : device_arena + block_tables_at_;
  d.work_items = device_arena + work_items_at_;
  d.num_work_items = num_work_items_;
  d.split_start = device_arena + split_start_at_;
  d.max_splits = max_splits_;
  d.q_heads_per_cta = q_heads_per_cta_;
  d.tokens_per_tile = tokens_per_tile_;
  d.key_element = config_.key_element;
  d.value_element = config_.value_element;
  d.key = kv.key;
  d.value = kv.value;
  d.token_stride = int64_t{config_.num_kv_heads} * config_.head_dim;
  d.block_stride = d.token_stride * config_.block_size;
  d.key_scale = kv.key_scale;
  d.value_scale = kv.value_scale;
  d.key_tensor_scale = kv.key_tensor_scale;
  d.value_tensor_scale = kv.value_tensor_scale;
  d.workspace = workspace;
  d.decode_cuda_cores = decode_cuda_cores_;
  return d;
}

}  // namespace pagoda::kernels::cuda
