#pragma once
// The GPU forward of the llama family (Llama incl. llama3 RoPE, Mistral, Qwen2,
// Qwen3) in bf16 with f32 accumulation: the same step contract as CpuModel
// (ForwardBatch in, logits rows out), on a CudaKvPool.
//
// Per step, plan then run: the host turns the ForwardBatch into flat metadata
// (token ids, positions, KV slots, per-token attention ranges, block tables,
// logit rows) in pinned memory, copies it to fixed device buffers, and the
// run reads only those, so it can be a CUDA graph. Per layer: [residual add +]
// RMSNorm -> fused qkv GEMM (+bias) -> (Qwen3 q/k norm) -> RoPE -> KV write at
// the slots -> paged attention -> o GEMM -> residual add + RMSNorm -> fused
// gate/up GEMM -> SiLU-mul -> down GEMM; then the final norm and lm_head for the
// requested rows only, and argmax on the GPU for greedy decoding. The residual
// stream stays f32; the GEMM inputs and outputs are bf16.
//
// CUDA graphs: a pure decode step (every sequence 1 new token, logits for it)
// of B <= max_graph_batch sequences runs padded to the smallest bucket >= B
// (padding rows write no KV and attend to nothing). The first step of a bucket
// runs eagerly and captures the graph; later ones replay it. Attention is
// backend/cuda/attention's Hopper kernels (fast_attention.h) where they support the
// shape: split-K decode in graph mode inside the graphs, decode or tensor-core
// prefill in eager steps; the backend's own kernel otherwise.
//
// DeepSeek V2/V3 (config.mla): the layers are CudaDeepseekForward's (MLA over
// a latent pool, MoE); embedding, head and sampling are shared. Their pure
// decode steps of up to moe_max_graph_batch sequences run in the same CUDA
// graphs (the MoE's expert GEMMs then read the per-expert row counts on the
// device; decode rows attend on the paged MLA decode kernel when fast_attention
// is on); other steps run eagerly, with one host synchronization per MoE layer
// for cuBLAS's grouped GEMM, and their prompt rows on the tensor-core MLA
// prefill (cuda_deepseek_mla_prefill.h) when fast_attention is on.
//
// Tensor parallelism (attach_tensor_parallel; docs/TENSOR_PARALLEL.md): the
// model is then one rank's shard (shard_config / shard_model_weights of
// model/tensor_shard.h, uploaded as usual) and its forward joins the other
// ranks through a DeviceCommunicator enqueued on this model's stream: the
// vocab-parallel embedding is all-reduced (f32), the o and down projections'
// outputs are all-reduced (bf16, summed in f32) before they join the residual,
// and each rank's [rows, vocab rows of the rank] logits are all-gathered into
// the whole [rows, vocab], so sampling and argmax run unchanged on every rank.
// When the group turns graphs on (cuda_tensor_parallel_runner.h: experimental,
// opt-in), pure decode steps run in CUDA graphs as at TP=1: every rank meets the same
// step with the same bucket, runs its first step eagerly and captures its own
// graph at the same time as the others (the collectives inside: NCCL's are
// capturable, the same-device communicator meets on device counters while
// capturing), and replays it on its own stream.
//
// Thread safety: one caller at a time (scratch, graphs and the stream are per model).

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_deepseek_forward.h"
#include "pagoda/backend/cuda/cuda_kv_scores.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_model_weights.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/backend/cuda/two_batch_overlap.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/backend/cuda/fp8_mma_gemv.h"
#include "pagoda/backend/cuda/gemv.h"
#include "pagoda/backend/cuda/kv_layer_waits.h"
#include "pagoda/backend/cuda/sampling.h"
#include "pagoda/backend/cuda/step_plan.h"
#include "pagoda/core/status.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/runtime/model_runner.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/tensor_shard.h"
#include "pagoda/parallel/device_communicator.h"

namespace pagoda::cuda {

struct CudaModelOptions {
  int32_t max_num_tokens = 8192;  // new tokens per forward (the prefill chunk budget)
  int32_t max_num_seqs = 256;     // sequences per forward; also the largest graph bucket
  int32_t max_model_len = 0;      // tokens per sequence; 0: config's max_position_embeddings
  int32_t block_size = 16;        // tokens per KV block
  bool use_cuda_graphs = true;
  // Decode batches up to this size replay graphs (0: up to max_num_seqs);
  // larger ones run eagerly, with the fast attention kernels when enabled.
  int32_t max_graph_batch = 0;
  // DeepSeek (MoE) models: decode batches above this run eagerly (0: no cap
  // beyond max_graph_batch). In a graph the expert GEMMs are the device-count
  // moe_grouped_gemm, which wins at small batches and loses to the eager path's
  // cuBLAS grouped GEMM at large ones; the default is the measured crossover
  // (docs/BENCHMARKS.md, "CUDA graphs by batch size for DeepSeek").
  int32_t moe_max_graph_batch = kDefaultMoeMaxGraphBatch;
  static constexpr int32_t kDefaultMoeMaxGraphBatch = 2;
  // Eager steps use backend/cuda/attention's Hopper attention where it supports the shape.
  bool fast_attention = true;
  bool show_progress = true;      // weight-loading bar on stderr
  // KV cache element types (bf16, or a quantized format of runtime/kv_quant.h);
  // kv_pool_shape() carries them to the pool.
  DType kv_key_dtype = DType::kBF16;
  DType kv_value_dtype = DType::kBF16;
  // --kv-cross-layer-share K (runtime/cross_layer_share.h, kv_share_ops.h); 1: off. K > 1 needs bf16 or fp8
  // KV; its layers run the builtin attention (paged_attention_shared), eager or in graphs, never the fast one.
  int32_t kv_cross_layer_share = 1;
  // --quantization fp8: f32/f16/bf16 projections become e4m3 with per-channel scales and run as fp8 GEMMs
  // with dynamic per-token activations (an FP8 checkpoint's projections run fp8 without it).
  bool fp8_weights = false;
  // Projections (and the lm_head) of steps with at most this many rows run as the weight-streaming GEMV
  // (gemv.h) instead of cuBLASLt (fp8 projections with dynamic activations only): -1 picks gemv.h's
  // defaults per weight type, 0 turns it off, 1 ... kGemvMaxRows sets both. The environment variable PAGODA_GEMV_MAX_ROWS, when set,
  // overrides this (benchmarks compare both paths without rebuilding).
  int32_t gemv_max_rows = -1;
  // With fp8 weights (fp8_weights, or a checkpoint whose lm_head is fp8): the lm_head of GEMV-sized steps
  // (the fp8 GEMV rows) runs as an e4m3 weight-only GEMV with per-channel (or the checkpoint's) scales,
  // f32 logits; larger steps run it as an fp8 GEMM with per-token activations and f32 logits
  // (PAGODA_FP8_LM_HEAD_GEMM=0 keeps the bf16 lm_head's GEMM there). On by default (it only acts with fp8 weights):
  // its perplexity cost on a trained model is measured within the fp8 quality bar (docs/BENCHMARKS.md);
  // the environment variable PAGODA_FP8_LM_HEAD (0 or 1), when set, overrides it. Single-GPU Llama-style
  // models only (the sharded head and MLA keep bf16).
  bool fp8_lm_head = true;
  // MLA models with a bf16 latent pool: the pool's block layout (runtime/mla_latent_layout.h). Swizzled
  // pages apply where mla_swizzled_pages_apply (576-value latents, block_size % 8 == 0); elsewhere the pool
  // stays token-major. Unset: runtime::mla_automatic_latent_pages (swizzled at pages of a multiple of 64 with
  // at most 16 query heads, where the bulk-copy decode kernel reads them; docs/MLA_SWIZZLED_PAGES.md). The
  // environment variable PAGODA_MLA_LATENT_PAGES (auto, token-major or swizzled128), when set, overrides this.
  std::optional<runtime::MlaLatentPages> mla_latent_pages;
};

class CudaModel {
 public:
  // Loads <dir>/config.json and the safetensors, converting weights to bf16 on the GPU.
  static StatusOr<std::unique_ptr<CudaModel>> load(const std::filesystem::path& model_dir,
                                                   const CudaModelOptions& options = {});
  // Uploads `host` (the weights of `config`, bound with f32_cache_bytes = 0 so
  // matrices are mmapped views, or a rank's shard_model_weights) to the current device.
  static StatusOr<std::unique_ptr<CudaModel>> from_weights(const ModelConfig& config, const ModelWeights& host,
                                                           const CudaModelOptions& options = {});
  // Random bf16 weights for `config`, made on the GPU (`--load-format random`).
  static StatusOr<std::unique_ptr<CudaModel>> create_random(const ModelConfig& config, uint64_t seed,
                                                            const CudaModelOptions& options = {});
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const CudaModelOptions& options() const { return options_; }
  int32_t max_model_len() const { return max_model_len_; }
  size_t weight_bytes() const {
    return weights_.total_bytes() + (deepseek_ ? deepseek_->weight_bytes() : 0);
  }
  cudaStream_t stream() const { return stream_; }
  // Projections running as fp8 GEMMs (of 4 per layer) and the scale mode they use ("bf16" when none).
  int32_t fp8_projections() const { return weights_.fp8_projections(); }
  const char* fp8_scale_mode_name() const {
    return fp8_gemm_ ? pagoda::cuda::fp8_scale_mode_name(fp8_gemm_->mode()) : "bf16";
  }

  // The bf16 pool shape this model needs for num_blocks blocks.
  KvPoolShape kv_pool_shape(int32_t num_blocks) const;

  // Runs the batch; logits resized to [batch.num_logit_rows(), vocab] (host),
  // rows in order of sequences, then tokens. Errors (nothing runs): batch
  // inconsistent, over the limits in options, or a pool that does not fit.
  Status forward(const ForwardBatch& batch, CudaKvPool& pool, std::vector<float>& logits);
  // Same, but only the argmax token of each logits row comes back (greedy
  // sampling on the GPU; no logits cross PCIe).
  Status forward_greedy(const ForwardBatch& batch, CudaKvPool& pool, std::vector<int32_t>& tokens);
  // Same, but every logits row r is sampled on the GPU with params[r]
  // (sampling.h): tokens and logprobs get one entry per row, and only the rows
  // listed in host_rows (ascending) copy their logits out, to host_logits
  // [host_rows.size(), vocab]. rows: empty, or one runtime::RowSampling per
  // row: one whose `allowed` or `mask_source` gives the row's allowed-token
  // bits has them applied on the GPU before the draw (a mask_source is asked
  // after the forward is queued, while the GPU runs it, and writes straight
  // into the pinned upload buffer); a scored one (score_token; not in
  // host_rows) appends its runtime::RowScore to *scores, in row order, from
  // score_rows (sampling.h) instead of copying its logits out, as does a
  // sampled row with score_top_k > 0 (of its drawn token); a sampled row with
  // logit_edits is drawn from its edited logits (apply_logit_edits) and
  // scored on the raw row after (its logprob). Errors: params (or rows) not
  // one per logits row, host_rows not ascending within [0, rows), a scored
  // token outside the vocabulary or scores null.
  Status forward_sampled(const ForwardBatch& batch, CudaKvPool& pool, std::span<const GpuSamplingParams> params,
                         std::span<const int32_t> host_rows, std::vector<int32_t>& tokens,
                         std::vector<float>& logprobs, std::vector<float>& host_logits,
                         std::span<const runtime::RowSampling> rows = {},
                         std::vector<runtime::RowScore>* scores = nullptr);

  // Overlapped steps (runtime::ModelRunner::launch). launchable(): whether
  // forward_launched() takes the batch: a decode step that replays a CUDA
  // graph, with no host-tier copies to wait for and no token-eviction
  // scoring. forward_launched() is forward_sampled() without the wait: every
  // row is sampled on the device with params[r], and its token and logprob go
  // to pinned slot `slot` (0 or 1; steps launched back to back alternate),
  // which collect_launched() reads once the device is done. The batch's
  // deferred tokens are read on the device from the rows the previous sampled
  // forward drew (the step launched just before, still on the device).
  // Every forward first waits until the one before has consumed its uploads,
  // so the host can stage a step while the device runs the previous one.
  bool launchable(const ForwardBatch& batch) const;
  Status forward_launched(const ForwardBatch& batch, CudaKvPool& pool, std::span<const GpuSamplingParams> params,
                          int slot);
  Status collect_launched(int slot, int32_t rows, std::vector<int32_t>& tokens, std::vector<float>& logprobs);

  // Events the next forward (one call) waits on before it touches each layer
  // of the pool: the host tier's loads issued layer by layer (kv_layer_waits.h).
  // An eager step waits for layer l's just before layer l's KV write, so the
  // layers before it overlap the copy; a graph replay waits for all of them
  // first. Every one is waited on by the time the forward returns, error or not.
  void set_kv_layer_waits(KvLayerWaits waits) { layer_waits_ = std::move(waits); }
  // Waits given but not consumed (a forward refused before it ran): the stream waits for all of them now.
  void flush_kv_layer_waits() {
    layer_waits_.wait_all(stream_);
    layer_waits_ = KvLayerWaits{};
  }

  // Token eviction's scores (cuda_kv_scores.h, owned by the runner; null: none).
  // Each forward first lists its scoring queries; a step with any adds a
  // scoring pass after each layer's KV write. A decode step with any replays
  // its bucket's scoring graph (recorded apart from the plain one: the pass
  // over the bucket's fixed slots, reading a list written before each
  // replay). A step without runs exactly as before.
  void set_kv_scores(CudaKvScores* scores) { kv_scores_ = scores; }
  // Makes this model rank shard.rank of shard.size: its config and weights must
  // be that shard's, and every rank's model must be attached before any
  // forward; the ranks then call their forwards concurrently, one thread each
  // with this model's device current. Errors: a
  // communicator whose rank or size is not the shard's; CUDA allocation.
  Status attach_tensor_parallel(const TensorShard& shard, parallel::DeviceCommunicator* comm);
  const TensorShard& tensor_shard() const { return shard_; }

  // Turns graph replay of decode steps on or off (benchmarks compare both).
  // Under tensor parallelism every rank must be set alike.
  void set_use_cuda_graphs(bool on) { options_.use_cuda_graphs = on; }
  void set_fast_attention(bool on) { options_.fast_attention = on; }
  void set_max_graph_batch(int32_t n) { options_.max_graph_batch = n; }
  void set_moe_max_graph_batch(int32_t n) { options_.moe_max_graph_batch = n; }
  // DeepSeek: eager steps whose prompt rows ran on the tensor-core MLA prefill,
  // and its tuning (tests; 0 / no effect for other models).
  int64_t mla_prefill_steps() const;
  void set_mla_prefill_tuning(const CudaMlaPrefill::Tuning& tuning);

  // Graph statistics (tests, benchmarks).
  int64_t graph_replays() const { return graph_replays_; }
  // Norm / SiLU launches enqueued (eagerly or into a captured graph) that wrote an fp8 GEMM's quantized input
  // themselves (PAGODA_FUSE_FP8_QUANT); for tests.
  int64_t fused_fp8_quant_launches() const { return fused_fp8_quant_launches_; }
  // Launches of the tensor-core fp8 GEMV (projections and lm_head) by host code: eager steps and captures.
  int64_t fp8_mma_gemv_launches() const { return fp8_mma_gemv_launches_; }
  // gate_up GEMVs that applied SiLU-mul in their epilogue (PAGODA_FUSE_SILU_GEMV), counted at enqueue as above.
  int64_t gemv_silu_launches() const { return gemv_silu_launches_; }
  int64_t graphs_captured() const { return static_cast<int64_t>(graphs_.size()); }
  // Steps whose attention ran on backend/cuda/attention's kernels.
  int64_t fast_attention_steps() const { return fast_attention_steps_; }
  // Graph decode steps that ran as two lanes (two_batch_overlap.h; PAGODA_TWO_BATCH_OVERLAP).
  int64_t two_batch_steps() const { return two_batch_steps_; }
  // Token eviction's mass from the decode kernel's own scores (on by default;
  // off: every scoring step runs the separate scoring pass), and the steps
  // (eager runs and graph captures or replays) that took it (tests, benchmarks).
  void set_kernel_mass(bool on) { kernel_mass_ = on; }
  int64_t kernel_mass_steps() const { return kernel_mass_steps_; }
  // Scoring steps (eager runs and graph captures or replays) whose mass came from the separate
  // scoring pass instead (CudaKvScores::score_layer: prefill chunks, mixed steps, the builtin
  // kernel, kernel mass off or its rows over the cap); tests, benchmarks.
  int64_t scoring_pass_steps() const { return scoring_pass_steps_; }

 private:
  enum class Output { kLogits, kGreedy, kSampled };
  // forward_sampled()'s arguments for the duration of the call.
  struct SampledOutput {
    std::span<const GpuSamplingParams> params;
    std::span<const int32_t> host_rows;
    std::vector<int32_t>* tokens = nullptr;
    std::vector<float>* logprobs = nullptr;
    std::vector<float>* host_logits = nullptr;
    std::span<const runtime::RowSampling> rows;  // masks and scored rows (forward_sampled)
    std::vector<runtime::RowScore>* scores = nullptr;
  };
  struct StepShape {
    int32_t num_tokens = 0;  // rows run (decode: padded to the bucket)
    int32_t num_rows = 0;    // logit rows wanted
    int32_t bucket = 0;      // graph bucket, 0 when the step runs eagerly
  };

  CudaModel(ModelConfig config, CudaModelOptions options, CudaModelWeights weights);
  // deepseek_weights: the layers of an MLA config (null otherwise).
  Status init(std::unique_ptr<CudaDeepseekWeights> deepseek_weights = nullptr);
  Status validate(const ForwardBatch& batch, const CudaKvPool& pool) const;
  int32_t graph_bucket(const ForwardBatch& batch) const;
  // The bucket the batch replays when the step has no per-head holes (launchable() asks before run()).
  int32_t graph_bucket_without_holes(const ForwardBatch& batch) const;
  StatusOr<StepShape> plan(const ForwardBatch& batch);
  // holes: the step has per-head holes (CudaKvScores::prepare_holes), passed to the fast attention.
  Status run_layers(int32_t num_tokens, const CudaKvPool& pool, bool fast_attention,
                    const KvLayerWaits* waits = nullptr, bool holes = false);
  // One lane of a step's rows: [row0, row0 + T) on `stream` with its own attention plan and GEMM
  // workspaces. A step runs as one lane, or as two on two streams (two_batch_overlap.h), whose
  // attentions then wait for `attention_after` (when set) and record `attention_done`.
  struct Lane {
    int32_t row0 = 0;
    int32_t T = 0;
    cudaStream_t stream = nullptr;
    FastAttention* fast = nullptr;
    Gemm* gemm = nullptr;
    Fp8Gemm* fp8_gemm = nullptr;
    cudaEvent_t attention_after = nullptr;
    cudaEvent_t attention_done = nullptr;
  };
  Status run_layer(int32_t l, const Lane& lane, const CudaKvPool& pool, bool fast_attention,
                   const KvLayerWaits* waits, bool holes);
  // Whether a graph decode step of this bucket may run as two lanes (two_batch_overlap.h).
  bool two_batch_allowed(int32_t bucket) const;
  Status run_head(int32_t row_begin, int32_t num_rows);
  Status run_head_fp8_gemm(const bf16* normed, int32_t num_rows);
  // Tensor parallelism: the embedding of this rank's vocabulary rows, summed over the ranks.
  Status embed_sharded(int32_t T, float* residual);
  // Tensor parallelism: logits_ [num_rows, vocab] from this rank's rows of normed through the all-gather.
  Status head_sharded(const bf16* normed, int32_t num_rows);
  // y [T, n] = x [T, k] . w^T (T = lane.T; x, y at the lane's first row) through the bf16 GEMM, or quantize x
  // (into the lane's rows of fp8_x_) + the fp8 GEMM where fp8.data is set.
  Status project(const Lane& lane, const bf16* x, const bf16* w, const CudaFp8Weight& fp8, int32_t n, int32_t k,
                 bf16* y);
  // Whether project() runs T rows of x through the weight-streaming GEMV (gemv.h) rather than a GEMM: the
  // bf16 GEMV up to gemv_rows_bf16_ rows, the weight-only fp8 one up to gemv_rows_fp8_ (dynamic activations).
  bool takes_gemv(int32_t T, const bf16* x, const bf16* w, const CudaFp8Weight& fp8, int32_t k) const;
  // The MLP's gate_up projection of normed into act [T, intermediate] with SiLU-mul in the GEMV's epilogue
  // (gemv_*_silu: one launch instead of GEMV + silu_mul, the same bits): true when it ran; false, nothing
  // launched, where the layer takes another path (GEMM sizes, a bias, fp8 inputs fused into the SiLU,
  // PAGODA_FUSE_SILU_GEMV=0).
  StatusOr<bool> gate_up_silu_gemv(const Lane& lane, const CudaLayerWeights& w, const bf16* normed, bf16* act);
  // Whether project(x, T, ..., fp8, n, k, y) would quantize x per token into fp8_x_ and run the fp8 GEMM: then
  // the kernel producing x may write fp8_x_ itself (add_rmsnorm_fp8, silu_mul_fp8) and project_quantized runs
  // the GEMM. False unless PAGODA_FUSE_FP8_QUANT allows it (on by default).
  bool fuse_fp8_input(const bf16* x, int32_t T, const CudaFp8Weight& fp8, int32_t k) const;
  // y [lane.T, n] from the lane's rows of fp8_x_ / fp8_x_scales_ (already holding the per-token quantized input) through the fp8 GEMM.
  // The lane's part of fp8_x_: from row0 * fp8_x_width_ (null without fp8 projections).
  uint8_t* lane_fp8_input(const Lane& lane) const;
  Status project_quantized(const Lane& lane, const CudaFp8Weight& fp8, int32_t n, int32_t k, bf16* y);
  // Whether T quantized rows of fp8 projection w (width k) run on the tensor-core fp8 GEMV (fp8_mma_gemv.h)
  // rather than cuBLASLt: T <= fp8_mma_gemv_rows_, per-channel (or per-tensor) scales, a shape it supports.
  // Callers try the weight-only GEMV (bf16 activations) first.
  bool fp8_mma_gemv_applies(int32_t T, const CudaFp8Weight& fp8, int32_t k) const;
  // y [lane.T, n] bf16 from quantized rows q / scales: the tensor-core GEMV where it applies, else the fp8 GEMM.
  Status fp8_linear(const Lane& lane, const uint8_t* q, const float* scales, const CudaFp8Weight& fp8, int32_t n,
                    int32_t k, bf16* y);
  // Samples logit rows [row_begin, row_begin + n) (already in logits_) and
  // copies tokens, logprobs and the host rows' logits out; synchronizes.
  // Applies the token masks of rows [row_begin, row_begin + n) of forward_sampled() to logits_.
  Status mask_rows(int32_t row_begin, int32_t n);
  Status sample_out(int32_t row_begin, int32_t n);
  // The edited rows among [row_begin, row_begin + n): their lists uploaded and apply_logit_edits queued;
  // returns how many (restore_logit_edits takes the same count after the draw).
  StatusOr<int32_t> edit_rows(int32_t row_begin, int32_t n);
  Status restore_edited_rows(int32_t count);
  // The rows among [row_begin, row_begin + n) (sampled_.rows) scored on the device: prompt rows (their
  // given token), sampled rows with top logprobs or logit edits (their drawn token, in `sampled`);
  // score_rows queued on the stream with its results' copy to pinned memory; returns how many
  // (read_scores takes them once the stream is done: the RowScores, and an edited row's raw logprob).
  StatusOr<int32_t> score_out(int32_t row_begin, int32_t n, const int32_t* sampled);
  void read_scores(int32_t row_begin, int32_t count);
  // Pinned and device sampling buffers (first sampled forward): per slot on the host.
  Status ensure_sampling_buffers();
  size_t sampling_slot_bytes() const;
  // Writes the batch's deferred tokens into the device token ids (after plan()).
  Status patch_deferred(const ForwardBatch& batch);
  // Records that this forward's uploads from pinned staging are queued (the next forward waits for them).
  Status mark_inputs_consumed();
  Status capture_graph(int32_t bucket, bool scoring, const CudaKvPool& pool, bool fast_attention);
  // A bucket's graph with token eviction's scoring launches is kept apart from the one without.
  static int32_t graph_key(int32_t bucket, bool scoring) { return bucket * 2 + (scoring ? 1 : 0); }
  bool fast_attention_usable() const;
  // Sets kernel_scores_ for this step: the decode kernel writes the scores and
  // kv_attention_mass_from_scores replaces the scoring pass when the step
  // scores, runs on the fast attention as one decode launch and its score rows
  // fit (rows: the step's, or the graph bucket's when graph). Otherwise null.
  Status choose_kernel_scores(bool scoring, bool fast, int32_t rows, bool graph, const ForwardBatch& batch);
  Status run(const ForwardBatch& batch, CudaKvPool& pool, Output output, std::vector<float>* logits,
             std::vector<int32_t>* tokens);

  ModelConfig config_;
  CudaModelOptions options_;
  CudaModelWeights weights_;
  int32_t max_model_len_ = 0;
  int32_t block_table_stride_ = 0;  // blocks per sequence in the device block tables
  int32_t max_rows_ = 0;            // logit rows per lm_head pass
  std::vector<int32_t> buckets_;

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<Fp8Gemm> fp8_gemm_;  // when some projection runs fp8
  int32_t gemv_rows_bf16_ = 0;  // steps of at most this many rows run bf16 projections as GEMVs
  int32_t gemv_rows_fp8_ = 0;   // the same for fp8 projections
  int32_t gemv_fp8_depth_ = kGemvDefaultFp8Depth;  // gemv_fp8 load depth (PAGODA_GEMV_FP8_DEPTH)
  // Rows up to which quantized fp8 projections and the e4m3 lm_head run on the tensor-core GEMV instead of
  // cuBLASLt (PAGODA_FP8_MMA_GEMV_ROWS, 0 ... kFp8MmaGemvMaxRows); the weight-only GEMV keeps its rows
  // (gemv_rows_fp8_, 1-2 by default) first, so by default steps of 3-8 rows take it.
  int32_t fp8_mma_gemv_rows_ = kFp8MmaGemvDefaultRows;
  int64_t fused_fp8_quant_launches_ = 0;
  int64_t fp8_mma_gemv_launches_ = 0;
  int64_t gemv_silu_launches_ = 0;
  // The fp8 GEMMs' per-token input quantization inside the norms / SiLU (PAGODA_FUSE_FP8_QUANT=0: off).
  bool fuse_fp8_quant_ = true;
  bool fuse_silu_gemv_ = true;  // SiLU-mul in the gate_up GEMV's epilogue (PAGODA_FUSE_SILU_GEMV=0: off)
  bool fuse_rope_kv_ = false;  // rope_qk + kv_write as rope_qk_kv_write at decode sizes (PAGODA_FUSE_ROPE_KV=1: on)
  // The e4m3 lm_head above the GEMV rows too: an fp8 GEMM (per-token activations) with f32 logits, so the
  // head's precision does not depend on the step's size (PAGODA_FP8_LM_HEAD_GEMM=0: the bf16 GEMM there);
  // cleared for good if the device or cuBLASLt has no such GEMM.
  bool fp8_head_gemm_ = true;
  DeviceBuffer fp8_x_;         // e4m3 [T4, max(hidden, Hq * D, intermediate)]: a projection's quantized input
  DeviceBuffer fp8_x_scales_;  // f32 per token (or token x 128-group) of fp8_x_
  int64_t fp8_x_width_ = 0;    // the widest projection input (bytes per row of fp8_x_)
  std::unique_ptr<FastAttention> fast_;
  // Two-batch overlap of large graph decode steps (PAGODA_TWO_BATCH_OVERLAP=<min bucket>; null: off), and
  // whether this step runs as two lanes.
  std::unique_ptr<TwoBatchOverlap> two_batch_;
  bool step_two_batch_ = false;
  int64_t two_batch_steps_ = 0;
  bool weights_block128_ = false;  // some projection has 128-block fp8 scales (lanes cannot split those)
  // DeepSeek (MLA + MoE) configs: their layers run here instead of the llama loop.
  std::unique_ptr<CudaDeepseekForward> deepseek_;
  int64_t fast_attention_steps_ = 0;

  // Step metadata (step_plan.h): pinned host mirror and device copy, same layout.
  PinnedBuffer host_metadata_buffer_;
  DeviceBuffer device_metadata_buffer_;
  StepMetadata host_;
  StepMetadata device_;

  // Scratch for max_num_tokens rows.
  DeviceBuffer residual_;  // f32 [T, hidden]
  DeviceBuffer normed_;    // bf16 [T, hidden]
  DeviceBuffer qkv_;       // bf16 [T, (Hq + 2 Hkv) * D]
  DeviceBuffer attn_;      // bf16 [T, Hq * D]
  // Token eviction's mass from the decode kernel (choose_kernel_scores): the
  // step's score rows [rows][Hq][stride] f32. mass_graph_ is allocated once
  // (graphs bake its address in) for the largest bucket it fits, at most
  // kMaxKernelScoreBytes; mass_step_ grows for eager steps.
  DeviceBuffer mass_graph_;
  bool mass_graph_tried_ = false;
  DeviceBuffer mass_step_;
  float* kernel_scores_ = nullptr;  // this step's rows, or null: the scoring pass
  int64_t kernel_score_stride_ = 0;
  bool kernel_mass_ = true;
  int64_t kernel_mass_steps_ = 0;
  int64_t scoring_pass_steps_ = 0;
  DeviceBuffer q_contig_;  // bf16 [T, Hq * D]: q for the fast kernels, which take it contiguous
  DeviceBuffer proj_;      // bf16 [T, hidden]
  DeviceBuffer gate_up_;   // bf16 [T, 2 * intermediate]
  DeviceBuffer act_;       // bf16 [T, intermediate]
  DeviceBuffer head_normed_;  // bf16 [max_rows, hidden]
  DeviceBuffer logits_;    // f32 [max_rows, vocab]
  DeviceBuffer tokens_;    // int32 [max_rows]
  // Sampling (allocated on first use): params [max_rows], then tokens int32
  // [max_rows], then logprobs f32 [max_rows]; pinned mirror for async copies.
  SampledOutput sampled_;
  PinnedBuffer sampling_host_;
  DeviceBuffer sampling_device_;
  int async_slot_ = -1;         // forward_launched()'s slot during its run(), else -1
  cudaEvent_t outputs_ready_[2] = {nullptr, nullptr};  // a launched step's tokens are in its pinned slot
  cudaEvent_t inputs_consumed_ = nullptr;  // the last forward's uploads from pinned staging are done
  bool inputs_consumed_recorded_ = false;
  PinnedBuffer deferred_host_;  // int32 pairs (token index, source row) [max_num_tokens]
  DeviceBuffer deferred_device_;
  PinnedBuffer score_host_;     // GpuScoreRequest [max_rows], then GpuRowScore [max_rows] (first scored step)
  DeviceBuffer score_device_;   // the same on the device
  PinnedBuffer mask_host_;      // [max_rows] row indices, then [max_rows, words] masks (first masked step)
  PinnedBuffer edit_host_;   // GpuLogitEditRow [max_rows], then GpuLogitEdit [..] (grows with the lists)
  DeviceBuffer edit_device_;  // the same on the device
  size_t edit_bytes_ = 0;     // both buffers' size
  DeviceBuffer mask_device_;    // the same on the device
  DeviceBuffer inv_freq_;  // f32 [D / 2]

  struct Graph {
    cudaGraphExec_t exec = nullptr;
    const CudaKvPool* pool = nullptr;  // the pool whose addresses the graph baked in
    bool fast_attention = false;       // captured with backend/cuda/attention's graph-mode decode attention
    bool kernel_mass = false;          // its scoring came from the decode kernel's scores (mass_graph_)
    bool two_batch = false;            // captured as two lanes (two_batch_overlap.h)
  };
  std::map<int32_t, Graph> graphs_;  // by graph_key
  KvLayerWaits layer_waits_;  // for the next run() only
  CudaKvScores* kv_scores_ = nullptr;
  bool step_has_holes_ = false;  // this run()'s step has per-head holes: eager, no graph

  // Tensor parallelism (attach_tensor_parallel); rank 0 of 1 and null otherwise.
  TensorShard shard_;
  parallel::DeviceCommunicator* comm_ = nullptr;
  DeviceBuffer shard_logits_;     // f32 [max_rows, vocab_chunk]: this rank's logits, packed [rows, local vocab]
  DeviceBuffer gathered_logits_;  // f32 [ranks, max_rows, vocab_chunk]: every rank's, by rank
  int64_t graph_replays_ = 0;
  int64_t profile_replay_ = -1;  // PAGODA_CUDA_PROFILE_REPLAY: the graph replay a profiler sees, -1 none
  int64_t eager_steps_ = 0;          // forwards outside the graph path (neither replay nor capture)
  int64_t profile_eager_step_ = -1;  // PAGODA_CUDA_PROFILE_EAGER_STEP: the eager step a profiler sees, -1 none
};

}  // namespace pagoda::cuda
