// The KV settings under the disk / redis tiers' model fingerprint (cli/kv_tier_flags.h): a block stored
// under one setting that changes its bytes' meaning must never be a hit under another, and the strings of
// settings that existed before a new one was added must not change (stored tiers stay valid).

#include <gtest/gtest.h>

#include "pagoda/cli/kv_tier_flags.h"

namespace pagoda::cli {
namespace {

backend::RunnerSpec spec() {
  backend::RunnerSpec s;
  s.device = backend::Device::kCuda;
  s.key_dtype = s.value_dtype = DType::kBF16;
  s.model_dir = "/models/deepseek";
  return s;
}

KvPoolShape latent(runtime::MlaLatentPages pages) {
  KvPoolShape g;
  g.latent = true;
  g.head_dim = 576;
  g.latent_rope_dim = 64;
  g.block_size = 64;
  g.key_dtype = g.value_dtype = DType::kBF16;
  g.latent_pages = pages;
  return g;
}

TEST(KvTierSettings, TokenMajorPoolsKeepTheirStringAndSwizzledPagesAreTagged) {
  const std::string before = "device=cuda k=bf16 v=bf16 block_size=64 block_bytes=73728 weight_seed=0";
  EXPECT_EQ(kv_tier_settings(spec(), 64, 73728, latent(runtime::MlaLatentPages::kTokenMajor)), before)
      << "what stored tiers were keyed by before the layout existed";
  const std::string swizzled = kv_tier_settings(spec(), 64, 73728, latent(runtime::MlaLatentPages::kSwizzled128));
  EXPECT_NE(swizzled, before) << "same bytes per block, another meaning: no hit across layouts";
  EXPECT_EQ(swizzled, before + " mla_pages=swizzled128");
}

TEST(KvTierSettings, TensorParallelSizeAndRandomWeightsSeedAreCovered) {
  backend::RunnerSpec tp = spec();
  tp.tensor_parallel_size = 2;
  KvPoolShape plain;
  plain.block_size = 16;
  EXPECT_EQ(kv_tier_settings(tp, 16, 4096, plain),
            "device=cuda k=bf16 v=bf16 block_size=16 block_bytes=4096 weight_seed=0 tensor_parallel_size=2");
  backend::RunnerSpec random = spec();
  random.model_dir.clear();
  random.weight_seed = 7;
  EXPECT_NE(kv_tier_settings(random, 16, 4096, plain).find("weight_seed=7"), std::string::npos);
}

}  // namespace
}  // namespace pagoda::cli
