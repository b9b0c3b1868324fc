// pdl_enabled() of pdl.cuh.
#include <cstdlib>
#include <cstring>

#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("PAGODA_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return enabled;
}

}  // namespace pagoda::cuda
