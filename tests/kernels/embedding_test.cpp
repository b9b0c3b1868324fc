#include "pagoda/backend/cpu/kernels/embedding.h"

#include <gtest/gtest.h>

#include "kernels/random_data.h"

namespace pagoda::kernels {
namespace {

TEST(EmbeddingTest, GathersRowsInEveryDtype) {
  const size_t vocab = 11, hidden = 6;
  const auto table = testing::random_values(vocab * hidden, 3);
  std::vector<uint16_t> bf16(table.size()), f16(table.size());
  for (size_t i = 0; i < table.size(); ++i) bf16[i] = f32_to_bf16(table[i]), f16[i] = f32_to_f16(table[i]);
  const std::vector<int32_t> ids = {10, 0, 3, 3};
  for (auto [dtype, data] : {std::pair<DType, const void*>{DType::kF32, table.data()},
                             {DType::kBF16, bf16.data()}, {DType::kF16, f16.data()}}) {
    std::vector<float> out(ids.size() * hidden);
    embedding_lookup(WeightMatrix{dtype, data, vocab, hidden}, ids.data(), ids.size(), out.data());
    for (size_t t = 0; t < ids.size(); ++t)
      for (size_t j = 0; j < hidden; ++j) {
        const size_t k = ids[t] * hidden + j;
        const float expected = dtype == DType::kF32 ? table[k] : dtype == DType::kBF16 ? bf16_to_f32(bf16[k]) : f16_to_f32(f16[k]);
        EXPECT_EQ(out[t * hidden + j], expected);
      }
  }
}

}  // namespace
}  // namespace pagoda::kernels
