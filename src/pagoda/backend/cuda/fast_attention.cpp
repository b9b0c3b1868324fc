#include "pagoda/backend/cuda/fast_attention.h"

#include <optional>
#include <vector>

#include "pagoda/backend/cuda/cuda_check.h"

#ifdef PAGODA_HAVE_KERNELS_CUDA
#include "pagoda/kernels/cuda/attention_kernels.h"
#include "pagoda/kernels/cuda/attention_plan.h"
#endif

namespace pagoda::cuda {

#ifdef PAGODA_HAVE_KERNELS_CUDA

namespace kc = pagoda::kernels::cuda;

struct FastAttention::State {
  bool prepared = false;
  int32_t num_sms = 132;
  std::optional<kc::PagedAttentionPlan> plan;
  DeviceBuffer arena;
  DeviceBuffer workspace;
};

FastAttention::FastAttention() : state_(std::make_unique<State>()) {}
FastAttention::~FastAttention() = default;

bool FastAttention::compiled_in() { return true; }

StatusOr<bool> FastAttention::plan(const ModelConfig& config, const ForwardBatch& batch, int32_t block_size,
                                   int32_t num_blocks, cudaStream_t stream) {
  State& s = *state_;
  if (!s.prepared) {
    int device = 0;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&s.num_sms, cudaDevAttrMultiProcessorCount, device));
    PAGODA_CUDA_RETURN_IF_ERROR(kc::prepare_paged_attention_kernels());
    s.prepared = true;
  }
  s.plan.reset();
  kc::AttentionConfig attention;
  attention.num_q_heads = config.num_q_heads;
  attention.num_kv_heads = config.num_kv_heads;
  attention.head_dim = config.head_dim;
  attention.block_size = block_size;
  attention.num_blocks = num_blocks;
  if (config.sliding_window > 0) return false;  // the Hopper kernels attend to the whole prefix
  std::vector<kc::AttentionSequence> sequences;
  sequences.reserve(batch.sequences.size());
  for (const SequenceSlice& seq : batch.sequences)
    sequences.push_back({seq.num_new_tokens, seq.num_cached_tokens, seq.block_table});
  auto plan = kc::PagedAttentionPlan::create(attention, sequences, kc::AttentionDeviceInfo{s.num_sms});
  if (!plan.ok()) {
    // Unsupported shapes are expected (small head_dim, MQA prefill); anything else is a bug upstream.
    if (plan.status().code() == StatusCode::kUnimplemented ||
        plan.status().message().find("head_dim") != std::string::npos)
      return false;
    return plan.status().with_context("planning Hopper attention");
  }
  if (plan->arena_bytes() > s.arena.bytes()) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    PAGODA_ASSIGN_OR_RETURN(s.arena, DeviceBuffer::allocate(plan->arena_bytes() * 2));
  }
  if (plan->workspace_bytes() > s.workspace.bytes()) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    PAGODA_ASSIGN_OR_RETURN(s.workspace, DeviceBuffer::allocate(plan->workspace_bytes() * 2));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.arena.data(), plan->arena().data(), plan->arena_bytes(),
                                              cudaMemcpyHostToDevice, stream));
  s.plan.emplace(std::move(plan).value());
  return true;
}

Status FastAttention::run(const DevicePagedKvLayer& layer, const bf16* q, bf16* out, cudaStream_t stream) {
  State& s = *state_;
  if (!s.plan) return failed_precondition_error("FastAttention::run without a plan for this step");
  const kc::AttentionDescriptor desc = s.plan->descriptor(
      s.arena.as<int32_t>(), kc::PagedKvPointers{layer.key, layer.value, nullptr, nullptr}, s.workspace.as<float>());
  PAGODA_CUDA_RETURN_IF_ERROR(kc::launch_paged_attention(desc, q, out, stream));
  return ok_status();
}

#else  // kernels/cuda not built: always fall back to the backend's own kernel.

struct FastAttention::State {};
FastAttention::FastAttention() : state_(std::make_unique<State>()) {}
FastAttention::~FastAttention() = default;
bool FastAttention::compiled_in() { return false; }
StatusOr<bool> FastAttention::plan(const ModelConfig&, const ForwardBatch&, int32_t, int32_t, cudaStream_t) {
  return false;
}
Status FastAttention::run(const DevicePagedKvLayer&, const bf16*, bf16*, cudaStream_t) {
  return failed_precondition_error("FastAttention: kernels/cuda is not compiled in");
}

#endif

}  // namespace pagoda::cuda
