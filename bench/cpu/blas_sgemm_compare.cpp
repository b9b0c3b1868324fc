// Benchmark peer check for issue 27: f32 GEMM at the side-by-side model's prefill shapes (512 tokens x the
// qkv / o / gate_up / down weights) through OpenBLAS, BLIS or oneDNN, each dlopened, so none is a build
// dependency of pagoda. Build and run (after apt-get install libblis-dev libdnnl-dev):
//   g++ -O2 bench/cpu/blas_sgemm_compare.cpp -o /tmp/blas_cmp -ldl
//   for l in libopenblas.so.0 libblis.so.4 libdnnl.so.2; do OPENBLAS_NUM_THREADS=2 BLIS_NUM_THREADS=2
//     OMP_NUM_THREADS=2 /tmp/blas_cmp /usr/lib/x86_64-linux-gnu/$l; done
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstring>
typedef void (*cblas_t)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
typedef int (*dnnl_t)(char, char, long, long, long, float, const float*, long, const float*, long, float, float*, long);
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("%s\n", dlerror()); return 1; }
  bool dnnl = strstr(argv[1], "dnnl");
  cblas_t cb = dnnl ? nullptr : (cblas_t)dlsym(h, "cblas_sgemm");
  dnnl_t dn = dnnl ? (dnnl_t)dlsym(h, "dnnl_sgemm") : nullptr;
  if (!cb && !dn) { printf("no symbol\n"); return 1; }
  const int M = 512; int shapes[][2] = {{3072, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632}};  // N, K: qkv, o, gate_up, down
  for (auto& s : shapes) {
    int N = s[0], K = s[1];
    std::vector<float> A((size_t)M * K, 0.01f), B((size_t)N * K, 0.02f), C((size_t)M * N);
    std::vector<double> t;
    for (int r = 0; r < 6; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      // C[M,N] = A[M,K] * B[N,K]^T (weights row-major [N,K], as linear() does)
      if (cb) cb(101, 111, 112, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
      else dn('N', 'T', M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin() + 1, t.end());
    printf("%s M=%d N=%d K=%d: median %.2f ms, %.1f GFLOP/s\n", argv[1], M, N, K, t[3] * 1e3, 2.0 * M * N * K / t[3] / 1e9);
  }
}
