#include "pagoda/backend/cuda/cuda_deepseek_mla_decode.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/pdl.cuh"

#ifdef PAGODA_HAVE_KERNELS_CUDA
#include "pagoda/backend/cuda/attention/mla_decode.h"
#endif

namespace pagoda::cuda {

#ifdef PAGODA_HAVE_KERNELS_CUDA
namespace kc = pagoda::kernels::cuda;

struct CudaMlaDecode::State {
  int32_t num_heads = 0;
  float scale = 0.0f;
  bool shape_ok = false;
  bool prepared = false;
  kc::AttentionDeviceInfo device;
  std::optional<kc::MlaDecodePlan> plan;  // this step's (nullopt: no fast rows)
  bool graph = false;                     // plan is a fixed (graph) plan
  DeviceBuffer arena, workspace;          // eager plans
  // Graph plans: sized once for the largest bucket, never reallocated (captured launches keep the addresses).
  DeviceBuffer graph_arena, graph_workspace;
  int32_t graph_max_bucket = 0, graph_stride = 0;
  std::vector<kc::MlaDecodeRow> rows;

  Status prepare() {
    if (prepared) return ok_status();
    int ordinal = 0;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&ordinal));
    PAGODA_CUDA_RETURN_IF_ERROR(kc::query_attention_device_info(ordinal, &device));
    PAGODA_CUDA_RETURN_IF_ERROR(kc::prepare_mla_decode_kernels());
    prepared = true;
    return ok_status();
  }
};

CudaMlaDecode::CudaMlaDecode(const ModelConfig& config) : state_(std::make_unique<State>()) {
  const MlaConfig& m = *config.mla;
  state_->num_heads = config.num_q_heads;
  state_->scale = m.softmax_scale;
  state_->shape_ok = m.kv_lora_rank == kc::kMlaLatentDim && m.qk_rope_head_dim == kc::kMlaRopeDim &&
                     config.num_q_heads >= 1 && config.num_q_heads <= 1024;
}

CudaMlaDecode::~CudaMlaDecode() = default;

bool CudaMlaDecode::supported() const { return state_->shape_ok; }

StatusOr<int32_t> CudaMlaDecode::plan(const ForwardBatch& batch, const KvPoolShape& pool, int32_t bucket,
                                      int32_t max_bucket, int32_t block_table_stride, cudaStream_t stream,
                                      const int32_t* device_block_tables) {
  State& s = *state_;
  s.plan.reset();
  if (!s.shape_ok) return 0;
  kc::KvElement element;
  kc::MlaLatentLayout layout = kc::MlaLatentLayout::kPerVectorScale;
  if (pool.key_dtype == DType::kBF16) {
    element = kc::KvElement::kBF16;
    if (pool.latent_pages == runtime::MlaLatentPages::kSwizzled128) layout = kc::MlaLatentLayout::kBf16SwizzledPages;
  } else if (pool.key_dtype == DType::kFP8E4M3) {
    // The pool holds runtime/mla_fp8_layout.h's 656-byte records, which both
    // kernel variants (narrow and 64-head tiles) read.
    element = kc::KvElement::kFP8E4M3;
    layout = kc::MlaLatentLayout::kFlashMla656;
  } else {
    return 0;
  }
  // The leading one-token sequences, in token order.
  s.rows.clear();
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& seq = batch.sequences[i];
    if (seq.num_new_tokens != 1 || seq.token_offset != static_cast<int32_t>(i)) break;
    s.rows.push_back(kc::MlaDecodeRow{seq.num_cached_tokens + 1, seq.block_table});
  }
  if (bucket > 0 && s.rows.size() != batch.sequences.size()) return 0;  // graph steps are pure decodes
  if (s.rows.empty()) return 0;
  PAGODA_RETURN_IF_ERROR(s.prepare());
  const kc::MlaDecodeConfig config{s.num_heads, pool.block_size, pool.num_blocks, s.scale, element, layout};
  const kc::AttentionDeviceInfo& device = s.device;
  DeviceBuffer* arena = &s.arena;
  kc::MlaDecodeOptions options;
  if (bucket > 0) {
    if (s.graph_max_bucket == 0) {
      // The largest bucket's fixed plan sizes the graph buffers once.
      kc::MlaDecodeOptions largest;
      largest.fixed_rows = max_bucket;
      largest.fixed_block_table_stride = block_table_stride;
      PAGODA_ASSIGN_OR_RETURN(kc::MlaDecodePlan sizing, kc::MlaDecodePlan::create(config, {}, device, largest));
      PAGODA_ASSIGN_OR_RETURN(s.graph_arena, DeviceBuffer::allocate(sizing.arena_bytes()));
      PAGODA_ASSIGN_OR_RETURN(s.graph_workspace, DeviceBuffer::allocate(sizing.workspace_bytes()));
      s.graph_max_bucket = max_bucket;
      s.graph_stride = block_table_stride;
    }
    if (bucket > s.graph_max_bucket || block_table_stride != s.graph_stride)
      return internal_error("mla decode: graph bucket {} / stride {} outside the sized {} / {}", bucket,
                            block_table_stride, s.graph_max_bucket, s.graph_stride);
    options.fixed_rows = bucket;
    options.fixed_block_table_stride = block_table_stride;
    options.fixed_block_tables = device_block_tables;
    arena = &s.graph_arena;
  }
  PAGODA_ASSIGN_OR_RETURN(kc::MlaDecodePlan plan, kc::MlaDecodePlan::create(config, s.rows, device, options));
  if (bucket == 0) {
    if (plan.arena_bytes() > s.arena.bytes()) {
      s.arena = DeviceBuffer{};
      PAGODA_ASSIGN_OR_RETURN(s.arena, DeviceBuffer::allocate(std::max(plan.arena_bytes() * 2, size_t{4096})));
    }
    if (plan.workspace_bytes() > s.workspace.bytes()) {
      s.workspace = DeviceBuffer{};
      PAGODA_ASSIGN_OR_RETURN(s.workspace, DeviceBuffer::allocate(plan.workspace_bytes()));
    }
  } else if (plan.arena_bytes() > s.graph_arena.bytes() || plan.workspace_bytes() > s.graph_workspace.bytes()) {
    return internal_error("mla decode: fixed plan of {} rows larger than its sized buffers", bucket);
  }
  PAGODA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(arena->data(), plan.arena().data(), plan.arena_bytes(), cudaMemcpyHostToDevice, stream));
  s.graph = bucket > 0;
  s.plan.emplace(std::move(plan));
  return bucket > 0 ? bucket : static_cast<int32_t>(s.rows.size());
}

Status CudaMlaDecode::run(const DevicePagedKvLayer& layer, const bf16* q, bf16* out, cudaStream_t stream) {
  State& s = *state_;
  if (!s.plan) return failed_precondition_error("mla decode: run without a plan");
  DeviceBuffer& arena = s.graph ? s.graph_arena : s.arena;
  DeviceBuffer& workspace = s.graph ? s.graph_workspace : s.workspace;
  kc::MlaDecodeDescriptor d =
      s.plan->descriptor(arena.as<int32_t>(), layer.key, layer.key_scale, workspace.as<float>());
  // The merge pass as a programmatic launch: +1% at 64 x 4K, -1% to -5% at 8 x 32K (docs/BENCHMARKS.md, "MLA
  // decode v19"), so only with PAGODA_MLA_PROGRAMMATIC_MERGE=1, and never with the engine's PDL off (pdl.cuh).
  static const bool programmatic_merge = [] {
    const char* env = std::getenv("PAGODA_MLA_PROGRAMMATIC_MERGE");
    return env != nullptr && std::string_view(env) == "1";
  }();
  d.programmatic_merge = programmatic_merge && pdl_enabled();
  PAGODA_CUDA_RETURN_IF_ERROR(kc::launch_mla_decode(d, q, out, stream));
  return ok_status();
}

#else  // backend/cuda/attention not built: every step runs the simple kernel.

struct CudaMlaDecode::State {};
CudaMlaDecode::CudaMlaDecode(const ModelConfig&) : state_(std::make_unique<State>()) {}
CudaMlaDecode::~CudaMlaDecode() = default;
bool CudaMlaDecode::supported() const { return false; }
StatusOr<int32_t> CudaMlaDecode::plan(const ForwardBatch&, const KvPoolShape&, int32_t, int32_t, int32_t,
                                      cudaStream_t) {
  return 0;
}
Status CudaMlaDecode::run(const DevicePagedKvLayer&, const bf16*, bf16*, cudaStream_t) {
  return failed_precondition_error("mla decode: not compiled in");
}

#endif

}  // namespace pagoda::cuda
