#include "pagoda/backend/cuda/fast_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "pagoda/backend/cuda/attention_step_split.h"
#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/core/dtype.h"

#ifdef PAGODA_HAVE_KERNELS_CUDA
#include "pagoda/backend/cuda/attention/attention_kernels.h"
#include "pagoda/backend/cuda/attention/attention_plan.h"
#endif

namespace pagoda::cuda {

#ifdef PAGODA_HAVE_KERNELS_CUDA

namespace kc = pagoda::kernels::cuda;

// One kernel launch of a step: a plan over some of the step's sequences, whose
// query rows start at row_offset. Mixed steps have two: the leading decodes on
// the split-K decode kernel and the prompt chunks on the prefill kernel.
struct AttentionLaunch {
  kc::PagedAttentionPlan plan;
  DeviceBuffer* arena = nullptr;      // the device copy of plan.arena()
  DeviceBuffer* workspace = nullptr;  // split-K scratch (may be empty)
  int64_t row_offset = 0;             // first query row of the plan's sequences
  // The plan reads the bf16 scratch pool (dequantized_* below) instead of the
  // layer's quantized pool: the prefill kernels read bf16 only.
  bool reads_scratch = false;
};

struct FastAttention::State {
  bool prepared = false;
  int32_t num_sms = 132;
  std::vector<AttentionLaunch> launches;  // this step's, in launch order
  int64_t row_elements = 0;               // num_q_heads * head_dim of this step's model
  DeviceBuffer arena;
  DeviceBuffer workspace;
  DeviceBuffer prefill_arena;  // the prefill launch's arena when a step has two launches
  // Graph mode: sized once for the largest bucket and never reallocated, since
  // captured launches keep their addresses.
  DeviceBuffer graph_arena;
  DeviceBuffer graph_workspace;
  int32_t graph_max_bucket = 0;
  int32_t graph_stride = 0;
  kc::KvElement key_element = kc::KvElement::kBF16;  // the pool's (set_kv_dtypes)
  kc::KvElement value_element = kc::KvElement::kBF16;
  // Prefill over a quantized pool: the pool blocks the prompt chunks read
  // (each once), dequantized per layer into a bf16 scratch pool.
  std::vector<int32_t> scratch_sources;  // scratch block j = pool block scratch_sources[j]
  DeviceBuffer scratch_sources_device;
  DeviceBuffer dequantized_key, dequantized_value;

  bool quantized() const { return key_element != kc::KvElement::kBF16 || value_element != kc::KvElement::kBF16; }

  // Once: the SM count for the split and the kernels' shared-memory limits (before any capture).
  Status prepare() {
    if (prepared) return ok_status();
    int device = 0;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    PAGODA_CUDA_RETURN_IF_ERROR(kc::prepare_paged_attention_kernels());
    prepared = true;
    return ok_status();
  }
};

namespace {

// The kernels' view of the model, or nullopt when they cannot run it.
std::optional<kc::AttentionConfig> attention_config(const ModelConfig& config, int32_t block_size,
                                                    int32_t num_blocks, kc::KvElement key, kc::KvElement value) {
  if (config.sliding_window > 0) return std::nullopt;  // the Hopper kernels attend to the whole prefix
  if (config.head_dim != 64 && config.head_dim != 128 && config.head_dim != 256) return std::nullopt;
  if (block_size <= 0 || (block_size & (block_size - 1)) != 0 || block_size > 256) return std::nullopt;
  kc::AttentionConfig attention;
  attention.num_q_heads = config.num_q_heads;
  attention.num_kv_heads = config.num_kv_heads;
  attention.head_dim = config.head_dim;
  attention.block_size = block_size;
  attention.num_blocks = num_blocks;
  attention.key_element = key;
  attention.value_element = value;
  return attention;
}

std::vector<kc::AttentionSequence> attention_sequences(const ForwardBatch& batch) {
  std::vector<kc::AttentionSequence> sequences;
  sequences.reserve(batch.sequences.size());
  for (const SequenceSlice& seq : batch.sequences)
    sequences.push_back({seq.num_new_tokens, seq.num_cached_tokens, seq.block_table});
  return sequences;
}

// Unsupported shapes are expected (small head_dim, MQA prefill); anything else is a bug upstream.
bool unsupported(const Status& status) {
  return status.code() == StatusCode::kUnimplemented || status.message().find("head_dim") != std::string::npos;
}

}  // namespace

FastAttention::FastAttention() : state_(std::make_unique<State>()) {}
FastAttention::~FastAttention() = default;

bool FastAttention::compiled_in() { return true; }

void FastAttention::set_kv_dtypes(DType key, DType value) {
  auto element = [](DType dtype) {
    switch (dtype) {
      case DType::kFP8E4M3: return kc::KvElement::kFP8E4M3;
      case DType::kInt8: return kc::KvElement::kInt8;
      case DType::kInt4: return kc::KvElement::kInt4;
      default: return kc::KvElement::kBF16;
    }
  };
  state_->key_element = element(key);
  state_->value_element = element(value);
}

namespace {

// Grows `buffer` to hold at least `bytes` (with room to spare, so a slowly
// growing step does not reallocate every time). Waits for `stream` first:
// launches already enqueued may still read the old buffer.
Status ensure_bytes(DeviceBuffer& buffer, size_t bytes, cudaStream_t stream) {
  if (bytes <= buffer.bytes()) return ok_status();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  buffer = DeviceBuffer();  // free first: the new one may need the room
  PAGODA_ASSIGN_OR_RETURN(buffer, DeviceBuffer::allocate(std::max<size_t>(bytes * 2, 256)));
  return ok_status();
}

// The bf16 scratch pool of a quantized-KV prefill is bounded: a step that would
// need more (very long cached prefixes) runs on the builtin kernel instead.
constexpr size_t kMaxScratchBytes = size_t{1} << 30;

}  // namespace

StatusOr<bool> FastAttention::plan(const ModelConfig& config, const ForwardBatch& batch, int32_t block_size,
                                   int32_t num_blocks, cudaStream_t stream) {
  State& s = *state_;
  PAGODA_RETURN_IF_ERROR(s.prepare());
  s.launches.clear();
  s.row_elements = int64_t{config.num_q_heads} * config.head_dim;
  const std::vector<kc::AttentionSequence> sequences = attention_sequences(batch);
  const std::span<const kc::AttentionSequence> all(sequences);

  // Plans `part` (query rows from row_offset) over a pool of `pool_blocks`
  // blocks of the given element types and appends its launch. false: not
  // supported (the step goes to the caller's kernel).
  auto add_launch = [&](std::span<const kc::AttentionSequence> part, int64_t row_offset, int32_t pool_blocks,
                        kc::KvElement key, kc::KvElement value, DeviceBuffer& arena,
                        DeviceBuffer* workspace) -> StatusOr<bool> {
    const std::optional<kc::AttentionConfig> attention = attention_config(config, block_size, pool_blocks, key, value);
    if (!attention) return false;
    auto plan = kc::PagedAttentionPlan::create(*attention, part, kc::AttentionDeviceInfo{s.num_sms});
    if (!plan.ok()) {
      if (unsupported(plan.status())) return false;
      return plan.status().with_context("planning Hopper attention");
    }
    PAGODA_RETURN_IF_ERROR(ensure_bytes(arena, plan->arena_bytes(), stream));
    if (plan->workspace_bytes() > 0) {
      if (workspace == nullptr) return internal_error("fast attention: a prefill plan asked for split-K workspace");
      PAGODA_RETURN_IF_ERROR(ensure_bytes(*workspace, plan->workspace_bytes(), stream));
    }
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(arena.data(), plan->arena().data(), plan->arena_bytes(),
                                                cudaMemcpyHostToDevice, stream));
    s.launches.push_back({std::move(plan).value(), &arena, workspace, row_offset, false});
    return true;
  };
  auto give_up = [&]() -> StatusOr<bool> {
    s.launches.clear();
    return false;
  };

  // The scheduler puts decodes first: the leading one-token sequences run on
  // the split-K decode kernel, the prompt chunks after them on the prefill
  // kernel (one launch for all of them when there are no decodes and the pool is bf16).
  const size_t decodes = count_leading_decodes(batch.sequences);
  if (decodes == sequences.size() || (decodes == 0 && !s.quantized())) {
    PAGODA_ASSIGN_OR_RETURN(const bool ok, add_launch(all, 0, num_blocks, s.key_element, s.value_element, s.arena,
                                                       &s.workspace));
    return ok ? true : give_up();
  }
  if (decodes > 0) {
    PAGODA_ASSIGN_OR_RETURN(const bool ok, add_launch(all.first(decodes), 0, num_blocks, s.key_element,
                                                       s.value_element, s.arena, &s.workspace));
    if (!ok) return give_up();
  }
  const std::span<const kc::AttentionSequence> chunks = all.subspan(decodes);
  const int64_t first_chunk_row = static_cast<int64_t>(decodes);  // each decode has one row
  if (!s.quantized()) {
    PAGODA_ASSIGN_OR_RETURN(const bool ok, add_launch(chunks, first_chunk_row, num_blocks, kc::KvElement::kBF16,
                                                       kc::KvElement::kBF16, s.prefill_arena, nullptr));
    return ok ? true : give_up();
  }

  // Quantized pool: the chunks' blocks (each pool block once, however many
  // sequences share it) go to a bf16 scratch pool, and the chunks' block
  // tables are renumbered into it.
  std::optional<ScratchRemap> remap =
      remap_blocks_to_scratch(std::span(batch.sequences).subspan(decodes), block_size, num_blocks);
  if (!remap) return give_up();
  s.scratch_sources = std::move(remap->sources);
  std::vector<kc::AttentionSequence> renumbered(chunks.begin(), chunks.end());
  for (size_t i = 0; i < chunks.size(); ++i) renumbered[i].block_table = remap->tables[i];
  const size_t scratch_blocks = s.scratch_sources.size();
  const size_t scratch_bytes = scratch_blocks * static_cast<size_t>(block_size) * config.num_kv_heads *
                               config.head_dim * sizeof(bf16);
  if (2 * scratch_bytes > kMaxScratchBytes) return give_up();
  PAGODA_ASSIGN_OR_RETURN(const bool ok, add_launch(renumbered, first_chunk_row, static_cast<int32_t>(scratch_blocks),
                                                     kc::KvElement::kBF16, kc::KvElement::kBF16, s.prefill_arena,
                                                     nullptr));
  if (!ok) return give_up();
  s.launches.back().reads_scratch = true;
  for (DeviceBuffer* buffer : {&s.dequantized_key, &s.dequantized_value}) {
    Status grown = ensure_bytes(*buffer, scratch_bytes, stream);
    if (grown.code() == StatusCode::kResourceExhausted) return give_up();  // no room: the builtin kernel needs none
    PAGODA_RETURN_IF_ERROR(grown);
  }
  PAGODA_RETURN_IF_ERROR(ensure_bytes(s.scratch_sources_device, scratch_blocks * sizeof(int32_t), stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.scratch_sources_device.data(), s.scratch_sources.data(),
                                              scratch_blocks * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  return true;
}

StatusOr<bool> FastAttention::plan_graph(const ModelConfig& config, const ForwardBatch& batch, int32_t bucket,
                                         int32_t max_bucket, int32_t block_table_stride, int32_t block_size,
                                         int32_t num_blocks, cudaStream_t stream,
                                         const int32_t* device_block_tables) {
  State& s = *state_;
  PAGODA_RETURN_IF_ERROR(s.prepare());
  s.launches.clear();
  s.row_elements = int64_t{config.num_q_heads} * config.head_dim;
  if (bucket < static_cast<int32_t>(batch.sequences.size()) || bucket > max_bucket)
    return invalid_argument_error("fast attention (graph mode): {} sequences in bucket {} of at most {}",
                                  batch.sequences.size(), bucket, max_bucket);
  const std::optional<kc::AttentionConfig> attention = attention_config(config, block_size, num_blocks, s.key_element, s.value_element);
  if (!attention) return false;
  const kc::AttentionDeviceInfo device{s.num_sms};
  if (s.graph_max_bucket == 0) {
    // The arena of the largest bucket: plan it once for a 1-token sequence
    // (with embedded tables: room for either kind of plan).
    const int32_t first_block = 0;
    const kc::AttentionSequence one{1, 0, std::span<const int32_t>(&first_block, 1)};
    kc::AttentionPlanOptions largest;
    largest.graph_sequences = max_bucket;
    largest.graph_block_table_stride = block_table_stride;
    auto sizing = kc::PagedAttentionPlan::create(*attention, std::span(&one, 1), device, largest);
    if (!sizing.ok()) {
      if (unsupported(sizing.status())) return false;
      return sizing.status().with_context("sizing Hopper attention for CUDA graphs");
    }
    PAGODA_ASSIGN_OR_RETURN(s.graph_arena, DeviceBuffer::allocate(sizing->arena_capacity_bytes()));
    PAGODA_ASSIGN_OR_RETURN(s.graph_workspace, DeviceBuffer::allocate(std::max<size_t>(sizing->workspace_bytes(), 256)));
    s.graph_max_bucket = max_bucket;
    s.graph_stride = block_table_stride;
  }
  if (max_bucket != s.graph_max_bucket || block_table_stride != s.graph_stride)
    return failed_precondition_error(
        "fast attention (graph mode): buffers were sized for max_bucket {} and stride {}, asked for {} and {}",
        s.graph_max_bucket, s.graph_stride, max_bucket, block_table_stride);
  kc::AttentionPlanOptions options;
  options.graph_sequences = bucket;
  options.graph_block_table_stride = block_table_stride;
  options.graph_block_tables = device_block_tables;
  const std::vector<kc::AttentionSequence> sequences = attention_sequences(batch);
  auto plan = kc::PagedAttentionPlan::create(*attention, sequences, device, options);
  if (!plan.ok()) {
    if (unsupported(plan.status())) return false;
    return plan.status().with_context("planning Hopper attention (graph mode)");
  }
  if (plan->arena_capacity_bytes() > s.graph_arena.bytes() || plan->workspace_bytes() > s.graph_workspace.bytes())
    return internal_error("fast attention (graph mode): bucket {} needs {} + {} bytes, over the {} + {} reserved",
                          bucket, plan->arena_capacity_bytes(), plan->workspace_bytes(), s.graph_arena.bytes(),
                          s.graph_workspace.bytes());
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.graph_arena.data(), plan->arena().data(), plan->arena_bytes(),
                                              cudaMemcpyHostToDevice, stream));
  s.launches.push_back({std::move(plan).value(), &s.graph_arena, &s.graph_workspace, 0, false});
  return true;
}

Status FastAttention::run(const DevicePagedKvLayer& layer, const bf16* q, bf16* out, cudaStream_t stream,
                          KvWriteFixedScales fixed_scales, const int32_t* hole_begin, const int32_t* hole_end,
                          float* scores, int64_t score_stride) {
  State& s = *state_;
  if (s.launches.empty()) return failed_precondition_error("FastAttention::run without a plan for this step");
  if (scores != nullptr && !writes_scores())
    return failed_precondition_error("fast attention: per-position scores in a step that is not one decode launch");
  if (hole_begin != nullptr && (s.launches.front().row_offset != 0 ||
                                s.launches.front().plan.kernel() != kc::AttentionKernel::kDecode))
    return unimplemented_error("fast attention: per-head holes in a step without a decode launch");
  for (const AttentionLaunch& launch : s.launches) {
    kc::PagedKvPointers kv{layer.key, layer.value, layer.key_scale, layer.value_scale};
    if (layer.key_dtype == kernels::KvQuant::kFP8E4M3 && layer.value_dtype == kernels::KvQuant::kFP8E4M3) {
      kv.key_tensor_scale = fixed_scales.key;  // both > 0: per-tensor scales, no record reads
      kv.value_tensor_scale = fixed_scales.value;
    }
    if (launch.reads_scratch) {
      PAGODA_CUDA_RETURN_IF_ERROR(kv_dequantize_blocks(layer, s.scratch_sources_device.as<int32_t>(),
                                                       static_cast<int32_t>(s.scratch_sources.size()),
                                                       s.dequantized_key.as<bf16>(), s.dequantized_value.as<bf16>(),
                                                       stream));
      kv = {s.dequantized_key.data(), s.dequantized_value.data(), nullptr, nullptr};
    }
    kc::AttentionDescriptor desc = launch.plan.descriptor(
        launch.arena->as<int32_t>(), kv, launch.workspace != nullptr ? launch.workspace->as<float>() : nullptr);
    if (hole_begin != nullptr && &launch == &s.launches.front()) {
      // The decode launch's sequences are the batch's first ones, so the rows line up.
      desc.hole_begin = hole_begin;
      desc.hole_end = hole_end;
    }
    if (scores != nullptr) {
      desc.scores = scores;
      desc.score_stride = score_stride;
    }
    const int64_t offset = launch.row_offset * s.row_elements;
    PAGODA_CUDA_RETURN_IF_ERROR(kc::launch_paged_attention(desc, q + offset, out + offset, stream));
  }
  return ok_status();
}

bool FastAttention::writes_scores() const {
  const State& s = *state_;
  return s.launches.size() == 1 && s.launches.front().row_offset == 0 &&
         s.launches.front().plan.kernel() == kc::AttentionKernel::kDecode;
}

#else  // backend/cuda/attention not built: always fall back to the backend's own kernel.

struct FastAttention::State {};
FastAttention::FastAttention() : state_(std::make_unique<State>()) {}
FastAttention::~FastAttention() = default;
bool FastAttention::compiled_in() { return false; }
void FastAttention::set_kv_dtypes(DType, DType) {}
StatusOr<bool> FastAttention::plan(const ModelConfig&, const ForwardBatch&, int32_t, int32_t, cudaStream_t) {
  return false;
}
StatusOr<bool> FastAttention::plan_graph(const ModelConfig&, const ForwardBatch&, int32_t, int32_t, int32_t, int32_t,
                                         int32_t, cudaStream_t, const int32_t*) {
  return false;
}
Status FastAttention::run(const DevicePagedKvLayer&, const bf16*, bf16*, cudaStream_t, KvWriteFixedScales,
                          const int32_t*, const int32_t*, float*, int64_t) {
  return failed_precondition_error("FastAttention: backend/cuda/attention is not compiled in");
}
bool FastAttention::writes_scores() const { return false; }

#endif

namespace {

// One check case: sequences (new tokens, cached tokens) over a scattered pool.
struct CheckCase {
  std::vector<std::pair<int32_t, int32_t>> sequences;  // (num_new_tokens, num_cached_tokens)
};

// Relative L2 error of `got` (bf16 bits) against `want`.
double relative_l2(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = bf16_to_f32(got[i]);
    const double d = std::isfinite(g) ? g - want[i] : 1e30;
    err += d * d;
    norm += want[i] * want[i];
  }
  return std::sqrt(err / std::max(norm, 1e-300));
}

// Runs both kernels on one case; returns {fast error (or -1 when not supported), builtin error}.
StatusOr<std::pair<double, double>> check_case(const ModelConfig& config, int32_t block_size, const CheckCase& c,
                                               uint32_t seed) {
  const int32_t hq = config.num_q_heads, hkv = config.num_kv_heads, d = config.head_dim;
  const int32_t group = hq / hkv;
  std::mt19937 rng(seed);
  // Block tables over a shuffled pool (one spare block so ids are not just 0..n-1).
  int32_t num_blocks = 1;
  for (const auto& [n, cached] : c.sequences) num_blocks += (n + cached + block_size - 1) / block_size;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ForwardBatch batch;
  int32_t stride = 0, next = 0;
  for (const auto& [n, cached] : c.sequences) {
    SequenceSlice s;
    s.token_offset = batch.num_tokens();
    s.num_new_tokens = n;
    s.num_cached_tokens = cached;
    const int32_t blocks = (n + cached + block_size - 1) / block_size;
    for (int32_t b = 0; b < blocks; ++b) s.block_table.push_back(ids[static_cast<size_t>(next++)]);
    stride = std::max(stride, blocks);
    for (int32_t i = 0; i < n; ++i) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(cached + i);
    }
    batch.sequences.push_back(std::move(s));
  }
  const int32_t tokens = batch.num_tokens();
  auto random_bf16 = [&](size_t count, float bound) {
    std::uniform_real_distribution<float> dist(-bound, bound);
    std::vector<uint16_t> v(count);
    for (uint16_t& x : v) x = f32_to_bf16(dist(rng));
    return v;
  };
  const size_t pool_elems = static_cast<size_t>(num_blocks) * block_size * hkv * d;
  const size_t q_elems = static_cast<size_t>(tokens) * hq * d;
  const std::vector<uint16_t> k = random_bf16(pool_elems, 2.0f), v = random_bf16(pool_elems, 1.0f);
  const std::vector<uint16_t> q = random_bf16(q_elems, 2.0f);

  // float64 reference: token t of a sequence sees positions [0, cached + i].
  std::vector<double> want(q_elems, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const int64_t token_stride = int64_t{hkv} * d;
  for (const SequenceSlice& s : batch.sequences) {
    for (int32_t i = 0; i < s.num_new_tokens; ++i) {
      const int32_t t = s.token_offset + i, visible = s.num_cached_tokens + i + 1;
      for (int32_t h = 0; h < hq; ++h) {
        const int64_t head_at = int64_t{h / group} * d;
        std::vector<double> p(static_cast<size_t>(visible));
        double m = -1e300, sum = 0;
        for (int32_t pos = 0; pos < visible; ++pos) {
          const int64_t at = (int64_t{s.block_table[static_cast<size_t>(pos / block_size)]} * block_size +
                              pos % block_size) * token_stride + head_at;
          double dot = 0;
          for (int32_t e = 0; e < d; ++e)
            dot += double{bf16_to_f32(q[static_cast<size_t>((int64_t{t} * hq + h) * d + e)])} *
                   bf16_to_f32(k[static_cast<size_t>(at + e)]);
          p[static_cast<size_t>(pos)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        for (double& x : p) sum += (x = std::exp(x - m));
        double* o = want.data() + (int64_t{t} * hq + h) * d;
        for (int32_t pos = 0; pos < visible; ++pos) {
          const int64_t at = (int64_t{s.block_table[static_cast<size_t>(pos / block_size)]} * block_size +
                              pos % block_size) * token_stride + head_at;
          for (int32_t e = 0; e < d; ++e) o[e] += p[static_cast<size_t>(pos)] / sum * bf16_to_f32(v[static_cast<size_t>(at + e)]);
        }
      }
    }
  }

  // Device inputs; the builtin kernel's per-token view as CudaModel plans it.
  std::vector<int32_t> token_sequence, kv_begin, kv_end;
  std::vector<int32_t> tables(static_cast<size_t>(batch.sequences.size()) * stride, 0);
  for (size_t si = 0; si < batch.sequences.size(); ++si) {
    const SequenceSlice& s = batch.sequences[si];
    std::copy(s.block_table.begin(), s.block_table.end(), tables.begin() + static_cast<int64_t>(si) * stride);
    for (int32_t i = 0; i < s.num_new_tokens; ++i) {
      token_sequence.push_back(static_cast<int32_t>(si));
      kv_begin.push_back(0);
      kv_end.push_back(s.num_cached_tokens + i + 1);
    }
  }
  auto upload = [](const auto& host) -> StatusOr<DeviceBuffer> {
    const size_t bytes = host.size() * sizeof(host[0]);
    PAGODA_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(std::max<size_t>(bytes, 4)));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(b.data(), host.data(), bytes, cudaMemcpyHostToDevice));
    return b;
  };
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer k_dev, upload(k));
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer v_dev, upload(v));
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer q_dev, upload(q));
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer seq_dev, upload(token_sequence));
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer begin_dev, upload(kv_begin));
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer end_dev, upload(kv_end));
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer tables_dev, upload(tables));
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer out_dev, DeviceBuffer::allocate(q_elems * 2));
  DevicePagedKvLayer layer;
  layer.key = k_dev.as<bf16>();
  layer.value = v_dev.as<bf16>();
  layer.num_blocks = num_blocks;
  layer.block_size = block_size;
  layer.num_kv_heads = hkv;
  layer.head_dim = d;
  std::vector<uint16_t> got(q_elems);
  auto read_out = [&]() -> Status {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(got.data(), out_dev.data(), q_elems * 2, cudaMemcpyDeviceToHost));
    return ok_status();
  };

  double fast_error = -1;
  FastAttention fast;
  PAGODA_ASSIGN_OR_RETURN(const bool planned, fast.plan(config, batch, block_size, num_blocks, nullptr));
  if (planned) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(out_dev.data(), 0xff, q_elems * 2));  // NaN until written
    PAGODA_RETURN_IF_ERROR(fast.run(layer, q_dev.as<bf16>(), out_dev.as<bf16>(), nullptr));
    PAGODA_RETURN_IF_ERROR(read_out());
    fast_error = relative_l2(got, want);
  }
  const DeviceAttentionPlan plan{seq_dev.as<int32_t>(), begin_dev.as<int32_t>(), end_dev.as<int32_t>(),
                                 tables_dev.as<int32_t>(), stride, tokens};
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(out_dev.data(), 0xff, q_elems * 2));
  PAGODA_CUDA_RETURN_IF_ERROR(paged_attention(q_dev.as<bf16>(), int64_t{hq} * d, layer, plan, hq,
                                              static_cast<float>(scale), out_dev.as<bf16>(), nullptr));
  PAGODA_RETURN_IF_ERROR(read_out());
  return std::make_pair(fast_error, relative_l2(got, want));
}

}  // namespace

StatusOr<AttentionCheck> FastAttention::check_attention_kernels(const ModelConfig& config, int32_t block_size) {
  AttentionCheck check;
  const CheckCase prefill{{{200, 0}, {77, 0}}};
  // Decodes first, then prompt chunks (one after a cached prefix): two launches.
  const CheckCase mixed{{{1, 300}, {1, 45}, {130, 0}, {60, 37}}};
  const CheckCase decode{{{1, 1000}, {1, 77}, {1, 300}}};
  PAGODA_ASSIGN_OR_RETURN(const auto p, check_case(config, block_size, prefill, 17));
  PAGODA_ASSIGN_OR_RETURN(const auto m, check_case(config, block_size, mixed, 23));
  PAGODA_ASSIGN_OR_RETURN(const auto d, check_case(config, block_size, decode, 29));
  check.fast_available = p.first >= 0 && m.first >= 0 && d.first >= 0;
  check.fast_prefill = std::max({p.first, m.first, 0.0});
  check.fast_decode = std::max(d.first, 0.0);
  check.builtin_prefill = std::max(p.second, m.second);
  check.builtin_decode = d.second;
  return check;
}

}  // namespace pagoda::cuda
