#include "pagoda/backend/cpu/kernels/paged_attention_tiled.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "pagoda/backend/cpu/kernels/decode_attention_tile.h"
#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/kv_vector_reader.h"
#include "pagoda/backend/cpu/kernels/vector_exp.h"
#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

namespace {

constexpr size_t kQueryBlock = 16;  // new tokens of one sequence per work unit
constexpr size_t kKeyBlock = kDecodeTileKeys;  // key positions per K/V tile (64)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- tile loops: generic ----

// s[j] = sum_d q[d] * kt[d * kKeyBlock + j] for j in [0, kKeyBlock).
void scores_generic(const float* q, const float* kt, size_t head_dim, float* s) {
  for (size_t j = 0; j < kKeyBlock; ++j) s[j] = 0.0f;
  for (size_t d = 0; d < head_dim; ++d) {
    const float qd = q[d];
    const float* row = kt + d * kKeyBlock;
    for (size_t j = 0; j < kKeyBlock; ++j) s[j] += qd * row[j];
  }
}

// acc[d] += sum_{j < n} p[j] * v[j * head_dim + d].
void accumulate_generic(const float* p, const float* v, size_t n, size_t head_dim, float* acc) {
  for (size_t j = 0; j < n; ++j) {
    const float* row = v + j * head_dim;
    for (size_t d = 0; d < head_dim; ++d) acc[d] += p[j] * row[d];
  }
}

// p[j] = exp(s[j] - max) for j in [0, kKeyBlock) (0 where s[j] is -inf); returns sum_j p[j].
float exp_tile_generic(const float* s, float max, float* p) {
  float sum = 0.0f;
  for (size_t j = 0; j < kKeyBlock; ++j) {
    p[j] = s[j] == kNegInf ? 0.0f : std::exp(s[j] - max);
    sum += p[j];
  }
  return sum;
}

// s[g * kKeyBlock] = sum_d q[g][d] * k[d] for each of the G query rows (decode: one key in place).
void key_scores_generic(const float* const* q, size_t G, const float* k, size_t head_dim, float* s) {
  for (size_t g = 0; g < G; ++g) {
    float a = 0.0f;
    for (size_t d = 0; d < head_dim; ++d) a += q[g][d] * k[d];
    s[g * kKeyBlock] = a;
  }
}

// acc[d] += sum_{j < n} p[j] * v[j][d], the value rows given by pointer (decode: read in place).
void accumulate_rows_generic(const float* p, const float* const* v, size_t n, size_t head_dim, float* acc) {
  for (size_t j = 0; j < n; ++j)
    for (size_t d = 0; d < head_dim; ++d) acc[d] += p[j] * v[j][d];
}

// ---- tile loops: AVX2 + FMA ----
#define PAGODA_AVX2 __attribute__((target("avx2,fma")))

PAGODA_AVX2 void scores_avx2(const float* q, const float* kt, size_t head_dim, float* s) {
  static_assert(kKeyBlock == 64, "eight 8-lane accumulators cover one key tile");
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  __m256 a4 = _mm256_setzero_ps(), a5 = _mm256_setzero_ps(), a6 = _mm256_setzero_ps(), a7 = _mm256_setzero_ps();
  for (size_t d = 0; d < head_dim; ++d) {
    const __m256 b = _mm256_broadcast_ss(q + d);
    const float* row = kt + d * kKeyBlock;
    a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row), a0);
    a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 8), a1);
    a2 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 16), a2);
    a3 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 24), a3);
    a4 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 32), a4);
    a5 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 40), a5);
    a6 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 48), a6);
    a7 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 56), a7);
  }
  _mm256_storeu_ps(s, a0);
  _mm256_storeu_ps(s + 8, a1);
  _mm256_storeu_ps(s + 16, a2);
  _mm256_storeu_ps(s + 24, a3);
  _mm256_storeu_ps(s + 32, a4);
  _mm256_storeu_ps(s + 40, a5);
  _mm256_storeu_ps(s + 48, a6);
  _mm256_storeu_ps(s + 56, a7);
}

PAGODA_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

// Four query rows against one key: the key's 8-lane chunks loaded once for all four, the four sums
// reduced together by horizontal adds.
PAGODA_AVX2 void key_scores_avx2(const float* const* q, size_t G, const float* k, size_t head_dim, float* s) {
  const size_t vec = head_dim / 8 * 8;
  size_t g = 0;
  for (; g + 4 <= G; g += 4) {
    const float *q0 = q[g], *q1 = q[g + 1], *q2 = q[g + 2], *q3 = q[g + 3];
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (size_t d = 0; d < vec; d += 8) {
      const __m256 kv = _mm256_loadu_ps(k + d);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), kv, a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), kv, a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), kv, a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d), kv, a3);
    }
    // (a0, a1, a2, a3) -> one 4-lane vector of their sums.
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    alignas(16) float sums[4];
    _mm_store_ps(sums, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    for (size_t r = 0; r < 4; ++r) {
      float a = sums[r];
      for (size_t d = vec; d < head_dim; ++d) a += q[g + r][d] * k[d];
      s[(g + r) * kKeyBlock] = a;
    }
  }
  for (; g < G; ++g) {
    const float* qg = q[g];
    __m256 a0 = _mm256_setzero_ps();
    for (size_t d = 0; d < vec; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + d), _mm256_loadu_ps(k + d), a0);
    float a = hsum_avx2(a0);
    for (size_t d = vec; d < head_dim; ++d) a += qg[d] * k[d];
    s[g * kKeyBlock] = a;
  }
}

PAGODA_AVX2 void accumulate_rows_avx2(const float* p, const float* const* v, size_t n, size_t head_dim, float* acc) {
  size_t d = 0;
  for (; d + 32 <= head_dim; d += 32) {
    __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_loadu_ps(acc + d + 8);
    __m256 a2 = _mm256_loadu_ps(acc + d + 16), a3 = _mm256_loadu_ps(acc + d + 24);
    for (size_t j = 0; j < n; ++j) {
      const __m256 b = _mm256_broadcast_ss(p + j);
      const float* row = v[j] + d;
      a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row), a0);
      a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 8), a1);
      a2 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 16), a2);
      a3 = _mm256_fmadd_ps(b, _mm256_loadu_ps(row + 24), a3);
    }
    _mm256_storeu_ps(acc + d, a0);
    _mm256_storeu_ps(acc + d + 8, a1);
    _mm256_storeu_ps(acc + d + 16, a2);
    _mm256_storeu_ps(acc + d + 24, a3);
  }
  for (; d + 8 <= head_dim; d += 8) {
    __m256 a = _mm256_loadu_ps(acc + d);
    for (size_t j = 0; j < n; ++j) a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(v[j] + d), a);
    _mm256_storeu_ps(acc + d, a);
  }
  for (; d < head_dim; ++d) {
    float a = acc[d];
    for (size_t j = 0; j < n; ++j) a += p[j] * v[j][d];
    acc[d] = a;
  }
}

// acc[d] += sum_{j < n} p[j] * v[j * head_dim + d]: the contiguous V tile as row pointers (n <= kKeyBlock).
PAGODA_AVX2 void accumulate_avx2(const float* p, const float* v, size_t n, size_t head_dim, float* acc) {
  const float* rows[kKeyBlock];
  for (size_t j = 0; j < n; ++j) rows[j] = v + j * head_dim;
  accumulate_rows_avx2(p, rows, n, head_dim, acc);
}

PAGODA_AVX2 float exp_tile_avx2(const float* s, float max, float* p) {
  const __m256 m = _mm256_set1_ps(max), neg_inf = _mm256_set1_ps(kNegInf);
  __m256 sum = _mm256_setzero_ps();
  for (size_t j = 0; j < kKeyBlock; j += 8) {
    const __m256 x = _mm256_loadu_ps(s + j);
    const __m256 live = _mm256_cmp_ps(x, neg_inf, _CMP_NEQ_OQ);  // masked keys give exactly 0
    const __m256 e = _mm256_and_ps(exp_avx2(_mm256_sub_ps(x, m)), live);
    _mm256_storeu_ps(p + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

struct TileOps {
  void (*scores)(const float*, const float*, size_t, float*);
  float (*exp_tile)(const float*, float, float*);
  void (*accumulate)(const float*, const float*, size_t, size_t, float*);
  void (*key_scores)(const float* const*, size_t, const float*, size_t, float*);
  void (*accumulate_rows)(const float*, const float* const*, size_t, size_t, float*);
  const char* name;
};

const TileOps& tile_ops() {
  static const TileOps ops = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return TileOps{scores_avx2, exp_tile_avx2, accumulate_avx2, key_scores_avx2, accumulate_rows_avx2, "avx2+fma"};
    return TileOps{scores_generic, exp_tile_generic, accumulate_generic, key_scores_generic,
                   accumulate_rows_generic, "generic"};
  }();
  return ops;
}

struct Unit {
  int32_t sequence;
  int32_t first_token;  // among the sequence's new tokens
  int32_t num_tokens;
  int32_t kv_head;
  uint64_t cost;  // query rows x key positions spanned
};

struct Context {
  const float* q;
  float* out;
  std::span<const PagedSequence> sequences;
  const KvVectorReader* keys;
  const KvVectorReader* values;
  size_t head_dim, group, num_q_heads;
  int32_t block_size;
  float scale;
  int32_t window;
};

// Index of the first key new token `index` (a sequence index) attends to.
int32_t first_key(int32_t index, int32_t window) { return window > 0 ? std::max(0, index - window + 1) : 0; }

// Prefetches the K and V vectors of keys [j0, min(j0 + kKeyBlock, end)) of one KV head (holes too: a
// hint costs less than the check).
void prefetch_keys(const Context& c, const PagedSequence& seq, int32_t kv_head, int32_t j0, int32_t end) {
  const int32_t j1 = std::min(end, j0 + static_cast<int32_t>(kKeyBlock));
  for (int32_t j = j0; j < j1; ++j) {
    const int64_t slot =
        static_cast<int64_t>(seq.block_table[static_cast<size_t>(j / c.block_size)]) * c.block_size + j % c.block_size;
    c.keys->prefetch(slot, kv_head);
    c.values->prefetch(slot, kv_head);
  }
}

// One new token (a decode step): the GQA group's query rows against each key
// of a 64-key tile. f32 pools are read in place and other dtypes dequantized
// once per key into a row-major tile, with no K transpose and no V copy (for a
// single token the transpose cost more than the scores it fed). Same online
// softmax and masks as run_unit.
void run_decode_unit(const Context& c, const Unit& u) {
  const TileOps& ops = tile_ops();
  const PagedSequence& seq = c.sequences[static_cast<size_t>(u.sequence)];
  const PagedSequenceEviction& ev = seq.eviction;
  const size_t D = c.head_dim, G = c.group;
  const size_t kv_head = static_cast<size_t>(u.kv_head);

  thread_local std::vector<float> kbuf, vbuf, zeros, acc, row_max, row_sum, s, p;
  thread_local std::vector<const float*> q_rows;
  kbuf.resize(kKeyBlock * D);
  vbuf.resize(kKeyBlock * D);
  zeros.assign(D, 0.0f);
  acc.assign(G * D, 0.0f);
  row_max.assign(G, kNegInf);
  row_sum.assign(G, 0.0f);
  s.resize(G * kKeyBlock);
  p.resize(kKeyBlock);
  q_rows.resize(G);
  const size_t row = static_cast<size_t>(seq.token_offset + u.first_token);
  for (size_t g = 0; g < G; ++g) q_rows[g] = c.q + (row * c.num_q_heads + kv_head * G + g) * D;
  const int32_t index = seq.num_cached_tokens + u.first_token;  // the new token's sequence index
  const float* keys[kKeyBlock];
  const float* values[kKeyBlock];
  // f32 / f16 / bf16 pools (AVX2 + F16C, head dim a multiple of 32): both inner loops read the pool in place,
  // 16-bit elements widened in registers, V read once per two query rows (decode_attention_tile.h); other
  // pools are dequantized per key into kbuf / vbuf below.
  const bool in_place = decode_tile_supported(c.keys->dtype(), c.values->dtype(), D);
  const void* raw_keys[kKeyBlock];
  const void* raw_values[kKeyBlock];
  thread_local std::vector<float> probs;
  if (in_place) probs.resize(G * kKeyBlock);

  for (int32_t j0 = first_key(index, c.window); j0 <= index; j0 += static_cast<int32_t>(kKeyBlock)) {
    if (j0 == first_key(index, c.window)) prefetch_keys(c, seq, u.kv_head, j0, index + 1);
    prefetch_keys(c, seq, u.kv_head, j0 + static_cast<int32_t>(kKeyBlock), index + 1);
    const size_t nk = static_cast<size_t>(std::min<int32_t>(static_cast<int32_t>(kKeyBlock), index + 1 - j0));
    const int32_t lo = std::max(first_key(index, c.window), j0) - j0;
    const int32_t hi = static_cast<int32_t>(nk);  // exclusive
    if (in_place) {
      for (size_t j = 0; j < kKeyBlock; ++j) {
        const int32_t key_index = j0 + static_cast<int32_t>(j);
        if (static_cast<int32_t>(j) < lo || j >= nk || ev.is_hole(key_index, kv_head)) {
          raw_keys[j] = raw_values[j] = nullptr;
          continue;
        }
        const int64_t slot =
            static_cast<int64_t>(seq.block_table[static_cast<size_t>(key_index / c.block_size)]) * c.block_size +
            key_index % c.block_size;
        raw_keys[j] = c.keys->vector_data(slot, u.kv_head);
        raw_values[j] = c.values->vector_data(slot, u.kv_head);
      }
      decode_tile_scores(q_rows.data(), G, raw_keys, c.keys->dtype(), D, c.scale, s.data());
      for (size_t g = 0; g < G; ++g) {
        const float* sg = s.data() + g * kKeyBlock;
        float* pg = probs.data() + g * kKeyBlock;
        float tile_max = kNegInf;
        for (size_t j = 0; j < kKeyBlock; ++j) tile_max = std::max(tile_max, sg[j]);
        if (tile_max == kNegInf) {  // every key here is masked or a hole: this row takes nothing
          std::fill_n(pg, kKeyBlock, 0.0f);
          continue;
        }
        const float new_max = std::max(row_max[g], tile_max);
        const float correction = std::exp(row_max[g] - new_max);  // 0 for the first tile
        const float sum = ops.exp_tile(sg, new_max, pg);
        float* a = acc.data() + g * D;
        if (correction != 1.0f) {
          for (size_t d = 0; d < D; ++d) a[d] *= correction;
        }
        row_sum[g] = row_sum[g] * correction + sum;
        row_max[g] = new_max;
      }
      decode_tile_accumulate(probs.data(), G, raw_values, c.values->dtype(), D, acc.data());
      continue;
    }
    for (size_t j = 0; j < kKeyBlock; ++j) {
      const int32_t key_index = j0 + static_cast<int32_t>(j);
      if (static_cast<int32_t>(j) < lo || j >= nk || ev.is_hole(key_index, kv_head)) {
        values[j] = zeros.data();  // p is 0 there
        for (size_t g = 0; g < G; ++g) s[g * kKeyBlock + j] = kNegInf;
        continue;
      }
      const int64_t slot =
          static_cast<int64_t>(seq.block_table[static_cast<size_t>(key_index / c.block_size)]) * c.block_size +
          key_index % c.block_size;
      keys[j] = c.keys->read(slot, u.kv_head, kbuf.data() + j * D);
      values[j] = c.values->read(slot, u.kv_head, vbuf.data() + j * D);
      ops.key_scores(q_rows.data(), G, keys[j], D, s.data() + j);
      for (size_t g = 0; g < G; ++g) s[g * kKeyBlock + j] *= c.scale;
    }
    for (size_t g = 0; g < G; ++g) {
      const float* sg = s.data() + g * kKeyBlock;
      float tile_max = kNegInf;
      for (size_t j = 0; j < kKeyBlock; ++j) tile_max = std::max(tile_max, sg[j]);
      if (tile_max == kNegInf) continue;  // every key here is masked or a hole
      const float new_max = std::max(row_max[g], tile_max);
      const float correction = std::exp(row_max[g] - new_max);  // 0 for the first tile
      const float sum = ops.exp_tile(sg, new_max, p.data());
      float* a = acc.data() + g * D;
      if (correction != 1.0f) {
        for (size_t d = 0; d < D; ++d) a[d] *= correction;
      }
      row_sum[g] = row_sum[g] * correction + sum;
      row_max[g] = new_max;
      ops.accumulate_rows(p.data() + lo, values + lo, static_cast<size_t>(hi - lo), D, a);
    }
  }
  for (size_t g = 0; g < G; ++g) {
    const float inv = 1.0f / row_sum[g];
    float* o = c.out + (row * c.num_q_heads + kv_head * G + g) * D;
    for (size_t d = 0; d < D; ++d) o[d] = acc[g * D + d] * inv;
  }
}

void run_unit(const Context& c, const Unit& u) {
  if (u.num_tokens == 1) return run_decode_unit(c, u);
  const TileOps& ops = tile_ops();
  const PagedSequence& seq = c.sequences[static_cast<size_t>(u.sequence)];
  const PagedSequenceEviction& ev = seq.eviction;
  const size_t D = c.head_dim, G = c.group, T = static_cast<size_t>(u.num_tokens), R = T * G;
  const size_t kv_head = static_cast<size_t>(u.kv_head);

  thread_local std::vector<float> kt, vt, acc, row_max, row_sum, buffer;
  thread_local std::vector<const float*> q_rows;
  kt.resize(D * kKeyBlock);
  vt.resize(kKeyBlock * D);
  buffer.resize(D);
  acc.assign(R * D, 0.0f);
  row_max.assign(R, kNegInf);
  row_sum.assign(R, 0.0f);
  q_rows.resize(R);
  for (size_t t = 0; t < T; ++t) {
    const size_t row = static_cast<size_t>(seq.token_offset + u.first_token) + t;
    for (size_t g = 0; g < G; ++g) q_rows[t * G + g] = c.q + (row * c.num_q_heads + kv_head * G + g) * D;
  }
  const int32_t first_index = seq.num_cached_tokens + u.first_token;  // sequence index of token 0
  const int32_t last_index = first_index + u.num_tokens - 1;
  bool hole[kKeyBlock];
  alignas(32) float s[kKeyBlock];
  alignas(32) float p[kKeyBlock];

  for (int32_t j0 = first_key(first_index, c.window); j0 <= last_index; j0 += static_cast<int32_t>(kKeyBlock)) {
    if (j0 == first_key(first_index, c.window)) prefetch_keys(c, seq, u.kv_head, j0, last_index + 1);
    prefetch_keys(c, seq, u.kv_head, j0 + static_cast<int32_t>(kKeyBlock), last_index + 1);
    const size_t nk = static_cast<size_t>(std::min<int32_t>(static_cast<int32_t>(kKeyBlock), last_index + 1 - j0));
    // The tile: K transposed ([d][j]) for the score GEMM, V as rows ([j][d]); holes and padding are zeros.
    for (size_t j = 0; j < kKeyBlock; ++j) {
      const int32_t index = j0 + static_cast<int32_t>(j);
      hole[j] = j >= nk || ev.is_hole(index, kv_head);
      if (hole[j]) {
        for (size_t d = 0; d < D; ++d) kt[d * kKeyBlock + j] = 0.0f;
        std::fill_n(vt.data() + j * D, D, 0.0f);
        continue;
      }
      const int64_t slot = static_cast<int64_t>(seq.block_table[static_cast<size_t>(index / c.block_size)]) * c.block_size +
                           index % c.block_size;
      const float* k = c.keys->read(slot, u.kv_head, buffer.data());
      for (size_t d = 0; d < D; ++d) kt[d * kKeyBlock + j] = k[d];
      const float* v = c.values->read(slot, u.kv_head, buffer.data());
      std::copy_n(v, D, vt.data() + j * D);
    }
    for (size_t t = 0; t < T; ++t) {
      const int32_t index = first_index + static_cast<int32_t>(t);
      const int32_t lo = std::max(first_key(index, c.window), j0) - j0;
      const int32_t hi = std::min<int32_t>(index + 1 - j0, static_cast<int32_t>(nk));  // exclusive
      if (hi <= lo) continue;  // no key of this tile is in the token's window
      for (size_t g = 0; g < G; ++g) {
        const size_t r = t * G + g;
        ops.scores(q_rows[r], kt.data(), D, s);
        float tile_max = kNegInf;
        for (int32_t j = 0; j < static_cast<int32_t>(kKeyBlock); ++j) {
          s[j] = j >= lo && j < hi && !hole[j] ? s[j] * c.scale : kNegInf;  // masked: -inf
          tile_max = std::max(tile_max, s[j]);
        }
        if (tile_max == kNegInf) continue;  // every key here is a hole
        const float new_max = std::max(row_max[r], tile_max);
        const float correction = std::exp(row_max[r] - new_max);  // 0 for the first tile
        const float sum = ops.exp_tile(s, new_max, p);
        float* a = acc.data() + r * D;
        if (correction != 1.0f) {
          for (size_t d = 0; d < D; ++d) a[d] *= correction;
        }
        row_sum[r] = row_sum[r] * correction + sum;
        row_max[r] = new_max;
        ops.accumulate(p + lo, vt.data() + static_cast<size_t>(lo) * D, static_cast<size_t>(hi - lo), D, a);
      }
    }
  }
  for (size_t t = 0; t < T; ++t) {
    const size_t row = static_cast<size_t>(seq.token_offset + u.first_token) + t;
    for (size_t g = 0; g < G; ++g) {
      const size_t r = t * G + g;
      const float inv = 1.0f / row_sum[r];
      float* o = c.out + (row * c.num_q_heads + kv_head * G + g) * D;
      for (size_t d = 0; d < D; ++d) o[d] = acc[r * D + d] * inv;
    }
  }
}

}  // namespace

const char* paged_attention_tiled_implementation() { return tile_ops().name; }

void paged_attention_tiled(const float* q, const PagedKvLayer& layer,
                           std::span<const PagedSequence> sequences, const PagedAttentionParams& params,
                           float* out) {
  const size_t head_dim = static_cast<size_t>(layer.head_dim);
  const size_t num_q_heads = static_cast<size_t>(params.num_q_heads);
  const size_t group = num_q_heads / static_cast<size_t>(layer.num_kv_heads);
  const KvVectorReader keys(layer.key, layer.key_scales, layer.key_dtype, layer);
  const KvVectorReader values(layer.value, layer.value_scales, layer.value_dtype, layer);
  const Context c{q, out, sequences, &keys, &values, head_dim, group, num_q_heads, layer.block_size, params.scale,
                  params.sliding_window};

  std::vector<Unit> units;
  uint64_t total_cost = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const PagedSequence& seq = sequences[s];
    for (int32_t t0 = 0; t0 < seq.num_new_tokens; t0 += static_cast<int32_t>(kQueryBlock)) {
      const int32_t n = std::min<int32_t>(static_cast<int32_t>(kQueryBlock), seq.num_new_tokens - t0);
      const int32_t last = seq.num_cached_tokens + t0 + n - 1;
      const uint64_t span = static_cast<uint64_t>(last - first_key(seq.num_cached_tokens + t0, params.sliding_window) + 1);
      const uint64_t cost = static_cast<uint64_t>(n) * group * span;
      for (int32_t h = 0; h < layer.num_kv_heads; ++h) {
        units.push_back({static_cast<int32_t>(s), t0, n, h, cost});
        total_cost += cost;
      }
    }
  }
  if (units.empty()) return;

  // Longest first into the least loaded of `bins` lists, a few per thread, claimed by the threads as they
  // get to them (a late thread leaves its lists to the others); small batches (a short decode) stay on
  // the calling thread.
  constexpr size_t kBinsPerThread = 4;
  size_t bins = std::min(ThreadPool::global().size() * kBinsPerThread, units.size());
  if (total_cost * head_dim * 2 < (uint64_t{1} << 16)) bins = 1;
  std::vector<std::vector<const Unit*>> lists(bins);
  if (bins == 1) {
    for (const Unit& u : units) lists[0].push_back(&u);
  } else {
    std::vector<const Unit*> order;
    order.reserve(units.size());
    for (const Unit& u : units) order.push_back(&u);
    std::stable_sort(order.begin(), order.end(), [](const Unit* a, const Unit* b) { return a->cost > b->cost; });
    std::vector<uint64_t> load(bins, 0);
    for (const Unit* u : order) {
      const size_t b = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      lists[b].push_back(u);
      load[b] += u->cost;
    }
  }
  ThreadPool::global().parallel_for(bins, [&](size_t begin, size_t end) {
    for (size_t b = begin; b < end; ++b)
      for (const Unit* u : lists[b]) run_unit(c, *u);
  }, 1, kBinsPerThread);
}

}  // namespace pagoda::kernels
