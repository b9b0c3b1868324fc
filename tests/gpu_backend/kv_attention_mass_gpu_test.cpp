// Token eviction's attention mass from the tensor-core decode kernel's own
// scores (AttentionDescriptor::scores + kv_attention_mass_from_scores,
// docs/KV_CACHE.md "Mass from the decode kernel") against the separate scoring
// pass (kv_attention_scores) and the CPU attention kernel's scores, on the same
// pool bytes and queries, every KV dtype, block sizes 16 and 1, the Llama-3-8B
// head shape and a small one; a lone query (one position) and lengths that end
// mid-block. The scores buffer starts as NaN, so a position the kernel failed
// to write would show. Then the decode kernel's time with scores off and on at
// the 8B decode shape, next to the light kernel's and the pass's.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "eviction_test_support.h"
#include "gpu_test_support.h"
#include "pagoda/backend/cpu/cpu_kv_eviction.h"
#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"
#include "pagoda/backend/cuda/attention/attention_kernels.h"
#include "pagoda/backend/cuda/attention/attention_plan.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/kv_attention_mass.h"
#include "pagoda/backend/cuda/kv_attention_scores.h"

namespace pagoda::cuda {
namespace {

namespace kc = kernels::cuda;
using testing::to_device;

using testing::kv_element_of;
using testing::time_ms;

// Mass [kv_heads][capacity] and entropy [kv_heads] of each sequence, on the device, zeroed.
struct MassArrays {
  DeviceBuffer mass, entropy;
  std::vector<KvScoreSequence> sequences;
  MassArrays(int32_t n, int32_t kv_heads, int64_t capacity, const std::vector<int64_t>& table_offsets)
      : mass(std::move(DeviceBuffer::allocate(static_cast<size_t>(n) * kv_heads * capacity * sizeof(float))).value()),
        entropy(std::move(DeviceBuffer::allocate(static_cast<size_t>(n) * kv_heads * sizeof(double))).value()) {
    EXPECT_EQ(cudaMemset(mass.data(), 0, static_cast<size_t>(n) * kv_heads * capacity * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(entropy.data(), 0, static_cast<size_t>(n) * kv_heads * sizeof(double)), cudaSuccess);
    for (int32_t i = 0; i < n; ++i) {
      KvScoreSequence s;
      s.mass = mass.as<float>() + static_cast<int64_t>(i) * kv_heads * capacity;
      s.entropy = entropy.as<double>() + static_cast<int64_t>(i) * kv_heads;
      s.capacity = capacity;
      s.table_offset = table_offsets[static_cast<size_t>(i)];
      sequences.push_back(s);
    }
  }
};

// Which decode kernel writes the scores: tensor cores (the default), the CUDA-core loops, or the
// CUDA-core loops skipping per-head holes (two sequences with holes, two without).
enum class Kernel { kTensorCores, kCudaCores, kHoles };
const char* kernel_name(Kernel k) {
  return k == Kernel::kTensorCores ? "tensor cores" : k == Kernel::kCudaCores ? "cuda cores" : "cuda cores + holes";
}

void check_mass(DType dtype, int32_t head_dim, int32_t block_size, int32_t q_heads, int32_t kv_heads,
                Kernel kernel = Kernel::kTensorCores) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " D " << head_dim << " block size " << block_size
                                    << " heads " << q_heads << "/" << kv_heads << " " << kernel_name(kernel));
  const std::vector<int32_t> lengths = {1, 77, 300, 1100};
  const int32_t n = static_cast<int32_t>(lengths.size());
  // Holes: sequence 2 compacted to 200, sequence 3 to 600, each KV head keeping its own count.
  std::vector<int32_t> compacted(lengths.size(), 0);
  std::vector<std::vector<int32_t>> kept(lengths.size(), std::vector<int32_t>(static_cast<size_t>(kv_heads), 0));
  if (kernel == Kernel::kHoles) {
    compacted[2] = 200;
    compacted[3] = 600;
    for (int32_t h = 0; h < kv_heads; ++h) {
      kept[2][static_cast<size_t>(h)] = (h * 37) % 200;
      kept[3][static_cast<size_t>(h)] = h == 0 ? 600 : (h * 131) % 600;
    }
  }
  auto in_hole = [&](int32_t si, int32_t h, int32_t i) {
    return i >= kept[static_cast<size_t>(si)][static_cast<size_t>(h)] && i < compacted[static_cast<size_t>(si)];
  };
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> flat;
  std::vector<int64_t> offsets;
  int32_t next_block = 0;
  for (int32_t len : lengths) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i < (len + block_size - 1) / block_size; ++i) t.push_back(next_block++);
    offsets.push_back(static_cast<int64_t>(flat.size()));
    flat.insert(flat.end(), t.begin(), t.end());
    tables.push_back(t);
  }
  KvPoolShape shape{1, next_block + 1, block_size, kv_heads, head_dim, dtype, dtype};
  auto gpu = CudaKvPool::create(shape);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto cpu = CpuKvPool::create(shape);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  std::mt19937 rng(static_cast<uint32_t>(head_dim * 5 + block_size + static_cast<int>(dtype) * 31 + q_heads));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int32_t si = 0; si < n; ++si) {
    const int32_t T = lengths[static_cast<size_t>(si)];
    testing::write_random_kv((*gpu)->layer(0), testing::slots_of(tables[static_cast<size_t>(si)], T, block_size),
                             kv_heads, head_dim, rng, normal, 1.5f);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The CPU pool gets the GPU pool's bytes (codes and scale records as they are).
  testing::copy_segments_to_host(testing::pool_segments((*gpu)->layer(0), cpu->layer(0), dtype, dtype));
  const size_t q_width = static_cast<size_t>(q_heads) * head_dim;
  std::vector<uint16_t> q(static_cast<size_t>(n) * q_width);
  std::vector<float> q_f32(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = f32_to_bf16(normal(rng));
    q_f32[i] = bf16_to_f32(q[i]);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const DeviceBuffer q_dev = to_device(q), flat_dev = to_device(flat);

  // The decode kernel with scores on (splits of 64 positions: several per sequence, merged).
  kc::AttentionConfig config;
  config.num_q_heads = q_heads;
  config.num_kv_heads = kv_heads;
  config.head_dim = head_dim;
  config.block_size = block_size;
  config.num_blocks = shape.num_blocks;
  config.scale = scale;
  config.key_element = config.value_element = kv_element_of(dtype);
  std::vector<kc::AttentionSequence> gpu_seqs;
  for (int32_t si = 0; si < n; ++si)
    gpu_seqs.push_back({1, lengths[static_cast<size_t>(si)] - 1, tables[static_cast<size_t>(si)]});
  kc::AttentionPlanOptions options;
  options.split_tokens = 64;
  options.decode_cuda_cores = kernel != Kernel::kTensorCores;
  auto plan = kc::PagedAttentionPlan::create(config, gpu_seqs, {}, options);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  std::vector<int32_t> arena(plan->arena().begin(), plan->arena().end());
  const DeviceBuffer arena_dev = to_device(arena);
  auto workspace = DeviceBuffer::allocate(std::max<size_t>(256, plan->workspace_bytes()));
  auto out = DeviceBuffer::allocate(q.size() * sizeof(uint16_t));
  const int64_t stride = 1104;  // >= the longest sequence
  auto scores = DeviceBuffer::allocate(static_cast<size_t>(n) * q_heads * stride * sizeof(float));
  ASSERT_TRUE(workspace.ok() && out.ok() && scores.ok());
  ASSERT_EQ(cudaMemset(scores->data(), 0xff, static_cast<size_t>(n) * q_heads * stride * sizeof(float)), cudaSuccess);
  const DevicePagedKvLayer& dl = (*gpu)->layer(0);
  kc::AttentionDescriptor d =
      plan->descriptor(arena_dev.as<int32_t>(), {dl.key, dl.value, dl.key_scale, dl.value_scale}, workspace->as<float>());
  ASSERT_TRUE(kc::decode_attention_writes_scores(d));
  d.scores = scores->as<float>();
  d.score_stride = stride;
  std::vector<int32_t> hole_begin, hole_end;
  for (int32_t si = 0; si < n; ++si) {
    for (int32_t h = 0; h < kv_heads; ++h) hole_begin.push_back(kept[static_cast<size_t>(si)][static_cast<size_t>(h)]);
    hole_end.push_back(compacted[static_cast<size_t>(si)]);
  }
  const DeviceBuffer hb = to_device(hole_begin), he = to_device(hole_end);
  if (kernel == Kernel::kHoles) {
    d.hole_begin = hb.as<int32_t>();
    d.hole_end = he.as<int32_t>();
  }
  ASSERT_EQ(kc::launch_paged_attention(d, q_dev.data(), out->data(), nullptr), cudaSuccess);

  std::vector<KvScoreItem> items;
  for (int32_t si = 0; si < n; ++si) items.push_back({si, si, lengths[static_cast<size_t>(si)] - 1, 0});
  const DeviceBuffer items_dev = to_device(items);
  const int64_t capacity = stride;
  MassArrays fused(n, kv_heads, capacity, offsets), pass(n, kv_heads, capacity, offsets);
  // The per-head kept counts as the score state holds them ([layers][kv_heads], one layer here).
  std::vector<DeviceBuffer> kept_dev;
  for (int32_t si = 0; si < n; ++si) {
    if (compacted[static_cast<size_t>(si)] == 0) continue;
    kept_dev.push_back(to_device(kept[static_cast<size_t>(si)]));
    for (MassArrays* m : {&fused, &pass}) {
      m->sequences[static_cast<size_t>(si)].head_kept = kept_dev.back().as<int32_t>();
      m->sequences[static_cast<size_t>(si)].compacted_length = compacted[static_cast<size_t>(si)];
    }
  }
  const DeviceBuffer fused_seqs = to_device(fused.sequences), pass_seqs = to_device(pass.sequences);
  ASSERT_EQ(kv_attention_mass_from_scores(scores->as<float>(), stride, q_heads, kv_heads, 0,
                                          items_dev.as<KvScoreItem>(), n, fused_seqs.as<KvScoreSequence>(), nullptr),
            cudaSuccess);
  const int32_t splits = kv_attention_scores_splits(n, kv_heads);
  auto scratch = DeviceBuffer::allocate(kv_attention_scores_scratch_bytes(n, kv_heads, splits));
  ASSERT_TRUE(scratch.ok());
  ASSERT_EQ(kv_attention_scores(q_dev.as<bf16>(), static_cast<int64_t>(q_width), q_heads, scale, dl, 0,
                                flat_dev.as<int32_t>(), items_dev.as<KvScoreItem>(), n,
                                pass_seqs.as<KvScoreSequence>(), splits, scratch->data(), nullptr),
            cudaSuccess);
  const size_t mass_count = static_cast<size_t>(n) * kv_heads * capacity;
  const std::vector<float> got = testing::to_host<float>(fused.mass, mass_count);
  const std::vector<float> by_pass = testing::to_host<float>(pass.mass, mass_count);
  const std::vector<double> got_entropy = testing::to_host<double>(fused.entropy, static_cast<size_t>(n) * kv_heads);
  const std::vector<double> pass_entropy = testing::to_host<double>(pass.entropy, static_cast<size_t>(n) * kv_heads);

  // The CPU attention kernel's scores of the same queries.
  ForwardBatch batch;
  for (int32_t si = 0; si < n; ++si) {
    SequenceSlice slice;
    slice.token_offset = si;
    slice.num_new_tokens = 1;
    slice.num_cached_tokens = lengths[static_cast<size_t>(si)] - 1;
    slice.block_table = tables[static_cast<size_t>(si)];
    slice.kv_state = si + 1;
    slice.score_from_index = 0;
    batch.sequences.push_back(slice);
  }
  CpuKvEviction reference(1, kv_heads);
  const std::vector<CpuSequenceEviction*> states = reference.prepare(batch);
  std::vector<kernels::PagedSequence> cpu_seqs;
  for (int32_t si = 0; si < n; ++si) {
    ASSERT_NE(states[static_cast<size_t>(si)], nullptr);
    if (compacted[static_cast<size_t>(si)] > 0) {
      states[static_cast<size_t>(si)]->head_kept = kept[static_cast<size_t>(si)];
      states[static_cast<size_t>(si)]->compacted_length = compacted[static_cast<size_t>(si)];
    }
    cpu_seqs.push_back({si, 1, lengths[static_cast<size_t>(si)] - 1, tables[static_cast<size_t>(si)],
                        states[static_cast<size_t>(si)]->layer_view(0, 0)});
  }
  std::vector<float> cpu_out(q.size());
  kernels::paged_attention(q_f32.data(), cpu->layer(0), cpu_seqs, {q_heads, scale, 0}, cpu_out.data());

  // bf16 scores are the pass's products summed in another order; the quantized kernels round q
  // (fp8: e4m3 hi + lo, int8 / int4: f16), so their probabilities are the attention's own, a little off.
  const double tolerance = dtype == DType::kBF16 ? 1e-4 : dtype == DType::kFP8E4M3 ? 1e-1 : 2e-2;
  double worst_pass = 0.0, worst_cpu = 0.0, worst_entropy = 0.0;
  int bad = 0;
  for (int32_t si = 0; si < n; ++si) {
    const CpuSequenceEviction& st = *states[static_cast<size_t>(si)];
    for (int32_t h = 0; h < kv_heads; ++h) {
      for (int32_t i = 0; i < lengths[static_cast<size_t>(si)]; ++i) {
        const size_t at = (static_cast<size_t>(si) * kv_heads + h) * capacity + i;
        const double g = got[at], p = by_pass[at];
        const double c = st.mass[static_cast<size_t>(h) * st.capacity + i];
        if (in_hole(si, h, i)) {
          EXPECT_EQ(g, 0.0f) << "sequence " << si << " head " << h << " hole index " << i << " scored";
          continue;
        }
        ASSERT_TRUE(std::isfinite(g)) << "sequence " << si << " head " << h << " index " << i << ": not written";
        const double e_pass = std::abs(g - p) / (std::abs(p) + 1e-6), e_cpu = std::abs(g - c) / (std::abs(c) + 1e-6);
        worst_pass = std::max(worst_pass, e_pass);
        worst_cpu = std::max(worst_cpu, e_cpu);
        bad += e_pass > tolerance || e_cpu > tolerance;
      }
      const size_t eh = static_cast<size_t>(si) * kv_heads + h;
      const double e = std::abs(got_entropy[eh] - pass_entropy[eh]);
      const double ec = std::abs(got_entropy[eh] - st.entropy_sum[static_cast<size_t>(h)]);
      worst_entropy = std::max({worst_entropy, e, ec});
      EXPECT_LE(e, tolerance * (1.0 + std::abs(pass_entropy[eh]))) << "sequence " << si << " head " << h;
      EXPECT_LE(ec, tolerance * (1.0 + std::abs(pass_entropy[eh]))) << "sequence " << si << " head " << h;
    }
  }
  EXPECT_EQ(bad, 0) << "mass entries off; worst relative error vs the pass " << worst_pass << ", vs the CPU "
                    << worst_cpu;
  std::printf("[kernel mass] %s %s D %d bs %d heads %d/%d: worst relative error vs pass %.2e, vs cpu %.2e, entropy %.2e\n",
              kernel_name(kernel), std::string(dtype_name(dtype)).c_str(), head_dim, block_size, q_heads, kv_heads, worst_pass, worst_cpu,
              worst_entropy);
}

TEST(KvAttentionMassGpu, DecodeKernelMassEqualsThePassAndTheCpu) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4})
    for (int32_t block_size : {16, 1}) check_mass(dtype, 128, block_size, 32, 8);
  check_mass(DType::kBF16, 64, 16, 8, 2);
  check_mass(DType::kInt8, 64, 16, 4, 4);
}

TEST(KvAttentionMassGpu, CudaCoreDecodeMassEqualsThePassAndTheCpuHolesIncluded) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (Kernel kernel : {Kernel::kCudaCores, Kernel::kHoles})
    for (DType dtype : {DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4})
      for (int32_t block_size : {16, 1}) check_mass(dtype, 128, block_size, 32, 8, kernel);
  check_mass(DType::kBF16, 64, 16, 8, 2, Kernel::kHoles);
}

TEST(KvAttentionMassGpu, ScoresRefusedWhereTheKernelCannotWriteThem) {
  PAGODA_SKIP_WITHOUT_GPU();
  kc::AttentionDescriptor d;
  d.kernel = kc::AttentionKernel::kPrefill;
  float dummy = 0.0f;
  d.scores = &dummy;
  d.score_stride = 1;
  EXPECT_FALSE(kc::decode_attention_writes_scores(d));
  EXPECT_EQ(kc::launch_paged_attention(d, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  kc::AttentionDescriptor decode;
  decode.kernel = kc::AttentionKernel::kDecode;
  decode.scores = &dummy;
  decode.score_stride = 0;  // no stride: refused
  EXPECT_TRUE(kc::decode_attention_writes_scores(decode));
  EXPECT_EQ(kc::launch_paged_attention(decode, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  EXPECT_EQ(kv_attention_mass_from_scores(nullptr, 16, 32, 8, 0, nullptr, 1, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kv_attention_mass_from_scores(&dummy, 16, 36, 4, 0, nullptr, 1, nullptr, nullptr), cudaErrorInvalidValue);
}

// The decode kernel at the Llama-3-8B decode shape (16 queries x 32,768 positions, 32 / 8 heads,
// head_dim 128) with scores off and on (rounds alternated, the best of each kept), the light
// kernel, and the separate pass it replaces: printed, plus sanity checks (every query's mass sums
// to its group's 4 heads).
TEST(KvAttentionMassGpu, DecodeKernelTimeScoresOffAndOnAtTheLlama8bShape) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t seqs = 16, kv_heads = 8, q_heads = 32, D = 128, bs = 16;
  struct Variant {
    DType dtype;
    bool cuda_cores;
  };
  for (const Variant variant : {Variant{DType::kBF16, false}, Variant{DType::kFP8E4M3, false}, Variant{DType::kBF16, true}}) {
    const DType dtype = variant.dtype;
    for (int32_t context : {2080, 32768}) {
      const int32_t per_seq = context / bs;
      KvPoolShape shape{1, seqs * per_seq, bs, kv_heads, D, dtype, dtype};
      auto pool = CudaKvPool::create(shape);
      ASSERT_TRUE(pool.ok()) << pool.status().to_string();
      const DevicePagedKvLayer layer = (*pool)->layer(0);
      const size_t vectors = static_cast<size_t>(shape.num_blocks) * bs * kv_heads;
      ASSERT_EQ(cudaMemset(layer.key, 0, vectors * kernels::kv_head_bytes(D, dtype)), cudaSuccess);
      ASSERT_EQ(cudaMemset(layer.value, 0, vectors * kernels::kv_head_bytes(D, dtype)), cudaSuccess);
      if (layer.key_scale != nullptr) {
        ASSERT_EQ(cudaMemset(layer.key_scale, 0, vectors * kernels::kv_head_scale_bytes(D, dtype)), cudaSuccess);
        ASSERT_EQ(cudaMemset(layer.value_scale, 0, vectors * kernels::kv_head_scale_bytes(D, dtype)), cudaSuccess);
      }
      std::vector<int32_t> flat(static_cast<size_t>(seqs) * per_seq);
      for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<int32_t>(i);
      std::vector<std::vector<int32_t>> tables;
      std::vector<kc::AttentionSequence> gpu_seqs;
      std::vector<int64_t> offsets;
      for (int32_t i = 0; i < seqs; ++i) {
        tables.emplace_back(flat.begin() + static_cast<ptrdiff_t>(i) * per_seq,
                            flat.begin() + static_cast<ptrdiff_t>(i + 1) * per_seq);
        offsets.push_back(static_cast<int64_t>(i) * per_seq);
      }
      for (int32_t i = 0; i < seqs; ++i) gpu_seqs.push_back({1, context - 1, tables[static_cast<size_t>(i)]});
      const DeviceBuffer flat_dev = to_device(flat);
      std::vector<uint16_t> q(static_cast<size_t>(seqs) * q_heads * D, f32_to_bf16(0.5f));
      const DeviceBuffer q_dev = to_device(q);
      kc::AttentionConfig config;
      config.num_q_heads = q_heads;
      config.num_kv_heads = kv_heads;
      config.head_dim = D;
      config.block_size = bs;
      config.num_blocks = shape.num_blocks;
      config.scale = 0.088f;
      config.key_element = config.value_element = kv_element_of(dtype);
      kc::AttentionPlanOptions options;
      options.decode_cuda_cores = variant.cuda_cores;
      auto plan = kc::PagedAttentionPlan::create(config, gpu_seqs, {}, options);
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      std::vector<int32_t> arena(plan->arena().begin(), plan->arena().end());
      const DeviceBuffer arena_dev = to_device(arena);
      auto workspace = DeviceBuffer::allocate(std::max<size_t>(256, plan->workspace_bytes()));
      auto out = DeviceBuffer::allocate(q.size() * sizeof(uint16_t));
      auto scores = DeviceBuffer::allocate(static_cast<size_t>(seqs) * q_heads * context * sizeof(float));
      ASSERT_TRUE(workspace.ok() && out.ok() && scores.ok());
      kc::AttentionDescriptor off =
          plan->descriptor(arena_dev.as<int32_t>(), {layer.key, layer.value, layer.key_scale, layer.value_scale},
                           workspace->as<float>());
      kc::AttentionDescriptor on = off;
      on.scores = scores->as<float>();
      on.score_stride = context;
      std::vector<KvScoreItem> items;
      for (int32_t i = 0; i < seqs; ++i) items.push_back({i, i, context - 1, 0});
      const DeviceBuffer items_dev = to_device(items);
      MassArrays fused(seqs, kv_heads, context, offsets), pass(seqs, kv_heads, context, offsets);
      const DeviceBuffer fused_seqs = to_device(fused.sequences), pass_seqs = to_device(pass.sequences);
      const int32_t splits = kv_attention_scores_splits(seqs, kv_heads);
      auto scratch = DeviceBuffer::allocate(kv_attention_scores_scratch_bytes(seqs, kv_heads, splits));
      ASSERT_TRUE(scratch.ok());
      const int reps = 20;
      float best_off = 1e30f, best_on = 1e30f;
      for (int round = 0; round < 3; ++round) {
        best_off = std::min(best_off, time_ms([&] { kc::launch_paged_attention(off, q_dev.data(), out->data(), nullptr); }, reps));
        best_on = std::min(best_on, time_ms([&] { kc::launch_paged_attention(on, q_dev.data(), out->data(), nullptr); }, reps));
      }
      const float mass_ms = time_ms(
          [&] {
            kv_attention_mass_from_scores(scores->as<float>(), context, q_heads, kv_heads, 0, items_dev.as<KvScoreItem>(),
                                          seqs, fused_seqs.as<KvScoreSequence>(), nullptr);
          },
          reps);
      const float pass_ms = time_ms(
          [&] {
            kv_attention_scores(q_dev.as<bf16>(), static_cast<int64_t>(q_heads) * D, q_heads, 0.088f, layer, 0,
                                flat_dev.as<int32_t>(), items_dev.as<KvScoreItem>(), seqs,
                                pass_seqs.as<KvScoreSequence>(), splits, scratch->data(), nullptr);
          },
          reps);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      // Uniform attention (zero K): every query's mass, summed over the indices, is its group's 4 heads per run.
      const std::vector<float> got = testing::to_host<float>(fused.mass, static_cast<size_t>(context));
      double total = 0.0;
      for (int32_t i = 0; i < context; ++i) total += got[static_cast<size_t>(i)];
      EXPECT_NEAR(total, 4.0 * (reps + 1), 1e-2 * (reps + 1));
      std::printf("[kernel mass time] %s %s 16 x %d, 8B shape: decode %.4f ms scores off, %.4f ms on (+%.1f%%); light "
                  "kernel %.4f ms; on + light %.4f ms vs off + pass %.4f ms (pass %.4f ms)\n",
                  variant.cuda_cores ? "cuda cores" : "tensor cores", std::string(dtype_name(dtype)).c_str(), context, best_off, best_on,
                  100.0 * (best_on - best_off) / best_off, mass_ms, best_on + mass_ms, best_off + pass_ms, pass_ms);
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda
