// model/tensor_shard.h: which heads, features and vocabulary rows each rank
// holds, the errors that name --tensor-parallel-size and the numbers, and
// weights sliced as views (column-parallel, vocab) or one copy of the rank's
// columns (row-parallel).

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include <nlohmann/json.hpp>

#include "pagoda/model/tensor_shard.h"

namespace pagoda {
namespace {

ModelConfig llama(int32_t heads, int32_t kv_heads, int32_t intermediate, int32_t vocab) {
  const nlohmann::json json = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                               {"vocab_size", vocab}, {"hidden_size", heads * 4}, {"intermediate_size", intermediate},
                               {"num_hidden_layers", 1}, {"num_attention_heads", heads},
                               {"num_key_value_heads", kv_heads}, {"max_position_embeddings", 64},
                               {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}};
  auto c = parse_model_config(json, "test");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

std::string error_of(const ModelConfig& c, int32_t n) {
  const Status s = check_tensor_parallel(c, n);
  return s.ok() ? "" : s.message();
}

TEST(TensorShardTest, ErrorsNameTheFlagAndTheNumbers) {
  EXPECT_EQ(error_of(llama(8, 2, 64, 100), 1), "");
  EXPECT_EQ(error_of(llama(8, 2, 64, 100), 2), "");
  EXPECT_EQ(error_of(llama(8, 2, 64, 100), 4), "");  // KV heads replicated
  EXPECT_EQ(error_of(llama(8, 2, 64, 100), 8), "");
  EXPECT_NE(error_of(llama(8, 2, 64, 100), 0).find("--tensor-parallel-size 0: must be at least 1"), std::string::npos);
  EXPECT_NE(error_of(llama(8, 2, 64, 100), 3).find("--tensor-parallel-size 3 does not divide the 8 attention heads"),
            std::string::npos);
  EXPECT_NE(error_of(llama(12, 6, 48, 100), 4).find("--tensor-parallel-size 4 does not divide the 6 KV heads"),
            std::string::npos);
  EXPECT_NE(error_of(llama(12, 4, 48, 100), 6).find("with 4 KV heads"), std::string::npos);
  EXPECT_NE(error_of(llama(8, 8, 60, 100), 8).find("intermediate size 60"), std::string::npos);
}

TEST(TensorShardTest, RanksSplitHeadsAndReplicateScarceKvHeads) {
  const ModelConfig c = llama(8, 2, 64, 10);
  // KV heads split: 2 over 2 ranks.
  for (int32_t r = 0; r < 2; ++r) {
    const TensorShard s = tensor_shard(c, r, 2);
    EXPECT_EQ(s.num_q_heads, 4);
    EXPECT_EQ(s.q_head_begin, 4 * r);
    EXPECT_EQ(s.num_kv_heads, 1);
    EXPECT_EQ(s.kv_head_begin, r);
    EXPECT_EQ(s.intermediate_begin, 32 * r);
  }
  // Replicated: 2 KV heads over 4 ranks; query heads 0-1 and 2-3 use KV head 0, 4-5 and 6-7 KV head 1.
  const int32_t want_kv[] = {0, 0, 1, 1};
  for (int32_t r = 0; r < 4; ++r) {
    const TensorShard s = tensor_shard(c, r, 4);
    EXPECT_EQ(s.num_kv_heads, 1);
    EXPECT_EQ(s.kv_head_begin, want_kv[r]);
    EXPECT_EQ(s.q_head_begin / (c.num_q_heads / c.num_kv_heads), s.kv_head_begin) << r;
  }
  // Vocabulary 10 over 4 ranks: chunks of 3, the last rank holds 1 row.
  const int32_t begins[] = {0, 3, 6, 9}, ends[] = {3, 6, 9, 10};
  for (int32_t r = 0; r < 4; ++r) {
    const TensorShard s = tensor_shard(c, r, 4);
    EXPECT_EQ(s.vocab_chunk, 3);
    EXPECT_EQ(s.vocab_begin, begins[r]);
    EXPECT_EQ(s.vocab_end, ends[r]);
  }
  const ModelConfig local = shard_config(c, tensor_shard(c, 1, 4));
  EXPECT_EQ(local.num_q_heads, 2);
  EXPECT_EQ(local.num_kv_heads, 1);
  EXPECT_EQ(local.intermediate_size, 16);
  EXPECT_EQ(local.vocab_size, 10);
}

TEST(TensorShardTest, SlicesAreViewsOrOneCopyOfTheRanksColumns) {
  const ModelConfig c = llama(4, 2, 8, 6);  // hidden 16, head_dim 4
  const size_t H = 16, D = 4, I = 8, V = 6;
  std::vector<std::vector<float>> storage;
  auto matrix = [&](size_t rows, size_t cols) {
    storage.emplace_back(rows * cols);
    std::iota(storage.back().begin(), storage.back().end(), static_cast<float>(storage.size() * 1000));
    return WeightMatrix{DType::kF32, storage.back().data(), rows, cols};
  };
  storage.reserve(16);
  auto whole = std::make_shared<ModelWeights>();
  whole->embed_tokens = matrix(V, H);
  whole->lm_head = matrix(V, H);
  whole->final_norm.assign(H, 1.0f);
  whole->layers.resize(1);
  LayerWeights& l = whole->layers[0];
  l.q_proj = matrix(4 * D, H);
  l.k_proj = matrix(2 * D, H);
  l.v_proj = matrix(2 * D, H);
  l.o_proj = matrix(H, 4 * D);
  l.gate_proj = matrix(I, H);
  l.up_proj = matrix(I, H);
  l.down_proj = matrix(H, I);
  l.o_bias.assign(H, 0.5f);

  const TensorShard s = tensor_shard(c, 1, 2);
  auto shard = shard_model_weights(c, whole, s);
  ASSERT_TRUE(shard.ok()) << shard.status().to_string();
  const LayerWeights& b = shard->layers[0];
  // Column-parallel and vocab slices point into the whole matrices.
  EXPECT_EQ(b.q_proj.data, static_cast<const float*>(l.q_proj.data) + 2 * D * H);
  EXPECT_EQ(b.q_proj.rows, 2 * D);
  EXPECT_EQ(b.k_proj.data, static_cast<const float*>(l.k_proj.data) + D * H);
  EXPECT_EQ(b.gate_proj.data, static_cast<const float*>(l.gate_proj.data) + 4 * H);
  EXPECT_EQ(shard->embed_tokens.data, static_cast<const float*>(whole->embed_tokens.data) + 3 * H);
  EXPECT_EQ(shard->lm_head.rows, 3u);
  // Row-parallel slices are copies of the rank's columns.
  ASSERT_EQ(b.o_proj.cols, 2 * D);
  ASSERT_EQ(b.o_proj.rows, H);
  for (size_t r = 0; r < H; ++r)
    for (size_t k = 0; k < 2 * D; ++k)
      EXPECT_EQ(static_cast<const float*>(b.o_proj.data)[r * 2 * D + k],
                static_cast<const float*>(l.o_proj.data)[r * 4 * D + 2 * D + k]);
  EXPECT_EQ(static_cast<const float*>(b.down_proj.data)[1 * 4 + 0], static_cast<const float*>(l.down_proj.data)[1 * I + 4]);
  // o_proj's bias counts once in the all-reduce: rank 0 keeps it.
  EXPECT_TRUE(b.o_bias.empty());
  auto rank0 = shard_model_weights(c, whole, tensor_shard(c, 0, 2));
  ASSERT_TRUE(rank0.ok());
  EXPECT_EQ(rank0->layers[0].o_bias.size(), H);
  EXPECT_EQ(shard->whole, whole);

  // A matrix of another shape is an error naming it.
  l.down_proj.cols = I + 1;
  auto bad = shard_model_weights(c, whole, s);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("mlp.down_proj.weight"), std::string::npos) << bad.status().to_string();
}

// An fp8 checkpoint's scales are sliced with their matrices: per-channel scales follow the rows of a
// column-parallel slice and stay whole for a row-parallel one, per-tensor scales are shared, block scales are cut
// at the rank's blocks; blocks that a rank's range would cut are an error naming the tensor and the shapes.
TEST(TensorShardTest, Fp8ScalesFollowTheirMatrices) {
  const ModelConfig c = llama(4, 2, 8, 6);  // hidden 16, head_dim 4
  const size_t H = 16, D = 4, I = 8, V = 6;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<float>> floats;
  bytes.reserve(16);
  floats.reserve(32);
  auto f32 = [&](size_t rows, size_t cols) {
    floats.emplace_back(rows * cols, 1.0f);
    return WeightMatrix{DType::kF32, floats.back().data(), rows, cols};
  };
  auto scales = [&](size_t n) {
    floats.emplace_back(n);
    std::iota(floats.back().begin(), floats.back().end(), 1.0f);
    return floats.back().data();
  };
  // fp8 [rows, cols] with a byte per weight = its column index, and the given scale layout.
  auto fp8 = [&](size_t rows, size_t cols, Fp8WeightScale layout, int32_t block) {
    bytes.emplace_back(rows * cols);
    for (size_t i = 0; i < rows * cols; ++i) bytes.back()[i] = static_cast<uint8_t>(i % cols);
    WeightMatrix m{DType::kFP8E4M3, bytes.back().data(), rows, cols};
    m.fp8.layout = layout;
    m.fp8.block_rows = m.fp8.block_cols = block;
    const size_t n = layout == Fp8WeightScale::kTensor    ? 1
                     : layout == Fp8WeightScale::kChannel ? rows
                                                          : ((rows + block - 1) / block) * ((cols + block - 1) / block);
    m.fp8.scales = scales(n);
    return m;
  };
  auto model = [&](Fp8WeightScale layout, int32_t block) {
    auto whole = std::make_shared<ModelWeights>();
    whole->embed_tokens = f32(V, H);
    whole->lm_head = f32(V, H);
    whole->final_norm.assign(H, 1.0f);
    whole->fp8 = Fp8QuantConfig{};
    whole->layers.resize(1);
    LayerWeights& l = whole->layers[0];
    l.q_proj = fp8(4 * D, H, layout, block);
    l.k_proj = fp8(2 * D, H, layout, block);
    l.v_proj = fp8(2 * D, H, layout, block);
    l.o_proj = fp8(H, 4 * D, layout, block);
    l.gate_proj = fp8(I, H, layout, block);
    l.up_proj = fp8(I, H, layout, block);
    l.down_proj = fp8(H, I, layout, block);
    return whole;
  };
  const TensorShard s = tensor_shard(c, 1, 2);  // q rows [8, 16), kv rows [4, 8), features [4, 8)

  auto channel = model(Fp8WeightScale::kChannel, 0);
  auto sharded = shard_model_weights(c, channel, s);
  ASSERT_TRUE(sharded.ok()) << sharded.status().to_string();
  ASSERT_TRUE(sharded->fp8.has_value());
  const LayerWeights& a = channel->layers[0];
  EXPECT_EQ(sharded->layers[0].q_proj.fp8.scales, a.q_proj.fp8.scales + 2 * D);
  EXPECT_EQ(sharded->layers[0].k_proj.fp8.scales, a.k_proj.fp8.scales + D);
  EXPECT_EQ(sharded->layers[0].gate_proj.fp8.scales, a.gate_proj.fp8.scales + 4);
  EXPECT_EQ(sharded->layers[0].o_proj.fp8.scales, a.o_proj.fp8.scales);  // every row kept
  EXPECT_EQ(sharded->layers[0].o_proj.dtype, DType::kFP8E4M3);
  EXPECT_EQ(static_cast<const uint8_t*>(sharded->layers[0].o_proj.data)[0], 2 * D);  // the rank's first column

  auto tensor = model(Fp8WeightScale::kTensor, 0);
  sharded = shard_model_weights(c, tensor, s);
  ASSERT_TRUE(sharded.ok()) << sharded.status().to_string();
  EXPECT_EQ(sharded->layers[0].q_proj.fp8.scales, tensor->layers[0].q_proj.fp8.scales);
  EXPECT_EQ(sharded->layers[0].down_proj.fp8.scales, tensor->layers[0].down_proj.fp8.scales);

  // Blocks of 4: every range above starts and ends on them. o_proj [16, 16] has 4 x 4 blocks; the rank's columns
  // [8, 16) are block columns 2-3 of every block row.
  auto block = model(Fp8WeightScale::kBlock, 4);
  sharded = shard_model_weights(c, block, s);
  ASSERT_TRUE(sharded.ok()) << sharded.status().to_string();
  const LayerWeights& w = block->layers[0];
  const LayerWeights& b = sharded->layers[0];
  EXPECT_EQ(b.q_proj.fp8.scales, w.q_proj.fp8.scales + 2 * 4);  // block rows 2-3, 4 block columns each
  EXPECT_EQ(b.k_proj.fp8.scales, w.k_proj.fp8.scales + 1 * 4);
  for (size_t r = 0; r < 4; ++r)
    for (size_t k = 0; k < 2; ++k) EXPECT_EQ(b.o_proj.fp8.scales[r * 2 + k], w.o_proj.fp8.scales[r * 4 + 2 + k]);
  // down_proj [16, 8]: 4 x 2 blocks, the rank's columns [4, 8) are block column 1.
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(b.down_proj.fp8.scales[r], w.down_proj.fp8.scales[r * 2 + 1]);

  // Blocks of 8: the KV rows [4, 8) and the features [4, 8) cut them.
  auto coarse = model(Fp8WeightScale::kBlock, 8);
  auto refused = shard_model_weights(c, coarse, s);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("self_attn.k_proj.weight [8, 16] has 8x8 fp8 scale blocks; a rank's rows "
                                            "[4, 8)"), std::string::npos)
      << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("--tensor-parallel-size 2"), std::string::npos);
}

}  // namespace
}  // namespace pagoda
