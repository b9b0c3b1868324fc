#pragma once
// `--load-format random --device cpu`: a CpuModel of any config.json with
// random f32 weights made in memory, so the whole CPU path (KV pool, engine,
// server) runs without a checkpoint. The CUDA twin is CudaModel::create_random.
//
// Weights: uniform in [-a, a] with a = 0.02 * sqrt(3) (the standard deviation of
// HF's initializer_range 0.02), norms 1, biases 0; reproducible from `seed`.
// The matrices take 4 bytes per parameter, so this is for small shapes: above
// max_bytes the error says so (use --device cuda for 8B-class configs).
//
// Thread safety: plain function; fills on ThreadPool::global().

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pagoda/core/status.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/model/model_config.h"

namespace pagoda {

// Bytes the random f32 matrices of `config` take.
size_t random_cpu_weight_bytes(const ModelConfig& config);

StatusOr<std::unique_ptr<CpuModel>> make_random_cpu_model(const ModelConfig& config, uint64_t seed,
                                                          size_t max_bytes);

}  // namespace pagoda
