#pragma once
// The bundled models/pagoda-tiny on the CPU, loaded once per test binary, and
// deterministic prompts over its vocabulary: shared by the backend tests that
// run the real model (token eviction, cross-layer sharing).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/backend/cpu/cpu_model.h"

namespace pagoda::testing {

// Null (and a test failure) when the model cannot be loaded.
inline std::shared_ptr<CpuModel> tiny_model() {
  static std::shared_ptr<CpuModel> model = [] {
    auto loaded = CpuModel::load(std::string(PAGODA_SOURCE_DIR) + "/models/pagoda-tiny");
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    return loaded.ok() ? std::shared_ptr<CpuModel>(std::move(*loaded)) : nullptr;
  }();
  return model;
}

// `length` token ids in [3, 4003), a different sequence per salt.
inline std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < length; ++i) p.push_back((i * 131 + salt * 977 + 7) % 4000 + 3);
  return p;
}

}  // namespace pagoda::testing
