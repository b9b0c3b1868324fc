#include "pagoda/backend/cuda/cuda_kv_scores.h"

#include <algorithm>
#include <limits>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/kv_attention_mass.h"
#include "pagoda/backend/cuda/kv_compact.h"
#include "pagoda/backend/cuda/kv_select.h"
#include "pagoda/runtime/kv_compression.h"

namespace pagoda::cuda {

Status CudaKvScores::reset(State& st, cudaStream_t stream) {
  const size_t heads = static_cast<size_t>(num_layers_) * static_cast<size_t>(num_kv_heads_);
  if (st.entropy.bytes() == 0) {
    PAGODA_ASSIGN_OR_RETURN(st.entropy, DeviceBuffer::allocate(heads * sizeof(double)));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(st.entropy.data(), 0, heads * sizeof(double), stream));
  if (st.capacity > 0)
    PAGODA_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(st.mass.data(), 0, heads * static_cast<size_t>(st.capacity) * sizeof(float), stream));
  st.entropy_count = 0;
  return ok_status();
}

Status CudaKvScores::grow(State& st, int64_t length, cudaStream_t stream) {
  if (length <= st.capacity) return ok_status();
  const int64_t grown = std::max(length, st.capacity * 2);
  const size_t heads = static_cast<size_t>(num_layers_) * static_cast<size_t>(num_kv_heads_);
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer next, DeviceBuffer::allocate(heads * static_cast<size_t>(grown) * sizeof(float)));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(next.data(), 0, next.bytes(), stream));
  if (st.capacity > 0)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(next.data(), static_cast<size_t>(grown) * sizeof(float), st.mass.data(),
                                                  static_cast<size_t>(st.capacity) * sizeof(float),
                                                  static_cast<size_t>(st.capacity) * sizeof(float), heads,
                                                  cudaMemcpyDeviceToDevice, stream));
  // The old buffer is freed below while the copy may still read it: cudaFree waits for the device.
  st.mass = std::move(next);
  st.capacity = grown;
  return ok_status();
}

StatusOr<bool> CudaKvScores::prepare_holes(const ForwardBatch& batch, cudaStream_t stream) {
  const size_t n = batch.sequences.size();
  bool any = false;
  for (size_t i = 0; i < n && !any; ++i) {
    const SequenceSlice& s = batch.sequences[i];
    if (s.kv_state == 0 || s.kv_state_reset) continue;
    const auto it = states_.find(s.kv_state);
    any = it != states_.end() && !it->second.head_kept.empty();
  }
  if (!any) return false;
  const size_t heads = static_cast<size_t>(num_kv_heads_);
  const size_t per_layer = n * heads;
  holes_host_.assign(static_cast<size_t>(num_layers_) * per_layer + n, 0);
  for (size_t i = 0; i < n; ++i) {
    const SequenceSlice& s = batch.sequences[i];
    if (s.kv_state == 0 || s.kv_state_reset) continue;
    const auto it = states_.find(s.kv_state);
    if (it == states_.end() || it->second.head_kept.empty()) continue;
    const State& st = it->second;
    for (int32_t l = 0; l < num_layers_; ++l)
      for (size_t h = 0; h < heads; ++h)
        holes_host_[static_cast<size_t>(l) * per_layer + i * heads + h] =
            st.head_kept[static_cast<size_t>(l) * heads + h];
    holes_host_[static_cast<size_t>(num_layers_) * per_layer + i] = st.compacted_length;
  }
  const size_t bytes = holes_host_.size() * sizeof(int32_t);
  if (holes_.bytes() < bytes) {
    PAGODA_ASSIGN_OR_RETURN(holes_, DeviceBuffer::allocate(std::max(bytes, holes_.bytes() * 2)));
  }
  // Pageable source: staged before the call returns.
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(holes_.data(), holes_host_.data(), bytes, cudaMemcpyHostToDevice, stream));
  holes_sequences_ = static_cast<int64_t>(n);
  return true;
}

Status CudaKvScores::prepare(const ForwardBatch& batch, int64_t table_stride, cudaStream_t stream,
                             int32_t graph_slots, int32_t graph_capacity) {
  items_.clear();
  sequences_.clear();
  num_items_ = 0;
  launch_items_ = 0;
  const int32_t group = num_q_heads_ / num_kv_heads_;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& s = batch.sequences[i];
    if (s.kv_state == 0) continue;
    if (s.kv_state_reset) states_.erase(s.kv_state);
    // A state exists only once its sequence scores (streaming never does), and is sized then.
    const int32_t end = s.num_cached_tokens + s.num_new_tokens;
    if (s.score_from_index == std::numeric_limits<int32_t>::max() || end <= s.score_from_index) continue;
    auto [it, fresh] = states_.try_emplace(s.kv_state);
    State& st = it->second;
    if (fresh) PAGODA_RETURN_IF_ERROR(reset(st, stream));
    PAGODA_RETURN_IF_ERROR(grow(st, end, stream));
    const int32_t index = static_cast<int32_t>(sequences_.size());
    bool any = false;
    for (int32_t j = 0; j < s.num_new_tokens; ++j) {
      const int32_t query_index = s.num_cached_tokens + j;
      if (query_index < s.score_from_index) continue;
      items_.push_back({s.token_offset + j, index, query_index, 0});
      st.entropy_count += group;
      any = true;
    }
    if (any)
      sequences_.push_back({st.mass.as<float>(), st.entropy.as<double>(), st.capacity,
                            static_cast<int64_t>(i) * table_stride,
                            st.head_kept.empty() ? nullptr : st.head_kept_device.as<int32_t>(),
                            st.head_kept.empty() ? 0 : st.compacted_length, 0});
  }
  if (items_.empty()) return ok_status();
  if (graph_slots > 0) return upload_for_graph(graph_slots, graph_capacity, stream);
  const size_t item_bytes = items_.size() * sizeof(KvScoreItem);
  const size_t bytes = item_bytes + sequences_.size() * sizeof(KvScoreSequence);
  if (step_buffer_.bytes() < bytes) {
    PAGODA_ASSIGN_OR_RETURN(step_buffer_, DeviceBuffer::allocate(std::max(bytes, step_buffer_.bytes() * 2)));
  }
  // Pageable sources: the calls return once the bytes are staged, so the vectors may change afterwards.
  PAGODA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(step_buffer_.data(), items_.data(), item_bytes, cudaMemcpyHostToDevice, stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(step_buffer_.data()) + item_bytes, sequences_.data(),
                                              sequences_.size() * sizeof(KvScoreSequence), cudaMemcpyHostToDevice,
                                              stream));
  num_items_ = static_cast<int32_t>(items_.size());
  launch_items_ = num_items_;
  launch_buffer_ = step_buffer_.data();
  launch_sequences_offset_ = num_items_;
  launch_splits_ = kv_attention_scores_splits(launch_items_, num_kv_heads_);
  const size_t scratch = kv_attention_scores_scratch_bytes(launch_items_, num_kv_heads_, launch_splits_);
  if (step_scratch_.bytes() < scratch) {
    // The old scratch may still be read by the last step's launches: cudaFree waits for them.
    PAGODA_ASSIGN_OR_RETURN(step_scratch_, DeviceBuffer::allocate(std::max(scratch, step_scratch_.bytes() * 2)));
  }
  launch_scratch_ = step_scratch_.data();
  return ok_status();
}

Status CudaKvScores::upload_for_graph(int32_t slots, int32_t capacity, cudaStream_t stream) {
  if (graph_capacity_ == 0) {
    // Allocated once: every graph recorded with scoring has this address baked in.
    graph_capacity_ = std::max(capacity, slots);
    PAGODA_ASSIGN_OR_RETURN(graph_buffer_,
                            DeviceBuffer::allocate(static_cast<size_t>(graph_capacity_) *
                                                   (sizeof(KvScoreItem) + sizeof(KvScoreSequence))));
    // Room for any bucket's launch at the most splits.
    const size_t scratch = kv_attention_scores_scratch_bytes(graph_capacity_, num_kv_heads_, kMaxScoreSplits);
    PAGODA_ASSIGN_OR_RETURN(graph_scratch_, DeviceBuffer::allocate(scratch));
  }
  if (slots > graph_capacity_ || static_cast<int32_t>(items_.size()) > slots ||
      static_cast<int32_t>(sequences_.size()) > slots)
    return internal_error("kv scores: {} scoring queries of {} sequences for a graph of {} slots (capacity {})",
                          items_.size(), sequences_.size(), slots, graph_capacity_);
  num_items_ = static_cast<int32_t>(items_.size());
  // Padding items name no sequence: the kernel's CTAs for them return at once.
  items_.resize(static_cast<size_t>(slots), KvScoreItem{0, -1, 0, 0});
  sequences_.resize(static_cast<size_t>(slots), KvScoreSequence{});
  char* base = static_cast<char*>(graph_buffer_.data());
  const size_t item_bytes = static_cast<size_t>(slots) * sizeof(KvScoreItem);
  // The sequences sit after graph_capacity_ items (a fixed offset the recorded launches use).
  char* sequences = base + static_cast<size_t>(graph_capacity_) * sizeof(KvScoreItem);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base, items_.data(), item_bytes, cudaMemcpyHostToDevice, stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sequences, sequences_.data(),
                                              static_cast<size_t>(slots) * sizeof(KvScoreSequence),
                                              cudaMemcpyHostToDevice, stream));
  launch_items_ = slots;
  launch_buffer_ = graph_buffer_.data();
  launch_sequences_offset_ = graph_capacity_;
  launch_splits_ = kv_attention_scores_splits(slots, num_kv_heads_);
  if (kv_attention_scores_scratch_bytes(slots, num_kv_heads_, launch_splits_) > graph_scratch_.bytes())
    return internal_error("kv scores: a graph of {} slots needs more scoring scratch than was set aside", slots);
  launch_scratch_ = graph_scratch_.data();
  return ok_status();
}

Status CudaKvScores::score_layer(int32_t layer, const bf16* q, int64_t q_row_stride, float scale,
                                 const DevicePagedKvLayer& kv, const int32_t* block_tables,
                                 cudaStream_t stream) const {
  if (num_items_ == 0) return ok_status();
  const auto* items = static_cast<const KvScoreItem*>(launch_buffer_);
  const auto* sequences = reinterpret_cast<const KvScoreSequence*>(
      static_cast<const char*>(launch_buffer_) + static_cast<size_t>(launch_sequences_offset_) * sizeof(KvScoreItem));
  PAGODA_CUDA_RETURN_IF_ERROR(kv_attention_scores(q, q_row_stride, num_q_heads_, scale, kv, layer, block_tables, items,
                                                  launch_items_, sequences, launch_splits_, launch_scratch_,
                                                  stream));
  return ok_status();
}

Status CudaKvScores::mass_layer(int32_t layer, const float* scores, int64_t score_stride, cudaStream_t stream) const {
  if (num_items_ == 0) return ok_status();
  const auto* items = static_cast<const KvScoreItem*>(launch_buffer_);
  const auto* sequences = reinterpret_cast<const KvScoreSequence*>(
      static_cast<const char*>(launch_buffer_) + static_cast<size_t>(launch_sequences_offset_) * sizeof(KvScoreItem));
  PAGODA_CUDA_RETURN_IF_ERROR(kv_attention_mass_from_scores(scores, score_stride, num_q_heads_, num_kv_heads_, layer,
                                                            items, launch_items_, sequences, stream));
  return ok_status();
}

StatusOr<CudaKvScores::HostScores> CudaKvScores::download(int64_t kv_state, int32_t length,
                                                          cudaStream_t stream) const {
  const auto it = states_.find(kv_state);
  if (it == states_.end()) return not_found_error("kv scores: no state {}", kv_state);
  const State& st = it->second;
  if (length < 0 || length > st.capacity)
    return out_of_range_error("kv scores: length {} outside the state's {}", length, st.capacity);
  const size_t heads = static_cast<size_t>(num_layers_) * static_cast<size_t>(num_kv_heads_);
  HostScores out;
  out.mass.resize(heads * static_cast<size_t>(length));
  out.entropy_sum.resize(heads);
  out.entropy_count = st.entropy_count;
  if (length > 0)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(out.mass.data(), static_cast<size_t>(length) * sizeof(float),
                                                  st.mass.data(), static_cast<size_t>(st.capacity) * sizeof(float),
                                                  static_cast<size_t>(length) * sizeof(float), heads,
                                                  cudaMemcpyDeviceToHost, stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.entropy_sum.data(), st.entropy.data(), heads * sizeof(double),
                                              cudaMemcpyDeviceToHost, stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return out;
}

namespace {

// Grows a scratch buffer to at least `bytes` (doubling), keeping nothing.
Status ensure_bytes(DeviceBuffer& b, size_t bytes) {
  if (b.bytes() < bytes) {
    PAGODA_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(std::max(bytes, b.bytes() * 2)));
  }
  return ok_status();
}

}  // namespace

CudaKvScores::HeadLayout CudaKvScores::head_layout(int64_t kv_state) const {
  const auto it = states_.find(kv_state);
  if (it == states_.end()) return {};
  return {it->second.head_kept, it->second.compacted_length};
}

Status CudaKvScores::store_head_layout(State& st, std::vector<int32_t> head_kept, int32_t compacted_length,
                                       cudaStream_t stream) {
  const size_t bytes = head_kept.size() * sizeof(int32_t);
  if (bytes > 0) {
    if (st.head_kept_device.bytes() < bytes) {
      PAGODA_ASSIGN_OR_RETURN(st.head_kept_device, DeviceBuffer::allocate(bytes));
    }
    // Pageable source: staged before the call returns, so the host vector may change afterwards.
    PAGODA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(st.head_kept_device.data(), head_kept.data(), bytes, cudaMemcpyHostToDevice, stream));
  }
  st.head_kept = std::move(head_kept);
  st.compacted_length = compacted_length;
  return ok_status();
}

Status CudaKvScores::set_head_layout(int64_t kv_state, const HeadLayout& layout, cudaStream_t stream) {
  const size_t heads = static_cast<size_t>(num_layers_) * static_cast<size_t>(num_kv_heads_);
  if (layout.head_kept.size() != heads)
    return invalid_argument_error("kv scores: a head layout of {} kept counts for {} heads", layout.head_kept.size(),
                                  heads);
  for (int32_t k : layout.head_kept)
    if (k < 0 || k > layout.compacted_length)
      return invalid_argument_error("kv scores: kept count {} outside [0, {}]", k, layout.compacted_length);
  auto [it, fresh] = states_.try_emplace(kv_state);
  if (fresh) PAGODA_RETURN_IF_ERROR(reset(it->second, stream));
  PAGODA_RETURN_IF_ERROR(store_head_layout(it->second, layout.head_kept, layout.compacted_length, stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return ok_status();
}

Status CudaKvScores::upload(int64_t kv_state, const HostScores& in, int32_t length, cudaStream_t stream) {
  const size_t heads = static_cast<size_t>(num_layers_) * static_cast<size_t>(num_kv_heads_);
  if (length < 0 || in.mass.size() != heads * static_cast<size_t>(length) || in.entropy_sum.size() != heads)
    return invalid_argument_error("kv scores: upload of {} mass and {} entropy entries for {} heads x {}",
                                  in.mass.size(), in.entropy_sum.size(), heads, length);
  auto [it, fresh] = states_.try_emplace(kv_state);
  State& st = it->second;
  if (fresh) PAGODA_RETURN_IF_ERROR(reset(st, stream));
  PAGODA_RETURN_IF_ERROR(grow(st, length, stream));
  if (length > 0)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(st.mass.data(), static_cast<size_t>(st.capacity) * sizeof(float),
                                                  in.mass.data(), static_cast<size_t>(length) * sizeof(float),
                                                  static_cast<size_t>(length) * sizeof(float), heads,
                                                  cudaMemcpyHostToDevice, stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(st.entropy.data(), in.entropy_sum.data(), heads * sizeof(double),
                                              cudaMemcpyHostToDevice, stream));
  st.entropy_count = in.entropy_count;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return ok_status();
}

Status CudaKvScores::compact_heads(const runtime::KvCompaction& c, CudaKvPool& pool, DeviceBuffer& moves_buffer,
                                   cudaStream_t stream) {
  const int32_t bs = pool.shape().block_size;
  const int32_t heads = num_layers_ * num_kv_heads_;
  const size_t nheads = static_cast<size_t>(heads);
  auto [it, fresh] = states_.try_emplace(c.kv_state);
  State& st = it->second;
  if (fresh) PAGODA_RETURN_IF_ERROR(reset(st, stream));
  PAGODA_RETURN_IF_ERROR(grow(st, c.old_length, stream));
  if (!st.head_kept.empty() && st.compacted_length > c.old_length)
    return invalid_argument_error("compact_kv: sequence {}: {} tokens, fewer than its compacted region of {}",
                                  c.kv_state, c.old_length, st.compacted_length);
  // The CPU's budgets (CpuKvEviction::compact): entropy from the mean normalized entropy of each head.
  std::vector<float> entropy(nheads, 0.0f);
  if (c.config.policy == runtime::KvCompressionPolicy::kEntropy && st.entropy_count > 0) {
    std::vector<double> sums(nheads);
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sums.data(), st.entropy.data(), nheads * sizeof(double),
                                                cudaMemcpyDeviceToHost, stream));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < nheads; ++i) entropy[i] = static_cast<float>(sums[i] / st.entropy_count);
  }
  const std::vector<int32_t> budgets = runtime::kv_head_budgets(c.config, num_layers_, num_kv_heads_, entropy);
  if (budgets.size() != nheads)
    return internal_error("compact_kv: {} head budgets for {} heads", budgets.size(), nheads);
  // Per head: its candidates (the kept tokens of the compacted region, then the tokens after its
  // holes), their shape at the head's budget, and the kept count that follows.
  std::vector<KvSelectHead> rows(nheads);
  std::vector<int32_t> new_kept(nheads, 0);
  int32_t max_middle = 0;
  for (size_t lh = 0; lh < nheads; ++lh) {
    const int32_t kept_before = st.head_kept.empty() ? 0 : st.head_kept[lh];
    const int32_t hole_end = st.head_kept.empty() ? 0 : st.compacted_length;
    const int32_t num_valid = kept_before + (c.old_length - hole_end);
    const int32_t budget = std::min(budgets[lh], c.new_length);
    KvSelectHead& row = rows[lh];
    row.shape =
        kv_select_shape(1, num_valid, budget, c.config.sink_tokens, c.config.window, false, true, c.config.span);
    row.gap_at = kept_before;
    row.gap_len = hole_end - kept_before;
    if (row.shape.kept > c.new_length || row.gap_len < 0)
      return internal_error("compact_kv: head {} keeps {} of a compacted region of {} (gap {})", lh, row.shape.kept,
                            c.new_length, row.gap_len);
    new_kept[lh] = row.shape.kept;
    if (row.shape.take > 0) max_middle = std::max(max_middle, row.shape.num_valid - row.shape.sinks - row.shape.recent);
  }
  const size_t new_len = static_cast<size_t>(c.new_length);
  const size_t count = nheads * new_len;
  if (count > 0) {
    const size_t rows_bytes = nheads * sizeof(KvSelectHead);
    PAGODA_RETURN_IF_ERROR(ensure_bytes(head_rows_, rows_bytes + nheads * sizeof(int32_t)));
    PAGODA_RETURN_IF_ERROR(
        ensure_bytes(select_scratch_, std::max<size_t>(1, kv_select_heads_scratch_bytes(heads, max_middle))));
    PAGODA_RETURN_IF_ERROR(ensure_bytes(kept_, count * sizeof(int32_t)));
    PAGODA_RETURN_IF_ERROR(ensure_bytes(moves_buffer, count * sizeof(KvVectorMove)));
    const size_t old_blocks = c.old_block_table.size(), new_blocks = c.new_block_table.size();
    PAGODA_RETURN_IF_ERROR(ensure_bytes(tables_, (old_blocks + new_blocks + 1) * sizeof(int32_t)));
    // Pageable sources: the copies return once the bytes are staged, so the host vectors may go.
    PAGODA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(head_rows_.data(), rows.data(), rows_bytes, cudaMemcpyHostToDevice, stream));
    int32_t* kept_counts = reinterpret_cast<int32_t*>(static_cast<char*>(head_rows_.data()) + rows_bytes);
    PAGODA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(kept_counts, new_kept.data(), nheads * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    if (old_blocks > 0)
      PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tables_.data(), c.old_block_table.data(),
                                                  old_blocks * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    if (new_blocks > 0)
      PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tables_.as<int32_t>() + old_blocks, c.new_block_table.data(),
                                                  new_blocks * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    PAGODA_CUDA_RETURN_IF_ERROR(kv_select_kept_heads(st.mass.as<float>(), st.capacity,
                                                     static_cast<const KvSelectHead*>(head_rows_.data()), heads,
                                                     max_middle, c.new_length, select_scratch_.data(),
                                                     kept_.as<int32_t>(), stream));
    PAGODA_CUDA_RETURN_IF_ERROR(kv_build_moves_ragged(kept_.as<int32_t>(), heads, c.new_length, kept_counts,
                                                      num_kv_heads_, tables_.as<int32_t>(),
                                                      tables_.as<int32_t>() + old_blocks, bs,
                                                      moves_buffer.as<KvVectorMove>(), stream));
    const int64_t per_layer = static_cast<int64_t>(num_kv_heads_) * static_cast<int64_t>(new_len);
    for (int32_t l = 0; l < num_layers_; ++l)
      PAGODA_CUDA_RETURN_IF_ERROR(
          kv_move_vectors(pool.layer(l), moves_buffer.as<KvVectorMove>() + l * per_layer, per_layer, stream));
  }
  // pyramidkv and entropy score like snapkv: the mass starts afresh (zero), and the state shrinks
  // back towards the budget as the other policies' does.
  if (st.capacity > 4 * static_cast<int64_t>(new_len) + 64) {
    const int64_t smaller = 2 * static_cast<int64_t>(new_len) + 64;
    PAGODA_ASSIGN_OR_RETURN(DeviceBuffer next,
                            DeviceBuffer::allocate(nheads * static_cast<size_t>(smaller) * sizeof(float)));
    st.mass = std::move(next);  // the old buffer's cudaFree waits for work in flight
    st.capacity = smaller;
  }
  PAGODA_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(st.mass.data(), 0, nheads * static_cast<size_t>(st.capacity) * sizeof(float), stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(st.entropy.data(), 0, nheads * sizeof(double), stream));
  st.entropy_count = 0;
  return store_head_layout(st, std::move(new_kept), c.new_length, stream);
}

Status CudaKvScores::compact(const runtime::KvCompaction& c, CudaKvPool& pool, DeviceBuffer& moves_buffer,
                             cudaStream_t stream) {
  const KvPoolShape& shape = pool.shape();
  const int32_t bs = shape.block_size;
  PAGODA_RETURN_IF_ERROR(runtime::check_kv_compaction(c, shape.num_blocks, bs));
  if (c.config.policy == runtime::KvCompressionPolicy::kPyramidKV ||
      c.config.policy == runtime::KvCompressionPolicy::kEntropy)
    return compact_heads(c, pool, moves_buffer, stream);
  const bool streaming = c.config.policy == runtime::KvCompressionPolicy::kStreaming;
  // Streaming keeps the same indices in every layer and head (sinks and the most recent) and has no
  // scores: one row of kept indices per KV head, one set of moves, gathered in every layer.
  const int32_t heads = streaming ? num_kv_heads_ : num_layers_ * num_kv_heads_;
  // Streaming, h2o and snapkv give every head the same budget, so one shape serves all heads.
  const int32_t budget = std::min(c.config.budget, c.new_length);
  const KvSelectShape select = kv_select_shape(heads, c.old_length, budget, c.config.sink_tokens, c.config.window,
                                               streaming, c.config.policy == runtime::KvCompressionPolicy::kSnapKV,
                                               c.config.span);
  if (select.kept != c.new_length)
    return invalid_argument_error("compact_kv: sequence {}: {} kept tokens per head for a compacted region of {} (the "
                                  "cuda attention reads no holes)", c.kv_state, select.kept, c.new_length);
  if (streaming && select.take != 0)
    return internal_error("compact_kv: streaming's shape chooses {} tokens by score", select.take);
  const size_t new_len = static_cast<size_t>(c.new_length);
  const size_t count = static_cast<size_t>(heads) * new_len;
  auto ensure = [](DeviceBuffer& b, size_t bytes) -> Status {
    if (b.bytes() < bytes) {
      PAGODA_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(std::max(bytes, b.bytes() * 2)));
    }
    return ok_status();
  };
  // The chosen indices, the gather's moves and the carried mass are computed on the device from the
  // device scores: nothing comes back to the host, and nothing here waits for the device.
  PAGODA_RETURN_IF_ERROR(ensure(select_scratch_, std::max<size_t>(1, kv_select_scratch_bytes(select))));
  PAGODA_RETURN_IF_ERROR(ensure(kept_, std::max<size_t>(1, count * sizeof(int32_t))));
  PAGODA_RETURN_IF_ERROR(ensure(moves_buffer, std::max<size_t>(1, count * sizeof(KvVectorMove))));
  const size_t old_blocks = c.old_block_table.size(), new_blocks = c.new_block_table.size();
  PAGODA_RETURN_IF_ERROR(ensure(tables_, (old_blocks + new_blocks + 1) * sizeof(int32_t)));
  // Pageable sources: the copies return once the bytes are staged, so the tables may go afterwards.
  if (old_blocks > 0)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tables_.data(), c.old_block_table.data(), old_blocks * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream));
  if (new_blocks > 0)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tables_.as<int32_t>() + old_blocks, c.new_block_table.data(),
                                                new_blocks * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  if (streaming) {
    // No scores are read (take is 0), so no state is made: streaming never has one.
    PAGODA_CUDA_RETURN_IF_ERROR(kv_select_kept(nullptr, select.num_valid, select, nullptr, kept_.as<int32_t>(), stream));
    PAGODA_CUDA_RETURN_IF_ERROR(kv_build_moves(kept_.as<int32_t>(), heads, c.new_length, num_kv_heads_,
                                               tables_.as<int32_t>(), tables_.as<int32_t>() + old_blocks, bs, nullptr,
                                               0, false, moves_buffer.as<KvVectorMove>(), nullptr, stream));
    for (int32_t l = 0; count > 0 && l < num_layers_; ++l)
      PAGODA_CUDA_RETURN_IF_ERROR(
          kv_move_vectors(pool.layer(l), moves_buffer.as<KvVectorMove>(), static_cast<int64_t>(count), stream));
    return ok_status();
  }

  auto [it, fresh] = states_.try_emplace(c.kv_state);
  State& st = it->second;
  if (fresh) PAGODA_RETURN_IF_ERROR(reset(st, stream));
  PAGODA_RETURN_IF_ERROR(grow(st, c.old_length, stream));
  const bool keep_mass = runtime::kv_policy_accumulates(c.config.policy);
  PAGODA_RETURN_IF_ERROR(ensure(new_mass_, std::max<size_t>(1, count * sizeof(float))));
  PAGODA_CUDA_RETURN_IF_ERROR(
      kv_select_kept(st.mass.as<float>(), st.capacity, select, select_scratch_.data(), kept_.as<int32_t>(), stream));
  PAGODA_CUDA_RETURN_IF_ERROR(kv_build_moves(kept_.as<int32_t>(), heads, c.new_length, num_kv_heads_,
                                             tables_.as<int32_t>(), tables_.as<int32_t>() + old_blocks, bs,
                                             st.mass.as<float>(), st.capacity, keep_mass,
                                             moves_buffer.as<KvVectorMove>(), new_mass_.as<float>(), stream));
  if (count > 0) {
    const int64_t per_layer = static_cast<int64_t>(num_kv_heads_) * static_cast<int64_t>(new_len);
    for (int32_t l = 0; l < num_layers_; ++l)
      PAGODA_CUDA_RETURN_IF_ERROR(
          kv_move_vectors(pool.layer(l), moves_buffer.as<KvVectorMove>() + l * per_layer, per_layer, stream));
  }
  // A prompt's scores span its whole length; after the compaction a state needs about the budget: give
  // the rest back (decode grows it again by doubling, from twice the compacted length).
  if (st.capacity > 4 * static_cast<int64_t>(new_len) + 64) {
    const int64_t smaller = 2 * static_cast<int64_t>(new_len) + 64;
    PAGODA_ASSIGN_OR_RETURN(DeviceBuffer next, DeviceBuffer::allocate(static_cast<size_t>(heads) *
                                                                      static_cast<size_t>(smaller) * sizeof(float)));
    st.mass = std::move(next);  // the old buffer's cudaFree waits for work in flight
    st.capacity = smaller;
  }
  // The kept tokens' mass (h2o) or none at [0, new_length); nothing beyond.
  const size_t pitch = static_cast<size_t>(st.capacity) * sizeof(float);
  if (new_len > 0)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(st.mass.data(), pitch, new_mass_.data(), new_len * sizeof(float),
                                                  new_len * sizeof(float), static_cast<size_t>(heads),
                                                  cudaMemcpyDeviceToDevice, stream));
  if (static_cast<int64_t>(new_len) < st.capacity)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(st.mass.as<float>() + new_len, pitch, 0,
                                                  (static_cast<size_t>(st.capacity) - new_len) * sizeof(float),
                                                  static_cast<size_t>(heads), stream));
  PAGODA_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(st.entropy.data(), 0, static_cast<size_t>(heads) * sizeof(double), stream));
  st.entropy_count = 0;
  return ok_status();
}

}  // namespace pagoda::cuda
