// pdl_enabled() / set_pdl_enabled() of pdl.cuh.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {

namespace {

// -1: not yet read from the environment.
std::atomic<int>& pdl_state() {
  static std::atomic<int> state{-1};
  return state;
}

}  // namespace

bool pdl_enabled() {
  int state = pdl_state().load(std::memory_order_relaxed);
  if (state < 0) {
    const char* env = std::getenv("PAGODA_PDL");
    const int from_env = env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
    pdl_state().compare_exchange_strong(state, from_env, std::memory_order_relaxed);
    state = pdl_state().load(std::memory_order_relaxed);
  }
  return state == 1;
}

void set_pdl_enabled(bool enabled) { pdl_state().store(enabled ? 1 : 0, std::memory_order_relaxed); }

}  // namespace pagoda::cuda
