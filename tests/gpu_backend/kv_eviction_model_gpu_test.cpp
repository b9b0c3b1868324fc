// Token eviction's mass from the decode kernel (docs/KV_CACHE.md "Mass from the decode kernel") end to
// end in CudaModel, on a random Llama-shaped model whose attention the fast attention takes (head_dim
// 128, 8 query heads over 2 KV heads, 3 layers; the fixture models' head_dim 16 never takes it, so the
// engine and graph tests of kv_eviction_gpu_test.cpp never reached the kernel-mass path).
//
// For bf16 and fp8 KV, eager and CUDA-graph decode, and h2o, snapkv, entropy and pyramidkv, three
// sequences (prompts of 300, 517 and 1,000 tokens, 16-token blocks) run the same steps twice on one
// runner, in disjoint blocks and score states: lane "kernel" with the decode kernel's mass (the
// default), lane "pass" with it off (CudaModel::set_kernel_mass(false): the separate scoring pass).
// Each lane: the prompts (scored by the pass in both: a prefill), 20 greedy decode steps that score,
// a compaction to budget 128 (CudaModelRunner::compact_kv), 20 more decode steps that score (per-head
// policies: with holes, eager, on the CUDA-core decode). Checked:
//  - the path: every scoring decode step of the kernel lane took the decode kernel's mass
//    (kernel_mass_steps) and none ran the pass (scoring_pass_steps), the pass lane the reverse, the
//    prompt step the pass in both; with graphs on, the decode steps replay graphs;
//  - before the compaction, the greedy tokens of the two lanes are identical (the scores do not
//    change the attention's output), and each sequence's mass and entropy sums agree within
//    kv_attention_mass_gpu_test's bounds (relative 1e-4 bf16, 1e-1 fp8; worst errors printed);
//  - the compaction keeps, in every (layer, KV head) of each lane, exactly the tokens that
//    runtime::select_kept_tokens picks on that lane's downloaded mass (h2o, snapkv; the pool's K codes
//    compared), and the two lanes keep the same tokens (bf16: every head; fp8: counted, printed);
//    per-head policies: the same kept counts per head and the same kept tokens (bf16);
//  - where both lanes kept the same tokens everywhere, the 20 greedy tokens after the compaction are
//    identical and the mass after them agrees within the bound.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "eviction_test_support.h"
#include "gpu_test_support.h"
#include "pagoda/backend/cpu/kernels/paged_kv.h"
#include "pagoda/backend/cuda/cuda_kv_scores.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/kv_compression.h"

namespace pagoda::cuda {
namespace {

using P = runtime::KvCompressionPolicy;

constexpr int32_t kLayers = 3, kQHeads = 8, kKvHeads = 2, kHeadDim = 128, kVocab = 512;
constexpr int32_t kBlockSize = 16, kNumBlocks = 1024, kDecodeSteps = 20, kBudget = 128;
constexpr int32_t kSequences = 3;
const int32_t kPromptLengths[kSequences] = {300, 517, 1000};
// Non-accumulating policies score the last prompt tokens and every decode token (their observation window).
constexpr int32_t kObservedPromptTokens = 8;

std::unique_ptr<CudaModelRunner> make_fast_attention_runner(DType kv_dtype) {
  const nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", kVocab}, {"hidden_size", kQHeads * kHeadDim},
      {"intermediate_size", 2048}, {"num_hidden_layers", kLayers}, {"num_attention_heads", kQHeads},
      {"num_key_value_heads", kKvHeads}, {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-5},
      {"rope_theta", 500000.0}, {"torch_dtype", "bfloat16"}};
  auto config = parse_model_config(j, "kernel mass test config");
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  if (!config.ok()) return nullptr;
  EXPECT_EQ(config->head_dim, kHeadDim);
  CudaModelOptions o;
  o.block_size = kBlockSize;
  o.max_num_seqs = 4;  // decode bucket 4: one padding slot
  o.max_num_tokens = 2048;
  o.max_model_len = 2048;
  o.show_progress = false;
  o.kv_key_dtype = o.kv_value_dtype = kv_dtype;
  auto model = CudaModel::create_random(*config, 21, o);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return nullptr;
  CudaRunnerOptions ro;
  ro.num_blocks = kNumBlocks;
  ro.print_report = false;
  auto runner = CudaModelRunner::create(std::move(model).value(), ro);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  return runner.ok() ? std::move(runner).value() : nullptr;
}

struct Counts {
  int64_t kernel_mass = 0, pass = 0, fast = 0, replays = 0;
};
Counts counts_of(const CudaModel& m) {
  return {m.kernel_mass_steps(), m.scoring_pass_steps(), m.fast_attention_steps(), m.graph_replays()};
}
Counts operator-(const Counts& a, const Counts& b) {
  return {a.kernel_mass - b.kernel_mass, a.pass - b.pass, a.fast - b.fast, a.replays - b.replays};
}

// One lane's run of the scenario and what the comparisons read.
struct Lane {
  bool kernel_mass = true;
  int64_t state_base = 0;  // sequence s's kv_state: state_base + s
  std::vector<std::vector<int32_t>> tables, new_tables;  // before / after the compaction
  std::vector<std::vector<int32_t>> tokens_before, tokens_after;  // [step][sequence]
  std::vector<CudaKvScores::HostScores> before, after;  // per sequence, before the compaction / at the end
  std::vector<CudaKvScores::HeadLayout> layouts;        // after the compaction (per-head policies)
  std::vector<int32_t> old_length, new_length;
  std::vector<std::vector<std::byte>> keys;  // per layer: the pool's K codes at the end
  Counts prefill, decode_before, decode_after;
};

void run_lane(CudaModelRunner& runner, bool graphs, const runtime::KvCompressionConfig& config, Lane& lane) {
  CudaModel& model = runner.model();
  model.set_use_cuda_graphs(graphs);
  model.set_kernel_mass(lane.kernel_mass);
  const bool accumulates = runtime::kv_policy_accumulates(config.policy);
  std::vector<int32_t> cached(kSequences, 0), position(kSequences, 0), next;
  std::vector<int32_t> out;

  ForwardBatch prefill;
  for (int32_t s = 0; s < kSequences; ++s) {
    const int32_t len = kPromptLengths[s];
    SequenceSlice slice;
    slice.token_offset = prefill.num_tokens();
    slice.num_new_tokens = len;
    slice.block_table = lane.tables[static_cast<size_t>(s)];
    slice.kv_state = lane.state_base + s;
    slice.kv_state_reset = true;
    slice.score_from_index = accumulates ? 0 : len - kObservedPromptTokens;
    prefill.sequences.push_back(slice);
    for (int32_t i = 0; i < len; ++i) {
      prefill.token_ids.push_back((i * 37 + s * 101 + 7) % kVocab);
      prefill.positions.push_back(i);
    }
    cached[static_cast<size_t>(s)] = position[static_cast<size_t>(s)] = len;
  }
  Counts start = counts_of(model);
  const Status prefilled = model.forward_greedy(prefill, runner.pool(), next);
  ASSERT_TRUE(prefilled.ok()) << prefilled.to_string();
  lane.prefill = counts_of(model) - start;

  // kDecodeSteps greedy steps of every sequence on `tables`, each query scoring (score_from[s] <= its index).
  auto decode = [&](const std::vector<std::vector<int32_t>>& tables, const std::vector<int32_t>& score_from,
                    std::vector<std::vector<int32_t>>& tokens) {
    for (int32_t step = 0; step < kDecodeSteps; ++step) {
      ForwardBatch b;
      for (int32_t s = 0; s < kSequences; ++s) {
        const size_t i = static_cast<size_t>(s);
        SequenceSlice slice;
        slice.token_offset = s;
        slice.num_new_tokens = 1;
        slice.num_cached_tokens = cached[i];
        slice.block_table = tables[i];
        slice.kv_state = lane.state_base + s;
        slice.score_from_index = score_from[i];
        b.sequences.push_back(slice);
        b.token_ids.push_back(next[i]);
        b.positions.push_back(position[i]);
      }
      const Status st = model.forward_greedy(b, runner.pool(), out);
      ASSERT_TRUE(st.ok()) << "decode step " << step << ": " << st.to_string();
      tokens.push_back(out);
      next = out;
      for (int32_t s = 0; s < kSequences; ++s) {
        ++cached[static_cast<size_t>(s)];
        ++position[static_cast<size_t>(s)];
      }
    }
  };
  auto download_all = [&](std::vector<CudaKvScores::HostScores>& into) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int32_t s = 0; s < kSequences; ++s) {
      auto got = runner.kv_scores().download(lane.state_base + s, cached[static_cast<size_t>(s)], nullptr);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      into.push_back(std::move(got).value());
    }
  };

  std::vector<int32_t> score_from(kSequences);
  for (int32_t s = 0; s < kSequences; ++s)
    score_from[static_cast<size_t>(s)] = accumulates ? 0 : kPromptLengths[s] - kObservedPromptTokens;
  start = counts_of(model);
  decode(lane.tables, score_from, lane.tokens_before);
  if (::testing::Test::HasFatalFailure()) return;
  lane.decode_before = counts_of(model) - start;
  download_all(lane.before);
  if (::testing::Test::HasFatalFailure()) return;

  const int32_t capacity = runtime::kv_compaction_capacity(config, kLayers);
  for (int32_t s = 0; s < kSequences; ++s) {
    const size_t i = static_cast<size_t>(s);
    runtime::KvCompaction job;
    job.kv_state = lane.state_base + s;
    job.config = config;
    job.old_block_table = lane.tables[i];
    job.old_length = cached[i];
    job.new_block_table = lane.new_tables[i];
    job.new_length = std::min(cached[i], capacity);
    const Status compacted = runner.compact_kv(job);
    ASSERT_TRUE(compacted.ok()) << compacted.to_string();
    lane.old_length.push_back(job.old_length);
    lane.new_length.push_back(job.new_length);
    cached[i] = job.new_length;
    score_from[i] = accumulates ? 0 : job.new_length;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t s = 0; s < kSequences; ++s) lane.layouts.push_back(runner.kv_scores().head_layout(lane.state_base + s));
  start = counts_of(model);
  decode(lane.new_tables, score_from, lane.tokens_after);
  if (::testing::Test::HasFatalFailure()) return;
  lane.decode_after = counts_of(model) - start;
  download_all(lane.after);
  if (::testing::Test::HasFatalFailure()) return;

  // The K codes of every layer (the old blocks are intact: a compaction only writes the new ones, and the
  // decode steps after it write past the kept region).
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const KvPoolShape& shape = runner.pool().shape();
  const size_t key_bytes = static_cast<size_t>(shape.num_blocks) * shape.block_size * shape.num_kv_heads *
                           kernels::kv_head_bytes(shape.head_dim, shape.key_dtype);
  for (int32_t l = 0; l < kLayers; ++l) {
    std::vector<std::byte> k(key_bytes);
    ASSERT_EQ(cudaMemcpy(k.data(), runner.pool().layer(l).key, key_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    lane.keys.push_back(std::move(k));
  }
  for (int32_t s = 0; s < kSequences; ++s) runner.kv_scores().release(lane.state_base + s);
}

// Cache index `index` of a sequence's `table`, KV head `head`: its K codes in a layer's host copy.
const std::byte* key_at(const std::vector<std::byte>& keys, const std::vector<int32_t>& table, int32_t index,
                        int32_t head, size_t head_bytes) {
  const int64_t slot =
      static_cast<int64_t>(table[static_cast<size_t>(index / kBlockSize)]) * kBlockSize + index % kBlockSize;
  return keys.data() + (static_cast<size_t>(slot) * kKvHeads + static_cast<size_t>(head)) * head_bytes;
}

// Kernel-lane scores against the pass lane's: the worst |kernel - pass| / (|pass| + 1e-6) over the mass,
// and entries over `tolerance`; entropy sums and counts likewise (kv_attention_mass_gpu_test's metric).
struct ScoreDiff {
  double worst_mass = 0.0, worst_entropy = 0.0, total_mass = 0.0;
  int64_t bad = 0;
};
ScoreDiff compare_scores(const std::vector<CudaKvScores::HostScores>& kernel,
                         const std::vector<CudaKvScores::HostScores>& pass, double tolerance) {
  ScoreDiff d;
  EXPECT_EQ(kernel.size(), pass.size());
  for (size_t s = 0; s < std::min(kernel.size(), pass.size()); ++s) {
    const CudaKvScores::HostScores& g = kernel[s];
    const CudaKvScores::HostScores& p = pass[s];
    EXPECT_EQ(g.mass.size(), p.mass.size()) << "sequence " << s;
    EXPECT_EQ(g.entropy_count, p.entropy_count) << "sequence " << s;
    for (size_t i = 0; i < std::min(g.mass.size(), p.mass.size()); ++i) {
      const double e = std::abs(static_cast<double>(g.mass[i]) - p.mass[i]) / (std::abs(p.mass[i]) + 1e-6);
      d.worst_mass = std::isnan(e) ? 1e30 : std::max(d.worst_mass, e);
      d.bad += !(e <= tolerance);
      d.total_mass += g.mass[i];
    }
    for (size_t h = 0; h < std::min(g.entropy_sum.size(), p.entropy_sum.size()); ++h) {
      const double e = std::abs(g.entropy_sum[h] - p.entropy_sum[h]);
      d.worst_entropy = std::max(d.worst_entropy, e / (1.0 + std::abs(p.entropy_sum[h])));
      d.bad += !(e <= tolerance * (1.0 + std::abs(p.entropy_sum[h])));
    }
  }
  return d;
}

// h2o / snapkv: each (sequence, layer, KV head)'s kept indices by runtime::select_kept_tokens on the lane's
// downloaded mass before the compaction, [sequence][layer * kv_heads + head].
std::vector<std::vector<std::vector<int32_t>>> host_selection(const Lane& lane,
                                                              const runtime::KvCompressionConfig& config) {
  std::vector<std::vector<std::vector<int32_t>>> kept(kSequences);
  for (int32_t s = 0; s < kSequences; ++s) {
    const size_t i = static_cast<size_t>(s);
    const int32_t n = lane.old_length[i];
    for (int32_t lh = 0; lh < kLayers * kKvHeads; ++lh)
      kept[i].push_back(runtime::select_kept_tokens(
          config, lane.new_length[i], n,
          std::span<const float>(lane.before[i].mass.data() + static_cast<size_t>(lh) * n, static_cast<size_t>(n))));
  }
  return kept;
}

// Tokens kept at the front of the compacted region by (sequence, layer, KV head): the new length, or the
// head's own count under a per-head policy.
int32_t kept_count(const Lane& lane, int32_t s, int32_t lh) {
  const CudaKvScores::HeadLayout& layout = lane.layouts[static_cast<size_t>(s)];
  return layout.head_kept.empty() ? lane.new_length[static_cast<size_t>(s)]
                                  : layout.head_kept[static_cast<size_t>(lh)];
}

void check_scenario(CudaModelRunner& runner, DType dtype, bool graphs, P policy, int64_t state_base,
                    std::mt19937& rng) {
  const std::string policy_name(runtime::kv_compression_policy_name(policy));
  const std::string what = std::string(dtype_name(dtype)) + (graphs ? " graphs " : " eager ") + policy_name;
  SCOPED_TRACE(what);
  runtime::KvCompressionConfig config;
  config.policy = policy;
  config.budget = kBudget;
  config.sink_tokens = 4;
  config.window = 16;
  ASSERT_TRUE(runtime::validate_kv_compression(config, "--kv-").ok());
  const bool per_head = policy == P::kEntropy || policy == P::kPyramidKV;
  const int32_t capacity = runtime::kv_compaction_capacity(config, kLayers);

  // Disjoint blocks for the two lanes, scattered over the pool.
  std::vector<int32_t> blocks(kNumBlocks);
  for (int32_t i = 0; i < kNumBlocks; ++i) blocks[static_cast<size_t>(i)] = i;
  std::shuffle(blocks.begin(), blocks.end(), rng);
  size_t next_block = 0;
  auto take = [&](int32_t tokens) {
    const int32_t n = (tokens + kBlockSize - 1) / kBlockSize;
    std::vector<int32_t> t(blocks.begin() + static_cast<ptrdiff_t>(next_block),
                           blocks.begin() + static_cast<ptrdiff_t>(next_block + n));
    next_block += static_cast<size_t>(n);
    return t;
  };
  Lane kernel, pass;
  kernel.kernel_mass = true;
  kernel.state_base = state_base;
  pass.kernel_mass = false;
  pass.state_base = state_base + 100;
  for (Lane* lane : {&kernel, &pass})
    for (int32_t s = 0; s < kSequences; ++s) {
      lane->tables.push_back(take(kPromptLengths[s] + kDecodeSteps));
      lane->new_tables.push_back(take(std::min(kPromptLengths[s] + kDecodeSteps, capacity) + kDecodeSteps));
    }
  ASSERT_LE(next_block, blocks.size());

  run_lane(runner, graphs, config, kernel);
  if (::testing::Test::HasFatalFailure()) return;
  run_lane(runner, graphs, config, pass);
  runner.model().set_kernel_mass(true);
  if (::testing::Test::HasFatalFailure()) return;

  // The path: every scoring decode step of the kernel lane on the decode kernel's mass, none on the pass;
  // the pass lane the reverse; the prompts on the pass in both.
  for (const Lane* lane : {&kernel, &pass}) {
    SCOPED_TRACE(lane->kernel_mass ? "kernel lane" : "pass lane");
    EXPECT_EQ(lane->prefill.pass, 1) << "the prompt step did not score on the pass";
    EXPECT_EQ(lane->prefill.kernel_mass, 0);
    for (const Counts* c : {&lane->decode_before, &lane->decode_after}) {
      EXPECT_EQ(c->fast, kDecodeSteps) << "decode steps off the fast attention";
      EXPECT_EQ(c->kernel_mass, lane->kernel_mass ? kDecodeSteps : 0);
      EXPECT_EQ(c->pass, lane->kernel_mass ? 0 : kDecodeSteps);
    }
    // Decode graphs: every step after its bucket's first replays (the first of a lane may record);
    // per-head holes run eagerly.
    EXPECT_GE(lane->decode_before.replays, graphs ? kDecodeSteps - 1 : 0);
    EXPECT_LE(lane->decode_before.replays, graphs ? kDecodeSteps : 0);
    if (!graphs || per_head) {
      EXPECT_EQ(lane->decode_after.replays, 0);
    } else {
      EXPECT_GE(lane->decode_after.replays, kDecodeSteps - 1);
    }
  }

  // Before the compaction: the same tokens (the scores leave the attention's output alone) and the mass
  // and entropy within the kernel test's bounds.
  EXPECT_EQ(kernel.tokens_before, pass.tokens_before) << "the kernel-mass lane decoded other tokens";
  const double tolerance = dtype == DType::kBF16 ? 1e-4 : 1e-1;
  const ScoreDiff before = compare_scores(kernel.before, pass.before, tolerance);
  EXPECT_EQ(before.bad, 0) << "mass / entropy off the pass's: worst relative mass error " << before.worst_mass
                           << ", entropy " << before.worst_entropy;
  EXPECT_GT(before.total_mass, 0.0) << "no mass";

  // The compaction's kept tokens: per lane against the host rule on its own mass (h2o, snapkv), and across lanes.
  const size_t head_bytes = kernels::kv_head_bytes(kHeadDim, dtype);
  int heads_off_host_rule = 0, host_rule_differs = 0, kept_differ = 0, layouts_differ = 0;
  int64_t kept_common = 0, kept_total = 0;
  if (!per_head) {
    for (const Lane* lane : {&kernel, &pass}) {
      const auto selection = host_selection(*lane, config);
      for (int32_t s = 0; s < kSequences; ++s)
        for (int32_t lh = 0; lh < kLayers * kKvHeads; ++lh) {
          const std::vector<int32_t>& sel = selection[static_cast<size_t>(s)][static_cast<size_t>(lh)];
          const int32_t count = lane->new_length[static_cast<size_t>(s)];
          bool same = static_cast<int32_t>(sel.size()) == count;
          for (int32_t j = 0; same && j < count; ++j)
            same = std::memcmp(key_at(lane->keys[static_cast<size_t>(lh / kKvHeads)],
                                      lane->new_tables[static_cast<size_t>(s)], j, lh % kKvHeads, head_bytes),
                               key_at(lane->keys[static_cast<size_t>(lh / kKvHeads)],
                                      lane->tables[static_cast<size_t>(s)], sel[static_cast<size_t>(j)],
                                      lh % kKvHeads, head_bytes),
                               head_bytes) == 0;
          heads_off_host_rule += !same;
        }
    }
    const auto kernel_sel = host_selection(kernel, config), pass_sel = host_selection(pass, config);
    for (int32_t s = 0; s < kSequences; ++s)
      for (int32_t lh = 0; lh < kLayers * kKvHeads; ++lh)
        host_rule_differs +=
            kernel_sel[static_cast<size_t>(s)][static_cast<size_t>(lh)] != pass_sel[static_cast<size_t>(s)][static_cast<size_t>(lh)];
    EXPECT_EQ(heads_off_host_rule, 0) << "a compaction kept other tokens than select_kept_tokens on its lane's mass";
  }
  for (int32_t s = 0; s < kSequences; ++s) {
    const size_t i = static_cast<size_t>(s);
    EXPECT_EQ(kernel.new_length[i], pass.new_length[i]);
    layouts_differ += kernel.layouts[i].head_kept != pass.layouts[i].head_kept ||
                      kernel.layouts[i].compacted_length != pass.layouts[i].compacted_length;
    EXPECT_EQ(kernel.layouts[i].head_kept.empty(), !per_head) << "per-head layout";
    for (int32_t lh = 0; lh < kLayers * kKvHeads; ++lh) {
      const int32_t l = lh / kKvHeads, h = lh % kKvHeads;
      const int32_t count = kept_count(kernel, s, lh), pass_count = kept_count(pass, s, lh);
      bool same = count == pass_count;
      for (int32_t j = 0; same && j < count; ++j)
        same = std::memcmp(key_at(kernel.keys[static_cast<size_t>(l)], kernel.new_tables[i], j, h, head_bytes),
                           key_at(pass.keys[static_cast<size_t>(l)], pass.new_tables[i], j, h, head_bytes),
                           head_bytes) == 0;
      kept_differ += !same;
      // The overlap: tokens (their K codes, one vector per token) kept by both lanes.
      std::set<std::string> pass_kept;
      for (int32_t j = 0; j < pass_count; ++j)
        pass_kept.emplace(reinterpret_cast<const char*>(key_at(pass.keys[static_cast<size_t>(l)], pass.new_tables[i], j,
                                                               h, head_bytes)),
                          head_bytes);
      for (int32_t j = 0; j < count; ++j)
        kept_common += pass_kept.count(std::string(
            reinterpret_cast<const char*>(key_at(kernel.keys[static_cast<size_t>(l)], kernel.new_tables[i], j, h,
                                                 head_bytes)),
            head_bytes));
      kept_total += std::max(count, pass_count);
    }
  }
  const int heads = kSequences * kLayers * kKvHeads;
  const double overlap = kept_total > 0 ? static_cast<double>(kept_common) / static_cast<double>(kept_total) : 0.0;
  // pyramidkv's per-head budgets follow the layer alone: the same counts whatever the scores.
  if (policy == P::kPyramidKV) {
    EXPECT_EQ(layouts_differ, 0) << "pyramidkv's per-head kept counts differ";
  }
  if (dtype == DType::kBF16) {
    // bf16: the kernel's scores are the pass's products summed in another order (about 1e-6 relative, H200),
    // far below h2o's gaps (the prompt's identical mass dominates); the pooled window scores of the others
    // are closer together, so a near tie may swap a token there: every head but at most two the same, and
    // 99% of the kept tokens.
    if (policy == P::kH2O) {
      EXPECT_EQ(kept_differ, 0) << "the lanes kept other tokens in " << kept_differ << " of " << heads << " heads";
    } else {
      EXPECT_LE(kept_differ, 2) << "the lanes kept other tokens in " << kept_differ << " of " << heads << " heads";
    }
    EXPECT_GE(overlap, 0.99);
    if (policy == P::kEntropy) {
      EXPECT_EQ(layouts_differ, 0) << "entropy's per-head kept counts differ";
    }
  } else {
    // fp8: the tensor-core kernel rounds q (e4m3 hi + lo; about 4e-3 relative on the H200), so near the cut
    // the ranking may reshuffle: only the share of kept tokens in common is bounded, loosely (a mass that
    // were wrong beyond that rounding would pick the score-chosen tokens about at random).
    EXPECT_GE(overlap, 0.75);
  }

  // After the compaction: where the lanes kept the same tokens everywhere, the same tokens again and the
  // mass within the bound.
  size_t equal_after = 0;
  while (equal_after < kernel.tokens_after.size() && equal_after < pass.tokens_after.size() &&
         kernel.tokens_after[equal_after] == pass.tokens_after[equal_after])
    ++equal_after;
  ScoreDiff after;
  if (kept_differ == 0 && layouts_differ == 0) {
    EXPECT_EQ(kernel.tokens_after, pass.tokens_after) << "same kept tokens, other decoded tokens";
    after = compare_scores(kernel.after, pass.after, tolerance);
    EXPECT_EQ(after.bad, 0) << "mass / entropy after the compaction off the pass's: worst " << after.worst_mass;
  }
  std::printf("[kernel mass e2e] %s KV, %s, %s: decode steps on the kernel mass %lld + %lld of %d + %d (pass lane "
              "%lld + %lld on the pass), replays %lld + %lld; before the compaction worst mass error %.2e, "
              "entropy %.2e; kept tokens differ in %d of %d heads (host rule on the two masses differs in %d), %.4f of the "
              "kept tokens common, "
              "per-head counts differ in %d of %d sequences; steps after: %zu of %d equal%s\n",
              std::string(dtype_name(dtype)).c_str(), graphs ? "graphs" : "eager", policy_name.c_str(),
              static_cast<long long>(kernel.decode_before.kernel_mass),
              static_cast<long long>(kernel.decode_after.kernel_mass), kDecodeSteps, kDecodeSteps,
              static_cast<long long>(pass.decode_before.pass), static_cast<long long>(pass.decode_after.pass),
              static_cast<long long>(kernel.decode_before.replays), static_cast<long long>(kernel.decode_after.replays),
              before.worst_mass, before.worst_entropy, kept_differ, heads, host_rule_differs, overlap, layouts_differ,
              kSequences, equal_after, kDecodeSteps,
              kept_differ == 0 && layouts_differ == 0
                  ? (std::string(", worst mass error after ") + std::to_string(after.worst_mass)).c_str()
                  : "");
}

TEST(KvEvictionModelGpu, KernelMassPathTakenAndAgreesWithThePass) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  std::mt19937 rng(5);
  int64_t state_base = 1;
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
    auto runner = make_fast_attention_runner(dtype);
    ASSERT_NE(runner, nullptr);
    for (bool graphs : {false, true})
      for (P policy : {P::kH2O, P::kSnapKV, P::kEntropy, P::kPyramidKV}) {
        check_scenario(*runner, dtype, graphs, policy, state_base, rng);
        state_base += 1000;
        EXPECT_EQ(runner->kv_scores().num_states(), 0u) << "score states left";
      }
  }
}

}  // namespace
}  // namespace pagoda::cuda
