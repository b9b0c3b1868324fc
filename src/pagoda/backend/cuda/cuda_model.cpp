#include "pagoda/backend/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cuda_profiler_api.h>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/kv_share_ops.h"
#include "pagoda/backend/cuda/rope_kv_write.h"
#include "pagoda/backend/cuda/tensor_parallel_ops.h"
#include "pagoda/model/rope_frequencies.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/kv_geometry.h"
#include "pagoda/model/model_weights.h"
#include "pagoda/runtime/batch_validation.h"

namespace pagoda::cuda {


namespace {

// CudaModelOptions::fp8_lm_head with PAGODA_FP8_LM_HEAD applied.
StatusOr<bool> resolve_fp8_lm_head(const CudaModelOptions& options) {
  const char* env = std::getenv("PAGODA_FP8_LM_HEAD");
  if (env == nullptr || *env == '\0') return options.fp8_lm_head;
  const std::string v(env);
  if (v != "0" && v != "1") return invalid_argument_error("PAGODA_FP8_LM_HEAD={}: expected 0 or 1", env);
  return v == "1";
}

}  // namespace

StatusOr<std::unique_ptr<CudaModel>> CudaModel::load(const std::filesystem::path& model_dir,
                                                     const CudaModelOptions& options) {
  PAGODA_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  PAGODA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(model_dir));
  auto shared = std::make_shared<const Checkpoint>(std::move(checkpoint));
  WeightLoadOptions bind_options;
  bind_options.f32_cache_bytes = 0;  // keep mmapped views; conversion happens per tensor on upload
  PAGODA_ASSIGN_OR_RETURN(ModelWeights host, bind_model_weights(config, std::move(shared), bind_options));
  return from_weights(config, host, options);
}

StatusOr<std::unique_ptr<CudaModel>> CudaModel::from_weights(const ModelConfig& config, const ModelWeights& host,
                                                             const CudaModelOptions& options) {
  Fp8UploadOptions fp8;
  fp8.quantize = options.fp8_weights;
  PAGODA_ASSIGN_OR_RETURN(fp8.lm_head, resolve_fp8_lm_head(options));
  if (options.fp8_weights || host.fp8) {
    // The device decides which fp8 schemes run (create() refuses one without FP8 tensor cores).
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Fp8Gemm> probe, Fp8Gemm::create());
    fp8.block128_supported = probe->block128_supported();
  }
  PAGODA_ASSIGN_OR_RETURN(CudaModelWeights weights,
                          CudaModelWeights::upload(config, host, options.show_progress, fp8));
  std::unique_ptr<CudaDeepseekWeights> deepseek;
  if (config.mla) {
    PAGODA_ASSIGN_OR_RETURN(CudaDeepseekWeights layers,
                            CudaDeepseekWeights::upload(config, host, options.show_progress));
    deepseek = std::make_unique<CudaDeepseekWeights>(std::move(layers));
  }
  std::unique_ptr<CudaModel> model(new CudaModel(config, options, std::move(weights)));
  PAGODA_RETURN_IF_ERROR(model->init(std::move(deepseek)));
  return model;
}

StatusOr<std::unique_ptr<CudaModel>> CudaModel::create_random(const ModelConfig& config, uint64_t seed,
                                                              const CudaModelOptions& options) {
  if (options.fp8_weights) PAGODA_RETURN_IF_ERROR(Fp8Gemm::create().status());  // FP8 tensor cores present
  PAGODA_ASSIGN_OR_RETURN(const bool fp8_lm_head, resolve_fp8_lm_head(options));
  PAGODA_ASSIGN_OR_RETURN(CudaModelWeights weights,
                          CudaModelWeights::random(config, seed, options.fp8_weights, fp8_lm_head));
  std::unique_ptr<CudaDeepseekWeights> deepseek;
  if (config.mla) {
    PAGODA_ASSIGN_OR_RETURN(CudaDeepseekWeights layers, CudaDeepseekWeights::random(config, seed));
    deepseek = std::make_unique<CudaDeepseekWeights>(std::move(layers));
  }
  std::unique_ptr<CudaModel> model(new CudaModel(config, options, std::move(weights)));
  PAGODA_RETURN_IF_ERROR(model->init(std::move(deepseek)));
  return model;
}

CudaModel::CudaModel(ModelConfig config, CudaModelOptions options, CudaModelWeights weights)
    : config_(std::move(config)), options_(options), weights_(std::move(weights)) {}

CudaModel::~CudaModel() {
  for (auto& [bucket, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : {outputs_ready_[0], outputs_ready_[1], inputs_consumed_})
    if (e != nullptr) cudaEventDestroy(e);
}

Status CudaModel::init(std::unique_ptr<CudaDeepseekWeights> deepseek_weights) {
  const ModelConfig& c = config_;
  if (c.mla && deepseek_weights == nullptr)
    return invalid_argument_error("{}: an MLA config needs its DeepSeek layer weights", c.architecture_name);
  if (!c.mla && (c.head_dim % 8 != 0 || c.head_dim > 256 || c.hidden_size % 8 != 0 || c.num_kv_heads <= 0 ||
      c.num_q_heads % c.num_kv_heads != 0)) {
    return unimplemented_error("CUDA backend needs head_dim a multiple of 8 and <= 256, hidden_size a multiple of "
                               "8 and q heads a multiple of kv heads; {} has head_dim={} hidden={} heads={}/{}",
                               c.architecture_name, c.head_dim, c.hidden_size, c.num_q_heads, c.num_kv_heads);
  }
  if (options_.max_num_tokens < 1 || options_.max_num_seqs < 1 || options_.block_size < 1 ||
      options_.max_model_len < 0) {
    return invalid_argument_error("CUDA model options: max_num_tokens={} max_num_seqs={} block_size={} "
                                  "max_model_len={} (all >= 1, max_model_len >= 0)", options_.max_num_tokens,
                                  options_.max_num_seqs, options_.block_size, options_.max_model_len);
  }
  max_model_len_ = options_.max_model_len > 0 ? options_.max_model_len : c.max_position_embeddings;
  if (max_model_len_ <= 0) max_model_len_ = 4096;
  block_table_stride_ = (max_model_len_ + options_.block_size - 1) / options_.block_size;
  max_rows_ = std::max(options_.max_num_seqs, 1);
  buckets_ = decode_graph_buckets(options_.max_num_seqs);
  // Decode steps are padded to a bucket; the token scratch must hold the largest.
  options_.max_num_tokens = std::max(options_.max_num_tokens, options_.max_num_seqs);

  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&outputs_ready_[0], &outputs_ready_[1], &inputs_consumed_})
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  PAGODA_ASSIGN_OR_RETURN(gemm_, Gemm::create());
  int32_t gemv_rows = options_.gemv_max_rows;
  if (const char* env = std::getenv("PAGODA_GEMV_MAX_ROWS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > kGemvMaxRows)
      return invalid_argument_error("PAGODA_GEMV_MAX_ROWS={}: expected 0 ... {}", env, kGemvMaxRows);
    gemv_rows = static_cast<int32_t>(v);
  }
  if (gemv_rows < -1 || gemv_rows > kGemvMaxRows)
    return invalid_argument_error("CUDA model options: gemv_max_rows={} (-1 ... {})", gemv_rows, kGemvMaxRows);
  gemv_rows_bf16_ = gemv_rows < 0 ? kGemvDefaultMaxRowsBf16 : gemv_rows;
  gemv_rows_fp8_ = gemv_rows < 0 ? kGemvDefaultMaxRowsFp8 : gemv_rows;
  if (const char* env = std::getenv("PAGODA_MLA_LATENT_PAGES"); env != nullptr && *env != '\0') {
    const std::string v(env);
    if (v != "auto" && v != "token-major" && v != "swizzled128")
      return invalid_argument_error("PAGODA_MLA_LATENT_PAGES={}: expected auto, token-major or swizzled128", env);
    if (v == "auto") options_.mla_latent_pages.reset();
    else
      options_.mla_latent_pages =
          v == "swizzled128" ? runtime::MlaLatentPages::kSwizzled128 : runtime::MlaLatentPages::kTokenMajor;
  }
  if (const char* env = std::getenv("PAGODA_GEMV_FP8_DEPTH"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || (v != 1 && v != 2 && v != 4))
      return invalid_argument_error("PAGODA_GEMV_FP8_DEPTH={}: expected 1, 2 or 4", env);
    gemv_fp8_depth_ = static_cast<int32_t>(v);
  }
  if (const char* env = std::getenv("PAGODA_FP8_MMA_GEMV_ROWS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > kFp8MmaGemvMaxRows)
      return invalid_argument_error("PAGODA_FP8_MMA_GEMV_ROWS={}: expected 0 ... {}", env, kFp8MmaGemvMaxRows);
    fp8_mma_gemv_rows_ = static_cast<int32_t>(v);
  }
  if (const char* env = std::getenv("PAGODA_FUSE_ROPE_KV"); env != nullptr && *env != '\0') {
    const std::string v(env);
    if (v != "0" && v != "1") return invalid_argument_error("PAGODA_FUSE_ROPE_KV={}: expected 0 or 1", env);
    fuse_rope_kv_ = v == "1";
  }
  if (const char* env = std::getenv("PAGODA_FUSE_SILU_GEMV"); env != nullptr && *env != '\0') {
    const std::string v(env);
    if (v != "0" && v != "1") return invalid_argument_error("PAGODA_FUSE_SILU_GEMV={}: expected 0 or 1", env);
    fuse_silu_gemv_ = v == "1";
  }
  if (const char* env = std::getenv("PAGODA_FUSE_FP8_QUANT"); env != nullptr && *env != '\0') {
    const std::string v(env);
    if (v != "0" && v != "1") return invalid_argument_error("PAGODA_FUSE_FP8_QUANT={}: expected 0 or 1", env);
    fuse_fp8_quant_ = v == "1";
  }
  if (const char* env = std::getenv("PAGODA_FP8_LM_HEAD_GEMM"); env != nullptr && *env != '\0') {
    const std::string v(env);
    if (v != "0" && v != "1") return invalid_argument_error("PAGODA_FP8_LM_HEAD_GEMM={}: expected 0 or 1", env);
    fp8_head_gemm_ = v == "1";
  }
  if (const char* env = std::getenv("PAGODA_CUDA_PROFILE_REPLAY"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0)
      return invalid_argument_error("PAGODA_CUDA_PROFILE_REPLAY={}: expected a graph replay number >= 0", env);
    profile_replay_ = v;
  }
  if (const char* env = std::getenv("PAGODA_CUDA_PROFILE_EAGER_STEP"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0)
      return invalid_argument_error("PAGODA_CUDA_PROFILE_EAGER_STEP={}: expected an eager step number >= 0", env);
    profile_eager_step_ = v;
  }
  fast_ = std::make_unique<FastAttention>();
  fast_->set_kv_dtypes(options_.kv_key_dtype, options_.kv_value_dtype);

  const StepLayout layout{options_.max_num_tokens, options_.max_num_seqs, block_table_stride_};
  PAGODA_ASSIGN_OR_RETURN(host_metadata_buffer_, PinnedBuffer::allocate(step_metadata_bytes(layout)));
  PAGODA_ASSIGN_OR_RETURN(device_metadata_buffer_, DeviceBuffer::allocate(step_metadata_bytes(layout)));
  host_ = bind_step_metadata(host_metadata_buffer_.data(), layout);
  device_ = bind_step_metadata(device_metadata_buffer_.data(), layout);
  // Zeros once: a step uploads only the block-table columns its sequences use, so the rest of a row
  // holds ids of earlier steps (or these zeros), valid block ids that no kernel reads.
  std::memset(host_metadata_buffer_.data(), 0, host_metadata_buffer_.bytes());
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(device_metadata_buffer_.data(), 0, device_metadata_buffer_.bytes()));

  // Rows rounded up to 4: the 128-block fp8 GEMM runs on whole groups of 4 rows (fp8_gemm.h).
  const size_t T = static_cast<size_t>(fp8_block_padded_rows(options_.max_num_tokens));
  const size_t H = static_cast<size_t>(c.hidden_size);
  const size_t R = static_cast<size_t>(max_rows_);
  PAGODA_ASSIGN_OR_RETURN(residual_, DeviceBuffer::allocate(T * H * 4));
  PAGODA_ASSIGN_OR_RETURN(normed_, DeviceBuffer::allocate(T * H * 2));
  PAGODA_ASSIGN_OR_RETURN(proj_, DeviceBuffer::allocate(T * H * 2));
  PAGODA_ASSIGN_OR_RETURN(head_normed_, DeviceBuffer::allocate(R * H * 2));
  PAGODA_ASSIGN_OR_RETURN(logits_, DeviceBuffer::allocate(R * c.vocab_size * 4));
  PAGODA_ASSIGN_OR_RETURN(tokens_, DeviceBuffer::allocate(R * 4));
  if (c.mla) {
    PAGODA_ASSIGN_OR_RETURN(deepseek_, CudaDeepseekForward::create(c, std::move(*deepseek_weights),
                                                                   options_.max_num_tokens, stream_));
    return ok_status();
  }
  const size_t D = static_cast<size_t>(c.head_dim);
  const size_t qkv = static_cast<size_t>(c.num_q_heads + 2 * c.num_kv_heads) * D;
  const size_t I = static_cast<size_t>(c.intermediate_size);
  PAGODA_ASSIGN_OR_RETURN(qkv_, DeviceBuffer::allocate(T * qkv * 2));
  PAGODA_ASSIGN_OR_RETURN(attn_, DeviceBuffer::allocate(T * c.num_q_heads * D * 2));
  if (FastAttention::compiled_in()) {
    PAGODA_ASSIGN_OR_RETURN(q_contig_, DeviceBuffer::allocate(T * c.num_q_heads * D * 2));
  }
  PAGODA_ASSIGN_OR_RETURN(gate_up_, DeviceBuffer::allocate(T * 2 * I * 2));
  PAGODA_ASSIGN_OR_RETURN(act_, DeviceBuffer::allocate(T * I * 2));
  if (weights_.has_fp8()) {
    if (options_.fp8_weights && config_.fp8)
      return invalid_argument_error("--quantization fp8: the checkpoint is already quantized ({})",
                                    config_.fp8->describe());
    PAGODA_ASSIGN_OR_RETURN(fp8_gemm_, Fp8Gemm::create());
    const size_t widest = std::max({H, static_cast<size_t>(c.num_q_heads) * D, I});
    fp8_x_width_ = static_cast<int64_t>(widest);
    PAGODA_ASSIGN_OR_RETURN(fp8_x_, DeviceBuffer::allocate(T * widest));
    PAGODA_ASSIGN_OR_RETURN(fp8_x_scales_, DeviceBuffer::allocate(T * ((widest + 127) / 128) * sizeof(float)));
    // The epilogue mode's f32 scratch is sized now, before any graph is captured.
    PAGODA_RETURN_IF_ERROR(fp8_gemm_->reserve(static_cast<int32_t>(T), static_cast<int32_t>(std::max(qkv, 2 * I))));
  }
  for (const CudaLayerWeights& w : weights_.layers)
    for (const CudaFp8Weight* f : {&w.qkv_fp8, &w.o_fp8, &w.gate_up_fp8, &w.down_fp8})
      weights_block128_ = weights_block128_ || (f->data != nullptr && f->block128);
  if (const char* env = std::getenv("PAGODA_TWO_BATCH_OVERLAP"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || (v > 0 && v < kTwoBatchSmallestBucket) || v > (1 << 20))
      return invalid_argument_error("PAGODA_TWO_BATCH_OVERLAP={}: expected 0 (off) or a bucket of at least {}", env,
                                    kTwoBatchSmallestBucket);
    if (v > 0 && FastAttention::compiled_in()) {
      PAGODA_ASSIGN_OR_RETURN(two_batch_, TwoBatchOverlap::create(static_cast<int32_t>(v), weights_.has_fp8(),
                                                                  static_cast<int32_t>(T),
                                                                  static_cast<int32_t>(std::max(qkv, 2 * I)),
                                                                  options_.kv_key_dtype, options_.kv_value_dtype));
    }
  }

  const std::vector<float> inv_freq =
      rope_inverse_frequencies(c.head_dim, c.rope_theta, c.rope_llama3 ? &*c.rope_llama3 : nullptr);
  PAGODA_ASSIGN_OR_RETURN(inv_freq_, DeviceBuffer::allocate(inv_freq.size() * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(inv_freq_.data(), inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice));
  return ok_status();
}

KvPoolShape CudaModel::kv_pool_shape(int32_t num_blocks) const {
  // The latent pool (MLA) has one dtype: the key's.
  if (config_.mla) {
    KvPoolShape shape =
        model_kv_pool_shape(config_, num_blocks, options_.block_size, options_.kv_key_dtype, options_.kv_key_dtype);
    // Swizzled pages where they apply (bf16, 64-value column blocks, pages of whole swizzle atoms) and are
    // asked for or, unasked, where the bulk-copy kernel reads them; else token-major.
    const bool bf16 = shape.key_dtype == DType::kBF16;
    if (runtime::mla_swizzled_pages_apply(shape.head_dim, bf16, shape.block_size))
      shape.latent_pages = options_.mla_latent_pages.value_or(runtime::mla_automatic_latent_pages(
          shape.head_dim, bf16, shape.block_size, config_.num_q_heads));
    return shape;
  }
  KvPoolShape shape{config_.num_layers, num_blocks, options_.block_size, config_.num_kv_heads, config_.head_dim,
                    options_.kv_key_dtype, options_.kv_value_dtype};
  shape.cross_layer_share = options_.kv_cross_layer_share;
  return shape;
}

Status CudaModel::validate(const ForwardBatch& batch, const CudaKvPool& pool) const {
  const KvPoolShape& ps = pool.shape();
  PAGODA_RETURN_IF_ERROR(runtime::check_pool_matches(ps, kv_pool_shape(ps.num_blocks)));
  runtime::BatchLimits limits;
  limits.vocab_size = config_.vocab_size;
  limits.max_num_tokens = options_.max_num_tokens;
  limits.max_num_seqs = options_.max_num_seqs;
  limits.max_sequence_tokens = max_model_len_;
  limits.deferred_tokens = async_slot_ >= 0;
  return runtime::validate_forward_batch(batch, ps, limits);
}

int64_t CudaModel::mla_prefill_steps() const { return deepseek_ ? deepseek_->prefill_steps() : 0; }

void CudaModel::set_mla_prefill_tuning(const CudaMlaPrefill::Tuning& tuning) {
  if (deepseek_) deepseek_->set_prefill_tuning(tuning);
}

int32_t CudaModel::graph_bucket(const ForwardBatch& batch) const {
  // A step with per-head holes runs eagerly: no decode graph passes holes to the attention.
  if (step_has_holes_) return 0;
  return graph_bucket_without_holes(batch);
}

int32_t CudaModel::graph_bucket_without_holes(const ForwardBatch& batch) const {
  if (!options_.use_cuda_graphs || (deepseek_ && !deepseek_->graph_capable())) return 0;
  int32_t cap = options_.max_graph_batch;
  if (deepseek_ && config_.moe && options_.moe_max_graph_batch > 0)
    cap = cap > 0 ? std::min(cap, options_.moe_max_graph_batch) : options_.moe_max_graph_batch;
  return choose_graph_bucket(batch, buckets_, cap);
}

StatusOr<CudaModel::StepShape> CudaModel::plan(const ForwardBatch& batch) {
  StepShape step;
  step.bucket = graph_bucket(batch);
  const int32_t T = batch.num_tokens();
  step.num_tokens = step.bucket > 0 ? step.bucket : T;
  const int32_t rows = fill_step_metadata(batch, options_.block_size, config_.sliding_window, block_table_stride_,
                                          step.num_tokens, host_);
  step.num_rows = rows;
  const size_t n = static_cast<size_t>(step.num_tokens);
  auto copy = [&](void* dst, const void* src, size_t bytes) {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
  };
  PAGODA_CUDA_RETURN_IF_ERROR(copy(device_.token_ids, host_.token_ids, n * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(copy(device_.positions, host_.positions, n * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(copy(device_.slots, host_.slots, n * 8));
  PAGODA_CUDA_RETURN_IF_ERROR(copy(device_.token_sequence, host_.token_sequence, n * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(copy(device_.kv_begin, host_.kv_begin, n * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(copy(device_.kv_end, host_.kv_end, n * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(copy(device_.logit_rows, host_.logit_rows, std::max<size_t>(n, rows) * 4));
  // Only the columns some sequence uses: a row of block_table_stride_ entries covers max_model_len
  // (8,192 of them at 131,072 tokens in blocks of 16), while a step's sequences need their own lengths.
  const size_t pitch = static_cast<size_t>(block_table_stride_) * 4;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
      device_.block_tables, pitch, host_.block_tables, pitch,
      static_cast<size_t>(step_block_table_width(batch, options_.block_size)) * 4, batch.sequences.size(),
      cudaMemcpyHostToDevice, stream_));
  return step;
}

Status CudaModel::run_layers(int32_t T, const CudaKvPool& pool, bool fast_attention, const KvLayerWaits* waits,
                             bool holes) {
  const int32_t H = config_.hidden_size;
  float* residual = residual_.as<float>();
  if (comm_ != nullptr) {
    PAGODA_RETURN_IF_ERROR(embed_sharded(T, residual));
  } else {
    PAGODA_CUDA_RETURN_IF_ERROR(embedding_gather(weights_.embed_tokens, device_.token_ids, T, H, residual, stream_));
  }
  if (deepseek_) {
    const DeviceAttentionPlan attention{device_.token_sequence, device_.kv_begin, device_.kv_end,
                                        device_.block_tables, block_table_stride_, T};
    PAGODA_RETURN_IF_ERROR(
        deepseek_->run_layers(T, pool, device_, attention, *gemm_, residual, normed_.as<bf16>(), proj_.as<bf16>()));
  } else if (step_two_batch_) {
    // Two lanes (two_batch_overlap.h): half A on the model's stream, half B on the overlap's; their
    // attentions take turns, A's of layer l after B's of layer l - 1, B's after A's of layer l.
    TwoBatchOverlap& o = *two_batch_;
    const int32_t rows_a = TwoBatchOverlap::first_half_rows(T);
    Lane a{0, rows_a, stream_, fast_.get(), gemm_.get(), fp8_gemm_.get(), nullptr, o.a_done()};
    const Lane b{rows_a, T - rows_a, o.stream(), &o.attention(), &o.gemm(), o.fp8_gemm(), o.a_done(), o.b_done()};
    PAGODA_RETURN_IF_ERROR(o.fork(stream_));
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      a.attention_after = l == 0 ? nullptr : o.b_done();
      PAGODA_RETURN_IF_ERROR(run_layer(l, a, pool, fast_attention, waits, holes));
      PAGODA_RETURN_IF_ERROR(run_layer(l, b, pool, fast_attention, waits, holes));
    }
    PAGODA_RETURN_IF_ERROR(o.join(stream_));
  } else {
    const Lane whole{0, T, stream_, fast_.get(), gemm_.get(), fp8_gemm_.get()};
    for (int32_t l = 0; l < config_.num_layers; ++l)
      PAGODA_RETURN_IF_ERROR(run_layer(l, whole, pool, fast_attention, waits, holes));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(add_residual(residual, proj_.as<bf16>(), static_cast<int64_t>(T) * H, stream_));
  return ok_status();
}

Status CudaModel::run_layer(int32_t l, const Lane& lane, const CudaKvPool& pool, bool fast_attention,
                            const KvLayerWaits* waits, bool holes) {
  const ModelConfig& c = config_;
  const int32_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int32_t q_width = c.num_q_heads * D, kv_width = c.num_kv_heads * D;
  const int32_t qkv_width = q_width + 2 * kv_width;
  const int32_t T = lane.T;
  const cudaStream_t stream = lane.stream;
  const size_t r0 = static_cast<size_t>(lane.row0);
  // The lane's rows of every [rows, width] scratch buffer and of the step's per-row metadata.
  float* residual = residual_.as<float>() + r0 * H;
  bf16* normed = normed_.as<bf16>() + r0 * H;
  bf16* qkv = qkv_.as<bf16>() + r0 * qkv_width;
  bf16* attn = attn_.as<bf16>() + r0 * q_width;
  bf16* proj = proj_.as<bf16>() + r0 * H;
  bf16* gate_up = gate_up_.as<bf16>() + r0 * 2 * I;
  bf16* act = act_.as<bf16>() + r0 * I;
  const int32_t* positions = device_.positions + r0;
  const int64_t* slots = device_.slots + r0;
  // The fused fp8 inputs: the lane's part of fp8_x_ (lane_fp8_input).
  uint8_t* fp8_input = lane_fp8_input(lane);
  float* fp8_scales = fp8_x_scales_.data() != nullptr ? fp8_x_scales_.as<float>() + r0 : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // The builtin kernel maps rows to sequences through the step's metadata: whole steps only.
  if (lane.row0 != 0 && !fast_attention) return internal_error("cuda: a lane from row {} without the fast attention", r0);
  const DeviceAttentionPlan attention{device_.token_sequence, device_.kv_begin, device_.kv_end,
                                      device_.block_tables, block_table_stride_, T};

  const CudaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  // The previous layer's MLP output joins the residual inside the norm.
  // With fp8 GEMM inputs the norm writes them quantized (fp8_x_) instead of normed (nothing else reads it).
  if (fuse_fp8_input(normed, T, w.qkv_fp8, H)) {
    PAGODA_CUDA_RETURN_IF_ERROR(add_rmsnorm_fp8(residual, l == 0 ? nullptr : proj, w.input_norm, T, H,
                                                c.rms_norm_eps, fp8_input, fp8_scales, stream));
    PAGODA_RETURN_IF_ERROR(project_quantized(lane, w.qkv_fp8, qkv_width, H, qkv));
  } else {
    if (l == 0) {
      PAGODA_CUDA_RETURN_IF_ERROR(rmsnorm(residual, nullptr, w.input_norm, normed, T, H, c.rms_norm_eps, stream));
    } else {
      PAGODA_CUDA_RETURN_IF_ERROR(add_rmsnorm(residual, proj, w.input_norm, normed, T, H, c.rms_norm_eps, stream));
    }
    PAGODA_RETURN_IF_ERROR(project(lane, normed, w.qkv_proj, w.qkv_fp8, qkv_width, H, qkv));
  }
  if (w.qkv_bias != nullptr)
    PAGODA_CUDA_RETURN_IF_ERROR(add_bias(qkv, qkv_width, T, qkv_width, w.qkv_bias, stream));
  if (c.qk_norm) {
    PAGODA_CUDA_RETURN_IF_ERROR(head_rmsnorm(qkv, qkv_width, T, c.num_q_heads, D, w.q_norm, c.rms_norm_eps, stream));
    PAGODA_CUDA_RETURN_IF_ERROR(
        head_rmsnorm(qkv + q_width, qkv_width, T, c.num_kv_heads, D, w.k_norm, c.rms_norm_eps, stream));
  }
  const float* inv_freq = inv_freq_.as<float>();
  // The k heads follow the q heads in each qkv row (head h at h * D): one launch rotates both, and for
  // the fast attention also writes q contiguous (its input).
  bf16* q_contiguous = fast_attention ? q_contig_.as<bf16>() + r0 * q_width : nullptr;
  const DevicePagedKvLayer kv = pool.layer(l);
  const DeviceKvShare share = pool.share(l);  // null norms: not a shared layer
  // The checkpoint's fp8 KV scales when present (0: per-vector amax), as CpuModel.
  const KvWriteFixedScales fixed_scales{w.k_scale, w.v_scale};
  // With PAGODA_FUSE_ROPE_KV=1, decode-sized steps of unshared layers rotate and write the KV in one launch.
  const bool fused_kv_write = fuse_rope_kv_ && T <= kGemvMaxRows && share.norms == nullptr;
  if (fused_kv_write) {
    // This layer's host-tier copies land (and write-backs leave blocks this step may write) before its KV is touched.
    if (waits != nullptr) PAGODA_CUDA_RETURN_IF_ERROR(waits->wait_layer(stream, l));
    PAGODA_CUDA_RETURN_IF_ERROR(rope_qk_kv_write(qkv, qkv_width, positions, slots, T, c.num_q_heads, inv_freq,
                                                 q_contiguous, kv, fixed_scales, stream));
  } else {
    PAGODA_CUDA_RETURN_IF_ERROR(rope_qk(qkv, qkv_width, positions, T, c.num_q_heads, c.num_kv_heads, D, inv_freq,
                                        q_contiguous, stream));
    if (waits != nullptr) PAGODA_CUDA_RETURN_IF_ERROR(waits->wait_layer(stream, l));
  }
  if (share.norms != nullptr) {
    if (fast_attention || holes || (kv_scores_ != nullptr && kv_scores_->active()))
      return unimplemented_error("cuda: --kv-cross-layer-share with the fast attention or token eviction");
    PAGODA_CUDA_RETURN_IF_ERROR(
        kv_write_shared(qkv + q_width, qkv + q_width + kv_width, qkv_width, slots, T, kv, share, stream));
    PAGODA_CUDA_RETURN_IF_ERROR(
        paged_attention_shared(qkv, qkv_width, kv, attention, c.num_q_heads, scale, share, attn, stream));
  } else {
    if (!fused_kv_write)
      PAGODA_CUDA_RETURN_IF_ERROR(
          kv_write(qkv + q_width, qkv + q_width + kv_width, qkv_width, slots, T, kv, fixed_scales, stream));
    // The scores come from the decode kernel when choose_kernel_scores set rows for them, else from the pass.
    const bool kernel_mass = fast_attention && kernel_scores_ != nullptr;
    if (kv_scores_ != nullptr && kv_scores_->active() && !kernel_mass)
      PAGODA_RETURN_IF_ERROR(kv_scores_->score_layer(l, qkv, qkv_width, scale, kv, device_.block_tables, stream));
    if (lane.attention_after != nullptr)
      PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, lane.attention_after, 0));
    if (fast_attention) {
      float* scores = kernel_mass ? kernel_scores_ : nullptr;
      if (holes) {
        PAGODA_RETURN_IF_ERROR(lane.fast->run(kv, q_contiguous, attn, stream, fixed_scales, kv_scores_->hole_begin(l),
                                              kv_scores_->hole_end(), scores, kernel_score_stride_));
      } else {
        PAGODA_RETURN_IF_ERROR(
            lane.fast->run(kv, q_contiguous, attn, stream, fixed_scales, nullptr, nullptr, scores, kernel_score_stride_));
      }
      if (kernel_mass) PAGODA_RETURN_IF_ERROR(kv_scores_->mass_layer(l, kernel_scores_, kernel_score_stride_, stream));
    } else if (holes) {
      DeviceAttentionPlan with_holes = attention;
      with_holes.hole_begin = kv_scores_->hole_begin(l);
      with_holes.hole_end = kv_scores_->hole_end();
      PAGODA_CUDA_RETURN_IF_ERROR(paged_attention(qkv, qkv_width, kv, with_holes, c.num_q_heads, scale, attn, stream));
    } else {
      PAGODA_CUDA_RETURN_IF_ERROR(paged_attention(qkv, qkv_width, kv, attention, c.num_q_heads, scale, attn, stream));
    }
    if (lane.attention_done != nullptr) PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.attention_done, stream));
  }
  PAGODA_RETURN_IF_ERROR(project(lane, attn, w.o_proj, w.o_fp8, H, q_width, proj));
  if (w.o_bias != nullptr) PAGODA_CUDA_RETURN_IF_ERROR(add_bias(proj, H, T, H, w.o_bias, stream));
  if (comm_ != nullptr)
    PAGODA_RETURN_IF_ERROR(comm_->enqueue_all_reduce_sum(proj, static_cast<size_t>(T) * H, DType::kBF16, stream));
  bool act_done = false;  // act written by the gate_up GEMV's epilogue (gate_up_silu_gemv)
  if (fuse_fp8_input(normed, T, w.gate_up_fp8, H)) {
    PAGODA_CUDA_RETURN_IF_ERROR(add_rmsnorm_fp8(residual, proj, w.post_attention_norm, T, H, c.rms_norm_eps,
                                                fp8_input, fp8_scales, stream));
    PAGODA_RETURN_IF_ERROR(project_quantized(lane, w.gate_up_fp8, 2 * I, H, gate_up));
  } else {
    PAGODA_CUDA_RETURN_IF_ERROR(add_rmsnorm(residual, proj, w.post_attention_norm, normed, T, H, c.rms_norm_eps, stream));
    PAGODA_ASSIGN_OR_RETURN(act_done, gate_up_silu_gemv(lane, w, normed, act));
    if (!act_done) PAGODA_RETURN_IF_ERROR(project(lane, normed, w.gate_up_proj, w.gate_up_fp8, 2 * I, H, gate_up));
  }
  if (w.gate_up_bias != nullptr && !act_done)
    PAGODA_CUDA_RETURN_IF_ERROR(add_bias(gate_up, 2 * I, T, 2 * I, w.gate_up_bias, stream));
  if (fuse_fp8_input(act, T, w.down_fp8, I)) {
    PAGODA_CUDA_RETURN_IF_ERROR(silu_mul_fp8(gate_up, T, I, fp8_input, fp8_scales, stream));
    PAGODA_RETURN_IF_ERROR(project_quantized(lane, w.down_fp8, H, I, proj));
  } else {
    if (!act_done) PAGODA_CUDA_RETURN_IF_ERROR(silu_mul(gate_up, act, T, I, stream));
    PAGODA_RETURN_IF_ERROR(project(lane, act, w.down_proj, w.down_fp8, H, I, proj));
  }
  if (w.down_bias != nullptr) PAGODA_CUDA_RETURN_IF_ERROR(add_bias(proj, H, T, H, w.down_bias, stream));
  if (comm_ != nullptr)
    PAGODA_RETURN_IF_ERROR(comm_->enqueue_all_reduce_sum(proj, static_cast<size_t>(T) * H, DType::kBF16, stream));
  return ok_status();
}

bool CudaModel::takes_gemv(int32_t T, const bf16* x, const bf16* w, const CudaFp8Weight& fp8, int32_t k) const {
  if (fp8.data == nullptr) return T <= gemv_rows_bf16_ && gemv_supported(T, k, false, x, w);
  return T <= gemv_rows_fp8_ && fp8.input_scale == nullptr && gemv_supported(T, k, true, x, fp8.data);
}

StatusOr<bool> CudaModel::gate_up_silu_gemv(const Lane& lane, const CudaLayerWeights& w, const bf16* normed,
                                            bf16* act) {
  const int32_t T = lane.T, H = config_.hidden_size, I = config_.intermediate_size;
  if (!fuse_silu_gemv_ || w.gate_up_bias != nullptr || fuse_fp8_input(act, T, w.down_fp8, I) ||
      !takes_gemv(T, normed, w.gate_up_proj, w.gate_up_fp8, H))
    return false;
  const CudaFp8Weight& fp8 = w.gate_up_fp8;
  if (fp8.data == nullptr) {
    PAGODA_CUDA_RETURN_IF_ERROR(gemv_bf16_silu(normed, T, w.gate_up_proj, I, H, act, lane.stream));
  } else {
    const int32_t block_stride = fp8.block128 ? fp8_block_weight_scale_stride(H) : 0;
    PAGODA_CUDA_RETURN_IF_ERROR(
        gemv_fp8_silu(normed, T, fp8.data, fp8.scales, block_stride, I, H, act, lane.stream, gemv_fp8_depth_));
  }
  ++gemv_silu_launches_;
  return true;
}

Status CudaModel::project(const Lane& lane, const bf16* x, const bf16* w, const CudaFp8Weight& fp8, int32_t n,
                          int32_t k, bf16* y) {
  const int32_t T = lane.T;
  const cudaStream_t stream = lane.stream;
  if (fp8.data == nullptr) {
    if (takes_gemv(T, x, w, fp8, k)) {
      PAGODA_CUDA_RETURN_IF_ERROR(gemv_bf16(x, T, w, n, k, y, false, stream));
      return ok_status();
    }
    return lane.gemm->linear(x, T, w, n, k, y, GemmOutput::kBF16, stream);
  }
  if (takes_gemv(T, x, w, fp8, k)) {
    // Weight-only at decode sizes: the activations stay bf16 (gemv.h). Static input scales are the
    // checkpoint's arithmetic (its activations rounded at a calibrated scale) and keep the GEMM path.
    const int32_t block_stride = fp8.block128 ? fp8_block_weight_scale_stride(k) : 0;
    PAGODA_CUDA_RETURN_IF_ERROR(gemv_fp8(x, T, fp8.data, fp8.scales, block_stride, n, k, y, stream, gemv_fp8_depth_));
    return ok_status();
  }
  const size_t r0 = static_cast<size_t>(lane.row0);
  uint8_t* q = lane_fp8_input(lane);
  float* scales = fp8_x_scales_.as<float>() + r0;
  if (fp8.block128) {
    // Token-fastest group scales padded to whole groups of rows: whole steps only (two_batch_allowed).
    if (lane.row0 != 0) return internal_error("cuda: 128-block fp8 projections in a lane from row {}", r0);
    const int32_t rows = fp8_block_padded_rows(T);
    PAGODA_CUDA_RETURN_IF_ERROR(quantize_fp8_per_token_group128(x, T, rows, k, q, scales, rows, stream));
    return lane.fp8_gemm->linear_block128(q, scales, T, fp8.data, fp8.scales, n, k, y, stream);
  }
  if (fp8.input_scale != nullptr) {
    PAGODA_CUDA_RETURN_IF_ERROR(quantize_fp8_static(x, T, k, fp8.input_scale, q, scales, stream));
  } else {
    PAGODA_CUDA_RETURN_IF_ERROR(quantize_fp8_per_token(x, T, k, q, scales, stream));
  }
  return fp8_linear(lane, q, scales, fp8, n, k, y);
}

bool CudaModel::fp8_mma_gemv_applies(int32_t T, const CudaFp8Weight& fp8, int32_t k) const {
  // fp8_x_ rows are k bytes from a 256-byte aligned base, so only k decides the activations' alignment.
  return T <= fp8_mma_gemv_rows_ && fp8.data != nullptr && !fp8.block128 && fp8_x_.data() != nullptr &&
         fp8_mma_gemv_supported(T, k, fp8_x_.data(), fp8.data);
}

Status CudaModel::fp8_linear(const Lane& lane, const uint8_t* q, const float* scales, const CudaFp8Weight& fp8,
                             int32_t n, int32_t k, bf16* y) {
  if (fp8_mma_gemv_applies(lane.T, fp8, k) && fp8_mma_gemv_supported(lane.T, k, q, fp8.data)) {
    ++fp8_mma_gemv_launches_;
    PAGODA_CUDA_RETURN_IF_ERROR(fp8_mma_gemv(q, scales, lane.T, fp8.data, fp8.scales, n, k, y, false, lane.stream));
    return ok_status();
  }
  return lane.fp8_gemm->linear(q, scales, lane.T, fp8.data, fp8.scales, n, k, y, lane.stream);
}

bool CudaModel::fuse_fp8_input(const bf16* x, int32_t T, const CudaFp8Weight& fp8, int32_t k) const {
  if (!fuse_fp8_quant_ || fp8.data == nullptr || fp8.block128 || fp8.input_scale != nullptr) return false;
  // project()'s weight-only GEMV branch takes bf16 activations: no quantization to fuse.
  return !takes_gemv(T, x, nullptr, fp8, k);
}

uint8_t* CudaModel::lane_fp8_input(const Lane& lane) const {
  // fp8_x_ holds one projection input at a time per lane, at that projection's width k (hidden or
  // intermediate). Two lanes run different projections at once, so lane B's part starts at its first
  // row times the widest k: lane A's [T_a, k] input never reaches it, whatever k each lane is at.
  if (fp8_x_.data() == nullptr) return nullptr;
  return fp8_x_.as<uint8_t>() + static_cast<size_t>(lane.row0) * static_cast<size_t>(fp8_x_width_);
}

Status CudaModel::project_quantized(const Lane& lane, const CudaFp8Weight& fp8, int32_t n, int32_t k, bf16* y) {
  ++fused_fp8_quant_launches_;
  const size_t r0 = static_cast<size_t>(lane.row0);
  return fp8_linear(lane, lane_fp8_input(lane), fp8_x_scales_.as<float>() + r0, fp8, n, k, y);
}

// kUnimplemented: no e4m3 per-channel lm_head, switched off, a vocabulary or width not a multiple of 16,
// or no fp8 GEMM with f32 output on this device (then off for good); run_head takes the bf16 GEMM. The
// head runs after every layer, so the projections' fp8 input buffer is free (rows <= max_rows_ <=
// max_num_tokens, width hidden <= its width).
Status CudaModel::run_head_fp8_gemm(const bf16* normed, int32_t num_rows) {
  const ModelConfig& c = config_;
  const CudaFp8Weight& head = weights_.lm_head_fp8;
  // cuBLASLt's fp8 GEMMs need n and k in multiples of 16 (fp8_gemm.h): other vocabularies keep the bf16 GEMM.
  if (!fp8_head_gemm_ || head.data == nullptr || head.block128 || fp8_gemm_ == nullptr || c.vocab_size % 16 != 0 ||
      c.hidden_size % 16 != 0)
    return unimplemented_error("no fp8 lm_head GEMM");
  uint8_t* q = fp8_x_.as<uint8_t>();
  float* scales = fp8_x_scales_.as<float>();
  PAGODA_CUDA_RETURN_IF_ERROR(quantize_fp8_per_token(normed, num_rows, c.hidden_size, q, scales, stream_));
  Status s = fp8_gemm_->linear_f32(q, scales, num_rows, head.data, head.scales, c.vocab_size, c.hidden_size,
                                   logits_.as<float>(), stream_);
  if (s.code() == StatusCode::kUnimplemented) fp8_head_gemm_ = false;
  return s;
}

Status CudaModel::run_head(int32_t row_begin, int32_t num_rows) {
  const ModelConfig& c = config_;
  bf16* normed = head_normed_.as<bf16>();
  PAGODA_CUDA_RETURN_IF_ERROR(rmsnorm(residual_.as<float>(), device_.logit_rows + row_begin, weights_.final_norm,
                                      normed, num_rows, c.hidden_size, c.rms_norm_eps, stream_));
  if (comm_ != nullptr) {
    PAGODA_RETURN_IF_ERROR(head_sharded(normed, num_rows));
  } else if (const CudaFp8Weight& head = weights_.lm_head_fp8;
             head.data != nullptr && num_rows <= gemv_rows_fp8_ &&
             gemv_supported(num_rows, c.hidden_size, true, normed, head.data)) {
    const int32_t block_stride = head.block128 ? fp8_block_weight_scale_stride(c.hidden_size) : 0;
    PAGODA_CUDA_RETURN_IF_ERROR(gemv_fp8_logits(normed, num_rows, head.data, head.scales, block_stride,
                                                c.vocab_size, c.hidden_size, logits_.as<float>(), stream_));
  } else if (fp8_mma_gemv_applies(num_rows, weights_.lm_head_fp8, c.hidden_size)) {
    // The e4m3 lm_head on the tensor-core GEMV: per-token activations, as the fp8 GEMM head at more rows. The
    // head runs after every layer, so the projections' fp8 input buffer is free.
    const CudaFp8Weight& head = weights_.lm_head_fp8;
    uint8_t* q = fp8_x_.as<uint8_t>();
    float* scales = fp8_x_scales_.as<float>();
    PAGODA_CUDA_RETURN_IF_ERROR(quantize_fp8_per_token(normed, num_rows, c.hidden_size, q, scales, stream_));
    ++fp8_mma_gemv_launches_;
    PAGODA_CUDA_RETURN_IF_ERROR(fp8_mma_gemv(q, scales, num_rows, head.data, head.scales, c.vocab_size,
                                             c.hidden_size, logits_.data(), true, stream_));
  } else if (num_rows <= gemv_rows_bf16_ && gemv_supported(num_rows, c.hidden_size, false, normed, weights_.lm_head)) {
    PAGODA_CUDA_RETURN_IF_ERROR(gemv_bf16(normed, num_rows, weights_.lm_head, c.vocab_size, c.hidden_size,
                                          logits_.data(), true, stream_));
  } else if (Status fp8 = run_head_fp8_gemm(normed, num_rows); fp8.ok()) {
    // The e4m3 lm_head as a GEMM: the same head as the GEMV rows'.
  } else if (fp8.code() != StatusCode::kUnimplemented) {
    return fp8;
  } else {
    PAGODA_RETURN_IF_ERROR(gemm_->linear(normed, num_rows, weights_.lm_head, c.vocab_size, c.hidden_size,
                                         logits_.data(), GemmOutput::kF32, stream_));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(argmax_rows(logits_.as<float>(), num_rows, c.vocab_size, tokens_.as<int32_t>(), stream_));
  return ok_status();
}

Status CudaModel::attach_tensor_parallel(const TensorShard& shard, parallel::DeviceCommunicator* comm) {
  if (comm == nullptr || comm->rank() != shard.rank || comm->size() != shard.size)
    return invalid_argument_error("attach_tensor_parallel: the communicator is not rank {} of {}", shard.rank,
                                  shard.size);
  if (deepseek_) return unimplemented_error("attach_tensor_parallel: {} has no sharded forward", config_.architecture_name);
  const size_t rows = static_cast<size_t>(max_rows_), chunk = static_cast<size_t>(shard.vocab_chunk);
  PAGODA_ASSIGN_OR_RETURN(shard_logits_, DeviceBuffer::allocate(rows * chunk * sizeof(float)));
  PAGODA_ASSIGN_OR_RETURN(gathered_logits_,
                          DeviceBuffer::allocate(static_cast<size_t>(shard.size) * rows * chunk * sizeof(float)));
  shard_ = shard;
  comm_ = comm;
  return ok_status();
}

Status CudaModel::embed_sharded(int32_t T, float* residual) {
  const int32_t H = config_.hidden_size;
  PAGODA_CUDA_RETURN_IF_ERROR(embedding_gather_shard(weights_.embed_tokens, device_.token_ids, T, H,
                                                     shard_.vocab_begin, shard_.vocab_end, residual, stream_));
  return comm_->enqueue_all_reduce_sum(residual, static_cast<size_t>(T) * H, DType::kF32, stream_);
}

Status CudaModel::head_sharded(const bf16* normed, int32_t num_rows) {
  const int32_t V = config_.vocab_size, H = config_.hidden_size, chunk = shard_.vocab_chunk;
  const int32_t local = shard_.vocab_end - shard_.vocab_begin;
  const size_t rows = static_cast<size_t>(num_rows);
  // The rank's logits packed [rows, local] in a buffer of rows * chunk (the last rank's local may be smaller).
  if (local > 0) {
    PAGODA_RETURN_IF_ERROR(gemm_->linear(normed, num_rows, weights_.lm_head, local, H, shard_logits_.data(),
                                         GemmOutput::kF32, stream_));
  }
  PAGODA_RETURN_IF_ERROR(comm_->enqueue_all_gather(shard_logits_.data(), gathered_logits_.data(),
                                                   rows * static_cast<size_t>(chunk), DType::kF32, stream_));
  for (int32_t k = 0; k < shard_.size; ++k) {
    const int32_t begin = std::min(V, k * chunk), width = std::min(V, begin + chunk) - begin;
    if (width <= 0) continue;
    const float* src = gathered_logits_.as<float>() + static_cast<size_t>(k) * rows * chunk;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(logits_.as<float>() + begin, static_cast<size_t>(V) * sizeof(float),
                                                  src, static_cast<size_t>(width) * sizeof(float),
                                                  static_cast<size_t>(width) * sizeof(float), rows,
                                                  cudaMemcpyDeviceToDevice, stream_));
  }
  return ok_status();
}

bool CudaModel::two_batch_allowed(int32_t bucket) const {
  // Lanes from a middle row need the fast attention (fast_attention_usable: no cross-layer sharing),
  // per-token fp8 input scales (not 128-block groups), and no per-row side work (scores, tensor parallel).
  return two_batch_ != nullptr && bucket >= two_batch_->min_bucket() && comm_ == nullptr && !weights_block128_ &&
         (kv_scores_ == nullptr || !kv_scores_->active());
}

bool CudaModel::fast_attention_usable() const {
  // Quantized KV too: backend/cuda/attention decodes fp8 / int8 / int4 pools (FastAttention
  // answers false for the steps it cannot run, and the builtin kernel dequantizes).
  // Cross-layer sharing: only the builtin kernel reads the members' norms (kv_share_ops.h).
  return options_.fast_attention && !deepseek_ && options_.kv_cross_layer_share == 1;
}

namespace {
// The most score-row memory the decode kernel's mass may take (graph or eager); more: the scoring pass.
constexpr size_t kMaxKernelScoreBytes = size_t{256} << 20;
}  // namespace

Status CudaModel::choose_kernel_scores(bool scoring, bool fast, int32_t rows, bool graph, const ForwardBatch& batch) {
  kernel_scores_ = nullptr;
  kernel_score_stride_ = 0;
  if (!scoring || !fast || !kernel_mass_ || deepseek_ || !fast_->writes_scores()) return ok_status();
  const size_t row_bytes = static_cast<size_t>(config_.num_q_heads) * sizeof(float);
  if (graph) {
    // One stride for every replay: the longest context a block table can hold.
    const int64_t stride = static_cast<int64_t>(block_table_stride_) * options_.block_size;
    if (!mass_graph_tried_) {
      mass_graph_tried_ = true;
      const size_t want = static_cast<size_t>(buckets_.back()) * row_bytes * static_cast<size_t>(stride);
      StatusOr<DeviceBuffer> buffer = DeviceBuffer::allocate(std::min(want, kMaxKernelScoreBytes));
      if (buffer.ok()) mass_graph_ = std::move(buffer).value();  // else: the pass, always
    }
    if (static_cast<size_t>(rows) * row_bytes * static_cast<size_t>(stride) > mass_graph_.bytes()) return ok_status();
    kernel_scores_ = mass_graph_.as<float>();
    kernel_score_stride_ = stride;
  } else {
    int64_t stride = 1;
    for (const SequenceSlice& s : batch.sequences)
      stride = std::max<int64_t>(stride, static_cast<int64_t>(s.num_cached_tokens) + s.num_new_tokens);
    const size_t want = static_cast<size_t>(rows) * row_bytes * static_cast<size_t>(stride);
    if (want > kMaxKernelScoreBytes) return ok_status();
    if (mass_step_.bytes() < want) {
      StatusOr<DeviceBuffer> buffer = DeviceBuffer::allocate(std::max(want, mass_step_.bytes() * 2));
      if (!buffer.ok()) return ok_status();  // the pass needs no rows
      mass_step_ = std::move(buffer).value();
    }
    kernel_scores_ = mass_step_.as<float>();
    kernel_score_stride_ = stride;
  }
  ++kernel_mass_steps_;
  return ok_status();
}

Status CudaModel::capture_graph(int32_t bucket, bool scoring, const CudaKvPool& pool, bool fast_attention) {
  cudaGraph_t graph = nullptr;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  Status status = run_layers(bucket, pool, fast_attention);
  if (status.ok()) status = run_head(0, bucket);
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (!status.ok() || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    PAGODA_RETURN_IF_ERROR(status.with_context("capturing a decode graph"));
    PAGODA_CUDA_RETURN_IF_ERROR(end);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiate = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  PAGODA_CUDA_RETURN_IF_ERROR(instantiate);
  const int32_t key = graph_key(bucket, scoring);
  if (auto it = graphs_.find(key); it != graphs_.end()) cudaGraphExecDestroy(it->second.exec);
  graphs_[key] = Graph{exec, &pool, fast_attention, kernel_scores_ != nullptr, step_two_batch_};
  return ok_status();
}

Status CudaModel::run(const ForwardBatch& batch, CudaKvPool& pool, Output output, std::vector<float>* logits,
                      std::vector<int32_t>* tokens) {
  // The host tier's copies for this step; whatever happens below, the stream waits for all of them before run() returns.
  const KvLayerWaits waits = std::move(layer_waits_);
  layer_waits_ = KvLayerWaits{};
  struct WaitAllOnExit {
    const KvLayerWaits& waits;
    cudaStream_t stream;
    ~WaitAllOnExit() { waits.wait_all(stream); }
  } wait_all_on_exit{waits, stream_};
  // The host stages this step in pinned memory that the previous step's uploads may still read.
  if (inputs_consumed_recorded_) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(inputs_consumed_));
    inputs_consumed_recorded_ = false;
  }
  PAGODA_RETURN_IF_ERROR(validate(batch, pool));
  step_two_batch_ = false;  // graph decode steps may set it below
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  const int32_t wanted_rows = batch.num_logit_rows();
  if (logits != nullptr) logits->assign(static_cast<size_t>(wanted_rows) * vocab, 0.0f);
  if (tokens != nullptr) tokens->assign(static_cast<size_t>(wanted_rows), 0);
  if (batch.num_tokens() == 0) return ok_status();

  // Per-head holes (pyramidkv, entropy) first: such a step runs eagerly (graph_bucket answers 0).
  step_has_holes_ = false;
  if (kv_scores_ != nullptr) {
    PAGODA_ASSIGN_OR_RETURN(step_has_holes_, kv_scores_->prepare_holes(batch, stream_));
    if (step_has_holes_ && deepseek_) return unimplemented_error("cuda: per-head holes in an MLA model");
  }
  // Scoring decode steps replay a graph of their own (the scoring launches recorded over the bucket's slots).
  if (kv_scores_ != nullptr)
    PAGODA_RETURN_IF_ERROR(
        kv_scores_->prepare(batch, block_table_stride_, stream_, graph_bucket(batch), buckets_.empty() ? 0 : buckets_.back()));
  PAGODA_ASSIGN_OR_RETURN(const StepShape step, plan(batch));
  if (!batch.deferred_tokens.empty()) PAGODA_RETURN_IF_ERROR(patch_deferred(batch));
  // Copies logit rows [row_begin, row_begin + n) of this pass to the caller.
  auto copy_out = [&](int32_t row_begin, int32_t n) -> Status {
    if (output == Output::kSampled) return sample_out(row_begin, n);
    if (output == Output::kGreedy) {
      PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens->data() + row_begin, tokens_.data(), n * sizeof(int32_t),
                                                  cudaMemcpyDeviceToHost, stream_));
    } else {
      PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data() + static_cast<size_t>(row_begin) * vocab,
                                                  logits_.data(), n * vocab * sizeof(float),
                                                  cudaMemcpyDeviceToHost, stream_));
    }
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return ok_status();
  };

  if (step.bucket > 0) {
    PAGODA_CUDA_RETURN_IF_ERROR(waits.wait_all(stream_));
    // backend/cuda/attention's decode in graph mode: this step's arena goes to fixed
    // device memory ahead of the graph, which replays the same launches.
    bool fast = false;
    if (deepseek_) {
      PAGODA_ASSIGN_OR_RETURN(fast, deepseek_->plan_step(batch, pool.shape(), step.bucket, buckets_.back(),
                                                         block_table_stride_, options_.fast_attention,
                                                         device_.block_tables));
    } else if (fast_attention_usable()) {
      if (two_batch_allowed(step.bucket)) {
        PAGODA_ASSIGN_OR_RETURN(step_two_batch_,
                                two_batch_->plan_graph(*fast_, config_, batch, step.bucket, buckets_.back(),
                                                       block_table_stride_, options_.block_size,
                                                       pool.shape().num_blocks, stream_, device_.block_tables));
        fast = step_two_batch_;
      }
      if (!fast) {
        PAGODA_ASSIGN_OR_RETURN(fast, fast_->plan_graph(config_, batch, step.bucket, buckets_.back(),
                                                        block_table_stride_, options_.block_size,
                                                        pool.shape().num_blocks, stream_, device_.block_tables));
      }
    }
    if (fast) ++fast_attention_steps_;
    if (step_two_batch_) ++two_batch_steps_;
    const bool scoring = kv_scores_ != nullptr && kv_scores_->active();
    PAGODA_RETURN_IF_ERROR(choose_kernel_scores(scoring, fast, step.bucket, true, batch));
    if (scoring && kernel_scores_ == nullptr) ++scoring_pass_steps_;
    PAGODA_RETURN_IF_ERROR(mark_inputs_consumed());
    auto it = graphs_.find(graph_key(step.bucket, scoring));
    if (it != graphs_.end() && it->second.pool == &pool && it->second.fast_attention == fast &&
        it->second.kernel_mass == (kernel_scores_ != nullptr) && it->second.two_batch == step_two_batch_) {
      // A profiler's window (PAGODA_CUDA_PROFILE_REPLAY, e.g. ncu --profile-from-start off): one replay only.
      const bool profiled = graph_replays_ == profile_replay_;
      if (profiled) {
        PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
        PAGODA_CUDA_RETURN_IF_ERROR(cudaProfilerStart());
      }
      PAGODA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second.exec, stream_));
      ++graph_replays_;
      if (profiled) {
        PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
        PAGODA_CUDA_RETURN_IF_ERROR(cudaProfilerStop());
      }
    } else {
      // First step of this bucket (or pool, or attention): run it for real, then record it for next time.
      PAGODA_RETURN_IF_ERROR(run_layers(step.num_tokens, pool, fast));
      PAGODA_RETURN_IF_ERROR(run_head(0, step.num_tokens));
      PAGODA_RETURN_IF_ERROR(capture_graph(step.bucket, scoring, pool, fast));
    }
    return copy_out(0, step.num_rows);
  }
  bool fast = false;
  if (deepseek_) {
    PAGODA_ASSIGN_OR_RETURN(fast, deepseek_->plan_step(batch, pool.shape(), 0, buckets_.back(), block_table_stride_,
                                                       options_.fast_attention));
  } else if (fast_attention_usable()) {
    PAGODA_ASSIGN_OR_RETURN(fast, fast_->plan(config_, batch, options_.block_size, pool.shape().num_blocks, stream_));
  }
  // Per-head holes: the fast attention skips them in its decode launch only (CUDA-core decode), so a
  // step with a prompt chunk runs on the builtin kernel, which skips them in any step.
  if (fast && step_has_holes_)
    for (const SequenceSlice& s : batch.sequences) fast = fast && s.num_new_tokens == 1;
  if (fast) ++fast_attention_steps_;
  const bool scoring = kv_scores_ != nullptr && kv_scores_->active();
  PAGODA_RETURN_IF_ERROR(choose_kernel_scores(scoring, fast, step.num_tokens, false, batch));
  if (scoring && kernel_scores_ == nullptr) ++scoring_pass_steps_;
  PAGODA_RETURN_IF_ERROR(mark_inputs_consumed());
  // Only the llama-family layer loop waits layer by layer; any other forward (MLA) waits for the whole load first.
  const bool per_layer_waits = !config_.mla.has_value();
  if (!per_layer_waits) PAGODA_CUDA_RETURN_IF_ERROR(waits.wait_all(stream_));
  // A profiler's window over one eager step (PAGODA_CUDA_PROFILE_EAGER_STEP, e.g. a mixed prefill step).
  const bool profiled = eager_steps_ == profile_eager_step_;
  ++eager_steps_;
  if (profiled) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaProfilerStart());
  }
  PAGODA_RETURN_IF_ERROR(
      run_layers(step.num_tokens, pool, fast, per_layer_waits ? &waits : nullptr, step_has_holes_));
  for (int32_t row = 0; row < step.num_rows; row += max_rows_) {
    const int32_t n = std::min(max_rows_, step.num_rows - row);
    PAGODA_RETURN_IF_ERROR(run_head(row, n));
    PAGODA_RETURN_IF_ERROR(copy_out(row, n));
  }
  if (step.num_rows == 0 || profiled) PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (profiled) PAGODA_CUDA_RETURN_IF_ERROR(cudaProfilerStop());
  return ok_status();
}

Status CudaModel::forward(const ForwardBatch& batch, CudaKvPool& pool, std::vector<float>& logits) {
  return run(batch, pool, Output::kLogits, &logits, nullptr);
}

Status CudaModel::forward_greedy(const ForwardBatch& batch, CudaKvPool& pool, std::vector<int32_t>& tokens) {
  return run(batch, pool, Output::kGreedy, nullptr, &tokens);
}

Status CudaModel::forward_sampled(const ForwardBatch& batch, CudaKvPool& pool,
                                  std::span<const GpuSamplingParams> params, std::span<const int32_t> host_rows,
                                  std::vector<int32_t>& tokens, std::vector<float>& logprobs,
                                  std::vector<float>& host_logits, std::span<const runtime::RowSampling> row_sampling,
                                  std::vector<runtime::RowScore>* scores) {
  const int32_t rows = batch.num_logit_rows();
  if (static_cast<int64_t>(params.size()) != rows)
    return invalid_argument_error("forward_sampled: {} sampling params for {} logits rows", params.size(), rows);
  if (!row_sampling.empty() && static_cast<int64_t>(row_sampling.size()) != rows)
    return invalid_argument_error("forward_sampled: {} row entries for {} logits rows", row_sampling.size(), rows);
  bool scored = false, reported = false;
  size_t edits = 0;
  for (const runtime::RowSampling& row : row_sampling) {
    if (row.on_device) edits += row.logit_edits.size();
    reported = reported || row.reports_score();
    if (!row.reports_score() && !(row.on_device && row.edited())) continue;
    scored = true;
    if (row.score_token >= config_.vocab_size || row.score_top_k < 0 || row.score_top_k > kMaxScoreTopK)
      return invalid_argument_error("forward_sampled: scored token {} (vocabulary {}) with top {} (at most {})",
                                    row.score_token, config_.vocab_size, row.score_top_k, kMaxScoreTopK);
  }
  if (reported && scores == nullptr) return invalid_argument_error("forward_sampled: scored rows but no scores output");
  const size_t edit_bytes = static_cast<size_t>(max_rows_) * sizeof(GpuLogitEditRow) + edits * sizeof(GpuLogitEdit);
  if (edits > 0 && edit_bytes > edit_bytes_) {
    // Grown to the largest step's lists (with room): no earlier step's kernels still read them (synchronous).
    const size_t bytes = std::max(edit_bytes + edit_bytes / 2, edit_bytes_ * 2);
    edit_host_ = PinnedBuffer{};
    edit_device_ = DeviceBuffer{};
    edit_bytes_ = 0;
    PAGODA_ASSIGN_OR_RETURN(edit_host_, PinnedBuffer::allocate(bytes));
    PAGODA_ASSIGN_OR_RETURN(edit_device_, DeviceBuffer::allocate(bytes));
    edit_bytes_ = bytes;
  }
  if (scored && score_host_.data() == nullptr) {
    const size_t bytes = static_cast<size_t>(max_rows_) * (sizeof(GpuScoreRequest) + sizeof(GpuRowScore));
    PAGODA_ASSIGN_OR_RETURN(score_host_, PinnedBuffer::allocate(bytes));
    PAGODA_ASSIGN_OR_RETURN(score_device_, DeviceBuffer::allocate(bytes));
  }
  if (scores != nullptr) scores->clear();
  const auto& masks = row_sampling;
  if (mask_host_.data() == nullptr &&
      std::any_of(masks.begin(), masks.end(), [](const runtime::RowSampling& m) { return m.masked(); })) {
    const size_t words = (static_cast<size_t>(config_.vocab_size) + 63) / 64;
    const size_t bytes = static_cast<size_t>(max_rows_) * (sizeof(int32_t) + words * sizeof(uint64_t)) + 8;
    PAGODA_ASSIGN_OR_RETURN(mask_host_, PinnedBuffer::allocate(bytes));
    PAGODA_ASSIGN_OR_RETURN(mask_device_, DeviceBuffer::allocate(bytes));
  }
  for (size_t i = 0; i < host_rows.size(); ++i)
    if (host_rows[i] < 0 || host_rows[i] >= rows || (i > 0 && host_rows[i] <= host_rows[i - 1]))
      return invalid_argument_error("forward_sampled: host row {} at index {} is not ascending within [0, {})",
                                    host_rows[i], i, rows);
  PAGODA_RETURN_IF_ERROR(ensure_sampling_buffers());
  tokens.assign(static_cast<size_t>(rows), 0);
  logprobs.assign(static_cast<size_t>(rows), 0.0f);
  host_logits.assign(host_rows.size() * static_cast<size_t>(config_.vocab_size), 0.0f);
  sampled_ = SampledOutput{params, host_rows, &tokens, &logprobs, &host_logits, row_sampling, scores};
  Status status = run(batch, pool, Output::kSampled, nullptr, nullptr);
  sampled_ = SampledOutput{};
  return status;
}

Status CudaModel::sample_out(int32_t row_begin, int32_t n) {
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  const size_t params_bytes = static_cast<size_t>(max_rows_) * sizeof(GpuSamplingParams);
  // A launched step's slot: the host stages the next step's params while the device still reads these.
  char* host_slot = sampling_host_.as<char>() + static_cast<size_t>(std::max(async_slot_, 0)) * sampling_slot_bytes();
  auto* host_params = reinterpret_cast<GpuSamplingParams*>(host_slot);
  auto* device_params = sampling_device_.as<GpuSamplingParams>();
  auto* host_tokens = reinterpret_cast<int32_t*>(host_slot + params_bytes);
  auto* device_tokens = reinterpret_cast<int32_t*>(sampling_device_.as<char>() + params_bytes);
  std::copy_n(sampled_.params.data() + row_begin, n, host_params);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_params, host_params, n * sizeof(GpuSamplingParams),
                                              cudaMemcpyHostToDevice, stream_));
  float* device_logprobs = reinterpret_cast<float*>(device_tokens + max_rows_);
  PAGODA_RETURN_IF_ERROR(mask_rows(row_begin, n));
  // Edited rows (logit rules, penalties) are drawn from their edited logits, then restored for their scores.
  PAGODA_ASSIGN_OR_RETURN(const int32_t edited, edit_rows(row_begin, n));
  PAGODA_CUDA_RETURN_IF_ERROR(sample_rows(logits_.as<float>(), n, config_.vocab_size, device_params, device_tokens,
                                          device_logprobs, stream_));
  PAGODA_RETURN_IF_ERROR(restore_edited_rows(edited));
  PAGODA_ASSIGN_OR_RETURN(const int32_t scored, score_out(row_begin, n, device_tokens));
  // Tokens and logprobs in one copy (adjacent), then the host rows' logits.
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_tokens, device_tokens, static_cast<size_t>(max_rows_) * 8,
                                              cudaMemcpyDeviceToHost, stream_));
  if (async_slot_ >= 0) {  // launched: collect_launched() waits for the slot
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(outputs_ready_[async_slot_], stream_));
    return ok_status();
  }
  const auto& host_rows = sampled_.host_rows;
  const auto first = std::lower_bound(host_rows.begin(), host_rows.end(), row_begin);
  for (auto it = first; it != host_rows.end() && *it < row_begin + n; ++it) {
    const size_t k = static_cast<size_t>(it - host_rows.begin());
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sampled_.host_logits->data() + k * vocab,
                                                logits_.as<float>() + static_cast<size_t>(*it - row_begin) * vocab,
                                                vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::copy_n(host_tokens, n, sampled_.tokens->data() + row_begin);
  std::copy_n(reinterpret_cast<const float*>(host_tokens + max_rows_), n, sampled_.logprobs->data() + row_begin);
  read_scores(row_begin, scored);
  return ok_status();
}

StatusOr<int32_t> CudaModel::edit_rows(int32_t row_begin, int32_t n) {
  if (sampled_.rows.empty() || edit_host_.data() == nullptr) return 0;
  auto* host_rows = edit_host_.as<GpuLogitEditRow>();
  auto* host_tokens = reinterpret_cast<GpuLogitEdit*>(host_rows + max_rows_);
  int32_t count = 0, tokens = 0;
  for (int32_t r = 0; r < n; ++r) {
    const runtime::RowSampling& row = sampled_.rows[static_cast<size_t>(row_begin + r)];
    if (!row.on_device || !row.edited()) continue;
    const int32_t listed = static_cast<int32_t>(row.logit_edits.size());
    host_rows[count++] = GpuLogitEditRow{r, tokens, listed, row.repetition_penalty, row.frequency_penalty,
                                       row.presence_penalty};
    for (const runtime::LogitEdit& t : row.logit_edits)
      host_tokens[tokens++] = GpuLogitEdit{t.token, t.output_count, t.bias, t.flags, 0.0f};
  }
  if (count == 0) return 0;
  const size_t tokens_offset = static_cast<size_t>(max_rows_) * sizeof(GpuLogitEditRow);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(edit_device_.data(), edit_host_.data(),
                                              count * sizeof(GpuLogitEditRow), cudaMemcpyHostToDevice, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(edit_device_.as<char>() + tokens_offset,
                                              edit_host_.as<char>() + tokens_offset,
                                              tokens * sizeof(GpuLogitEdit), cudaMemcpyHostToDevice, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(apply_logit_edits(
      logits_.as<float>(), config_.vocab_size, edit_device_.as<GpuLogitEditRow>(), count,
      reinterpret_cast<GpuLogitEdit*>(edit_device_.as<char>() + tokens_offset), stream_));
  return count;
}

Status CudaModel::restore_edited_rows(int32_t count) {
  if (count == 0) return ok_status();
  const size_t tokens_offset = static_cast<size_t>(max_rows_) * sizeof(GpuLogitEditRow);
  PAGODA_CUDA_RETURN_IF_ERROR(restore_logit_edits(
      logits_.as<float>(), config_.vocab_size, edit_device_.as<GpuLogitEditRow>(), count,
      reinterpret_cast<const GpuLogitEdit*>(edit_device_.as<char>() + tokens_offset), stream_));
  return ok_status();
}

static_assert(kMaxScoreTopK == runtime::kMaxScoreTopK, "the kernel's top-k cap is the runner interface's");
static_assert(kLogitEditSeen == runtime::LogitEdit::kSeen && kLogitEditBanned == runtime::LogitEdit::kBanned &&
                  kLogitEditBiased == runtime::LogitEdit::kBiased,
              "the kernel's edit flags are the runner interface's");

StatusOr<int32_t> CudaModel::score_out(int32_t row_begin, int32_t n, const int32_t* sampled) {
  if (sampled_.rows.empty() || score_host_.data() == nullptr) return 0;
  auto* host_requests = score_host_.as<GpuScoreRequest>();
  int32_t count = 0;
  for (int32_t r = 0; r < n; ++r) {
    const runtime::RowSampling& row = sampled_.rows[static_cast<size_t>(row_begin + r)];
    if (row.scored()) {
      host_requests[count++] = GpuScoreRequest{r, row.score_token, row.score_top_k};
    } else if (row.on_device && (row.reports_score() || row.edited())) {
      host_requests[count++] = GpuScoreRequest{r, -1, row.score_top_k};  // the drawn token
    }
  }
  if (count == 0) return 0;
  auto* device_requests = score_device_.as<GpuScoreRequest>();
  auto* device_scores = reinterpret_cast<GpuRowScore*>(device_requests + max_rows_);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_requests, host_requests, count * sizeof(GpuScoreRequest),
                                              cudaMemcpyHostToDevice, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(
      score_rows(logits_.as<float>(), config_.vocab_size, device_requests, count, device_scores, stream_, sampled));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_requests + max_rows_, device_scores, count * sizeof(GpuRowScore),
                                              cudaMemcpyDeviceToHost, stream_));
  return count;
}

void CudaModel::read_scores(int32_t row_begin, int32_t count) {
  const auto* host_requests = score_host_.as<GpuScoreRequest>();
  const auto* host_scores = reinterpret_cast<const GpuRowScore*>(host_requests + max_rows_);
  for (int32_t i = 0; i < count; ++i) {
    const GpuRowScore& g = host_scores[i];
    const int32_t r = row_begin + host_requests[i].row;
    const runtime::RowSampling& row = sampled_.rows[static_cast<size_t>(r)];
    // An edited row's sampler logprob is the edited row's: the raw one is the score's.
    if (row.on_device && row.edited()) (*sampled_.logprobs)[static_cast<size_t>(r)] = g.logprob;
    if (!row.reports_score()) continue;
    runtime::RowScore& out = sampled_.scores->emplace_back();
    out.logprob = g.logprob;
    out.rank = g.rank;
    out.top_tokens.assign(g.top_tokens, g.top_tokens + g.top_count);
    out.top_logprobs.assign(g.top_logprobs, g.top_logprobs + g.top_count);
  }
}

size_t CudaModel::sampling_slot_bytes() const {
  return static_cast<size_t>(max_rows_) * (sizeof(GpuSamplingParams) + 8);
}

Status CudaModel::ensure_sampling_buffers() {
  if (sampling_host_.data() != nullptr) return ok_status();
  PAGODA_ASSIGN_OR_RETURN(sampling_host_, PinnedBuffer::allocate(2 * sampling_slot_bytes()));
  PAGODA_ASSIGN_OR_RETURN(sampling_device_, DeviceBuffer::allocate(sampling_slot_bytes()));
  return ok_status();
}

Status CudaModel::patch_deferred(const ForwardBatch& batch) {
  if (sampling_device_.data() == nullptr)
    return failed_precondition_error("cuda: deferred tokens, but no step sampled on the device before");
  const size_t n = batch.deferred_tokens.size();
  if (deferred_host_.data() == nullptr) {
    const size_t bytes = static_cast<size_t>(options_.max_num_tokens) * 2 * sizeof(int32_t);
    PAGODA_ASSIGN_OR_RETURN(deferred_host_, PinnedBuffer::allocate(bytes));
    PAGODA_ASSIGN_OR_RETURN(deferred_device_, DeviceBuffer::allocate(bytes));
  }
  auto* pairs = deferred_host_.as<int32_t>();
  for (size_t k = 0; k < n; ++k) {
    pairs[2 * k] = batch.deferred_tokens[k].token_index;
    pairs[2 * k + 1] = batch.deferred_tokens[k].source_row;
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(deferred_device_.data(), pairs, n * 2 * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream_));
  const size_t params_bytes = static_cast<size_t>(max_rows_) * sizeof(GpuSamplingParams);
  const auto* sampled = reinterpret_cast<const int32_t*>(sampling_device_.as<char>() + params_bytes);
  PAGODA_CUDA_RETURN_IF_ERROR(patch_deferred_tokens(device_.token_ids, deferred_device_.as<int32_t>(),
                                                    static_cast<int32_t>(n), sampled, stream_));
  return ok_status();
}

Status CudaModel::mark_inputs_consumed() {
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(inputs_consumed_, stream_));
  inputs_consumed_recorded_ = true;
  return ok_status();
}

bool CudaModel::launchable(const ForwardBatch& batch) const {
  if (!layer_waits_.empty() || comm_ != nullptr) return false;
  for (const SequenceSlice& s : batch.sequences)
    if (s.kv_state != 0) return false;  // token eviction's scoring
  return graph_bucket_without_holes(batch) > 0 && batch.num_logit_rows() <= max_rows_;
}

Status CudaModel::forward_launched(const ForwardBatch& batch, CudaKvPool& pool,
                                   std::span<const GpuSamplingParams> params, int slot) {
  const int32_t rows = batch.num_logit_rows();
  if (slot != 0 && slot != 1) return invalid_argument_error("forward_launched: slot {} (0 or 1)", slot);
  if (static_cast<int64_t>(params.size()) != rows)
    return invalid_argument_error("forward_launched: {} sampling params for {} logits rows", params.size(), rows);
  PAGODA_RETURN_IF_ERROR(ensure_sampling_buffers());
  sampled_ = SampledOutput{params, {}, nullptr, nullptr, nullptr, {}};
  async_slot_ = slot;
  Status status = run(batch, pool, Output::kSampled, nullptr, nullptr);
  async_slot_ = -1;
  sampled_ = SampledOutput{};
  return status;
}

Status CudaModel::collect_launched(int slot, int32_t rows, std::vector<int32_t>& tokens,
                                   std::vector<float>& logprobs) {
  if (slot != 0 && slot != 1) return invalid_argument_error("collect_launched: slot {} (0 or 1)", slot);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(outputs_ready_[slot]));
  const char* host_slot = sampling_host_.as<char>() + static_cast<size_t>(slot) * sampling_slot_bytes();
  const auto* host_tokens =
      reinterpret_cast<const int32_t*>(host_slot + static_cast<size_t>(max_rows_) * sizeof(GpuSamplingParams));
  tokens.assign(host_tokens, host_tokens + rows);
  logprobs.assign(reinterpret_cast<const float*>(host_tokens + max_rows_),
                  reinterpret_cast<const float*>(host_tokens + max_rows_) + rows);
  return ok_status();
}

Status CudaModel::mask_rows(int32_t row_begin, int32_t n) {
  // No masks this call (rows may be there for scored rows only): the buffers exist once a row was masked.
  if (sampled_.rows.empty() || mask_host_.data() == nullptr) return ok_status();
  const size_t words = (static_cast<size_t>(config_.vocab_size) + 63) / 64;
  // Row indices first, masks 8-byte aligned after them, packed in the order of the rows.
  auto* host_rows = mask_host_.as<int32_t>();
  auto* host_masks = reinterpret_cast<uint64_t*>(mask_host_.as<char>() + ((static_cast<size_t>(max_rows_) * 4 + 7) & ~size_t{7}));
  int32_t count = 0;
  // The forward is queued: the deferred masks are computed here while the GPU runs it.
  for (int32_t r = 0; r < n; ++r) {
    const runtime::RowSampling& row = sampled_.rows[static_cast<size_t>(row_begin + r)];
    if (!row.masked()) continue;
    host_rows[count] = r;
    uint64_t* out = host_masks + static_cast<size_t>(count) * words;
    if (row.mask_source != nullptr) {
      row.mask_source->fill_mask(static_cast<size_t>(row_begin + r), std::span<uint64_t>(out, words));
    } else {
      std::copy_n(row.allowed, words, out);
    }
    ++count;
  }
  if (count == 0) return ok_status();
  const size_t masks_offset = reinterpret_cast<char*>(host_masks) - mask_host_.as<char>();
  const size_t bytes = masks_offset + static_cast<size_t>(count) * words * sizeof(uint64_t);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mask_device_.as<char>(), mask_host_.as<char>(), bytes,
                                              cudaMemcpyHostToDevice, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(apply_token_masks(logits_.as<float>(), config_.vocab_size, mask_device_.as<int32_t>(),
                                                reinterpret_cast<const uint64_t*>(mask_device_.as<char>() + masks_offset),
                                                count, stream_));
  return ok_status();
}

}  // namespace pagoda::cuda
