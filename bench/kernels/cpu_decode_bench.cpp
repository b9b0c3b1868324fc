// The weight-streaming part of one CPU decode step (issue 27): every linear()
// of a Llama-shaped model at m = 1, in model order, over matrices that together
// far exceed the caches, so each step reads every weight from memory as a real
// decode step does. Attention, norms and sampling are left out: what this times
// is the GEMV kernels and the thread pool, per weight format.
//
//   pagoda_cpu_decode_bench DTYPE [STEPS] [LAYERS]
//     DTYPE: f32 | f16 | bf16 | int8 | int4 (int4 keeps lm_head at int8, as the model does)
//     env: PAGODA_THREADS (pool size); PAGODA_VECTOR_DOT=generic|avx2+fma+f16c|avx512 (the
//          f32/f16/bf16 dot implementation, for A/B runs; default: what the dispatch picks)
//
// Shape: hidden 2048, 32 / 8 heads of 64, intermediate 5632, vocab 32000 (the
// side-by-side benchmark's ~0.85B Llama), 16 layers unless LAYERS says. Prints
// the median and best step time, weights read per second, bytes per second,
// the process CPU time per step and the 1-minute load average before and after.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "pagoda/backend/cpu/kernels/matmul.h"
#include "pagoda/backend/cpu/kernels/quant_dot.h"
#include "pagoda/backend/cpu/kernels/vector_dot.h"
#include "pagoda/core/dtype.h"
#include "pagoda/core/thread_pool.h"
#include "pagoda/model/weight_matrix.h"

namespace {

using pagoda::DType;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double load_average() {
  double l = 0.0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = 0.0;
    std::fclose(f);
  }
  return l;
}

// Small uniform values in [-0.05, 0.05) from a 64-bit xorshift (the values do not matter, only the bytes read).
struct Random {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  float next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (static_cast<float>(s >> 40) / 16777216.0f - 0.5f) * 0.1f;
  }
};

struct Matrix {
  pagoda::WeightMatrix w;
  std::unique_ptr<uint8_t[]> bytes;
  size_t size_bytes = 0;
};

Matrix make_matrix(DType dtype, size_t rows, size_t cols, Random& rng) {
  Matrix m;
  m.w.dtype = dtype;
  m.w.rows = rows;
  m.w.cols = cols;
  std::vector<float> row(cols);
  size_t row_bytes = pagoda::kernels::is_quantized_weight(dtype) ? pagoda::kernels::quantized_row_bytes(dtype, cols)
                                                                 : cols * static_cast<size_t>(pagoda::dtype_bits(dtype) / 8);
  m.size_bytes = rows * row_bytes;
  m.bytes = std::make_unique<uint8_t[]>(m.size_bytes + 64);
  uint8_t* base = m.bytes.get() + (64 - reinterpret_cast<uintptr_t>(m.bytes.get()) % 64) % 64;
  for (size_t r = 0; r < rows; ++r) {
    for (float& v : row) v = rng.next();
    uint8_t* dst = base + r * row_bytes;
    if (pagoda::kernels::is_quantized_weight(dtype)) pagoda::kernels::quantize_weight_rows(dtype, row.data(), 1, cols, dst);
    else if (dtype == DType::kF32) std::copy(row.begin(), row.end(), reinterpret_cast<float*>(dst));
    else
      for (size_t c = 0; c < cols; ++c) {
        const uint16_t h = dtype == DType::kBF16 ? pagoda::f32_to_bf16(row[c]) : pagoda::f32_to_f16(row[c]);
        std::memcpy(dst + 2 * c, &h, 2);
      }
  }
  m.w.data = base;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s f32|f16|bf16|int8|int4 [STEPS] [LAYERS]\n", argv[0]);
    return 2;
  }
  const std::string dt = argv[1];
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 10;
  const int layers = argc > 3 ? std::max(1, std::atoi(argv[3])) : 16;
  DType dtype;
  if (dt == "f32") dtype = DType::kF32;
  else if (dt == "f16") dtype = DType::kF16;
  else if (dt == "bf16") dtype = DType::kBF16;
  else if (dt == "int8") dtype = DType::kInt8;
  else if (dt == "int4") dtype = DType::kInt4;
  else {
    std::fprintf(stderr, "DTYPE must be f32, f16, bf16, int8 or int4, got '%s'\n", dt.c_str());
    return 2;
  }
  if (const char* impl = std::getenv("PAGODA_VECTOR_DOT"); impl != nullptr && *impl != '\0') {
    if (!pagoda::kernels::select_vector_dot_implementation(impl)) {
      std::fprintf(stderr, "PAGODA_VECTOR_DOT=%s: unknown, or this CPU lacks its instructions\n", impl);
      return 2;
    }
  }
  std::printf("vector_dot: %s\n", pagoda::kernels::vector_dot_implementation());
  constexpr size_t kHidden = 2048, kKv = 512, kInter = 5632, kVocab = 32000;
  Random rng;
  std::vector<Matrix> mats;
  for (int l = 0; l < layers; ++l) {
    for (size_t rows : {kHidden, kKv, kKv, kHidden}) mats.push_back(make_matrix(dtype, rows, kHidden, rng));  // q k v o
    mats.push_back(make_matrix(dtype, kInter, kHidden, rng));  // gate
    mats.push_back(make_matrix(dtype, kInter, kHidden, rng));  // up
    mats.push_back(make_matrix(dtype, kHidden, kInter, rng));  // down
  }
  mats.push_back(make_matrix(dtype == DType::kInt4 ? DType::kInt8 : dtype, kVocab, kHidden, rng));  // lm_head
  double weights = 0.0, bytes = 0.0;
  for (const Matrix& m : mats) {
    weights += static_cast<double>(m.w.rows * m.w.cols);
    bytes += static_cast<double>(m.size_bytes);
  }
  std::vector<float> x(kInter), y(kVocab);
  for (float& v : x) v = rng.next() * 20.0f;
  auto step = [&] {
    for (const Matrix& m : mats) pagoda::kernels::linear(x.data(), 1, m.w, nullptr, y.data());
  };
  step();  // warm-up: first touch, the pool's threads
  const double l0 = load_average();
  std::vector<double> secs;
  const double cpu0 = process_cpu_seconds();
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double cpu_per_step = (process_cpu_seconds() - cpu0) / steps;
  std::sort(secs.begin(), secs.end());
  const double med = secs[secs.size() / 2], best = secs.front();
  std::printf("%s threads=%zu layers=%d %.2f GB: median %.2f ms (%.1f Gweights/s, %.1f GB/s), best %.2f ms (%.1f GB/s), "
              "CPU %.2f ms/step (load %.2f -> %.2f)\n",
              dt.c_str(), pagoda::ThreadPool::global().size(), layers, bytes * 1e-9, med * 1e3, weights / med * 1e-9,
              bytes / med * 1e-9, best * 1e3, bytes / best * 1e-9, cpu_per_step * 1e3, l0, load_average());
  return 0;
}
