#include "pagoda/backend/cpu/cpu_kv_eviction.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "pagoda/runtime/kv_compression.h"

namespace pagoda {

void CpuSequenceEviction::reserve(int64_t length) {
  if (length <= capacity) return;
  const int64_t grown = std::max(length, capacity * 2);
  const size_t heads = static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads);
  std::vector<float> next(heads * static_cast<size_t>(grown), 0.0f);
  for (size_t h = 0; h < heads && capacity > 0; ++h)
    std::copy_n(mass.data() + h * static_cast<size_t>(capacity), capacity, next.data() + h * static_cast<size_t>(grown));
  mass = std::move(next);
  capacity = grown;
}

kernels::PagedSequenceEviction CpuSequenceEviction::layer_view(int32_t layer, int32_t score_from_index) {
  kernels::PagedSequenceEviction v;
  const size_t first_head = static_cast<size_t>(layer) * static_cast<size_t>(num_kv_heads);
  if (!head_kept.empty()) {
    v.head_kept = head_kept.data() + first_head;
    v.compacted_length = compacted_length;
  }
  if (score_from_index != std::numeric_limits<int32_t>::max()) {
    v.mass = mass.data() + first_head * static_cast<size_t>(capacity);
    v.mass_stride = capacity;
    v.entropy_sum = entropy_sum.data() + first_head;
    v.entropy_count = entropy_count.data() + first_head;
    v.score_from_index = score_from_index;
  }
  return v;
}

const CpuSequenceEviction* CpuKvEviction::find(int64_t kv_state) const {
  const auto it = states_.find(kv_state);
  return it == states_.end() ? nullptr : &it->second;
}

std::vector<CpuSequenceEviction*> CpuKvEviction::prepare(const ForwardBatch& batch) {
  std::vector<CpuSequenceEviction*> out(batch.sequences.size(), nullptr);
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& s = batch.sequences[i];
    if (s.kv_state == 0) continue;
    auto [it, fresh] = states_.try_emplace(s.kv_state);
    CpuSequenceEviction& st = it->second;
    if (fresh || s.kv_state_reset) {
      st = CpuSequenceEviction{};
      st.num_layers = num_layers_;
      st.num_kv_heads = num_kv_heads_;
      const size_t heads = static_cast<size_t>(num_layers_) * static_cast<size_t>(num_kv_heads_);
      st.entropy_sum.assign(heads, 0.0);
      st.entropy_count.assign(heads, 0);
    }
    st.reserve(static_cast<int64_t>(s.num_cached_tokens) + s.num_new_tokens);
    out[i] = &st;
  }
  return out;
}

namespace {

// Copies one (index, head) vector of K or V, with its scale records, between slots.
void copy_vector(std::byte* data, std::byte* scales, DType dtype, const kernels::PagedKvLayer& lay, int64_t src,
                 int64_t dst, int32_t head) {
  const size_t bytes = kernels::kv_head_bytes(lay.head_dim, dtype);
  const size_t heads = static_cast<size_t>(lay.num_kv_heads);
  std::memcpy(data + (static_cast<size_t>(dst) * heads + static_cast<size_t>(head)) * bytes,
              data + (static_cast<size_t>(src) * heads + static_cast<size_t>(head)) * bytes, bytes);
  const size_t scale_bytes = kernels::kv_head_scale_bytes(lay.head_dim, dtype);
  if (scales == nullptr || scale_bytes == 0) return;
  std::memcpy(scales + static_cast<size_t>(kernels::kv_scale_vector(dst, head, lay.block_size, lay.num_kv_heads)) * scale_bytes,
              scales + static_cast<size_t>(kernels::kv_scale_vector(src, head, lay.block_size, lay.num_kv_heads)) * scale_bytes,
              scale_bytes);
}

}  // namespace

Status CpuKvEviction::compact(const runtime::KvCompaction& c, CpuKvPool& pool) {
  const KvPoolShape& shape = pool.shape();
  const int32_t bs = shape.block_size;
  PAGODA_RETURN_IF_ERROR(runtime::check_kv_compaction(c, shape.num_blocks, bs));

  auto [it, fresh] = states_.try_emplace(c.kv_state);
  CpuSequenceEviction& st = it->second;
  const size_t heads = static_cast<size_t>(num_layers_) * static_cast<size_t>(num_kv_heads_);
  if (fresh) {
    st.num_layers = num_layers_;
    st.num_kv_heads = num_kv_heads_;
    st.entropy_sum.assign(heads, 0.0);
    st.entropy_count.assign(heads, 0);
  }
  st.reserve(c.old_length);
  if (!st.head_kept.empty() && st.compacted_length > c.old_length)
    return invalid_argument_error("compact_kv: sequence {}: {} tokens, fewer than its compacted region of {}",
                                  c.kv_state, c.old_length, st.compacted_length);

  std::vector<float> entropy(heads, 0.0f);
  for (size_t i = 0; i < heads; ++i)
    entropy[i] = st.entropy_count[i] > 0 ? static_cast<float>(st.entropy_sum[i] / st.entropy_count[i]) : 0.0f;
  const std::vector<int32_t> budgets = runtime::kv_head_budgets(c.config, num_layers_, num_kv_heads_, entropy);
  const bool keep_mass = runtime::kv_policy_accumulates(c.config.policy);

  auto slot = [bs](const std::vector<int32_t>& table, int32_t index) {
    return static_cast<int64_t>(table[static_cast<size_t>(index / bs)]) * bs + index % bs;
  };
  std::vector<int32_t> new_kept(heads, 0);
  std::vector<int32_t> valid;
  std::vector<float> scores;
  for (int32_t l = 0; l < num_layers_; ++l) {
    kernels::PagedKvLayer lay = pool.layer(l);
    for (int32_t h = 0; h < num_kv_heads_; ++h) {
      const size_t lh = static_cast<size_t>(l) * static_cast<size_t>(num_kv_heads_) + static_cast<size_t>(h);
      valid.clear();
      const int32_t kept_before = st.head_kept.empty() ? 0 : st.head_kept[lh];
      const int32_t hole_end = st.head_kept.empty() ? 0 : st.compacted_length;
      for (int32_t i = 0; i < kept_before; ++i) valid.push_back(i);
      for (int32_t i = hole_end; i < c.old_length; ++i) valid.push_back(i);
      float* mass = st.mass.data() + lh * static_cast<size_t>(st.capacity);
      scores.resize(valid.size());
      for (size_t i = 0; i < valid.size(); ++i) scores[i] = mass[valid[i]];
      const int32_t budget = std::min(budgets[lh], c.new_length);
      const std::vector<int32_t> kept =
          runtime::select_kept_tokens(c.config, budget, static_cast<int32_t>(valid.size()), scores);
      for (size_t k = 0; k < kept.size(); ++k) {
        const int32_t src = valid[static_cast<size_t>(kept[k])];
        const int64_t from = slot(c.old_block_table, src), to = slot(c.new_block_table, static_cast<int32_t>(k));
        copy_vector(static_cast<std::byte*>(lay.key), static_cast<std::byte*>(lay.key_scales), lay.key_dtype, lay,
                    from, to, h);
        copy_vector(static_cast<std::byte*>(lay.value), static_cast<std::byte*>(lay.value_scales), lay.value_dtype,
                    lay, from, to, h);
        mass[k] = keep_mass ? mass[src] : 0.0f;  // k <= src: forward copy in place is safe
      }
      std::fill(mass + kept.size(), mass + st.capacity, 0.0f);
      new_kept[lh] = static_cast<int32_t>(kept.size());
    }
  }
  st.head_kept = std::move(new_kept);
  st.compacted_length = c.new_length;
  std::fill(st.entropy_sum.begin(), st.entropy_sum.end(), 0.0);
  std::fill(st.entropy_count.begin(), st.entropy_count.end(), 0);
  return ok_status();
}

}  // namespace pagoda
