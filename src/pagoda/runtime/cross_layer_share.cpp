#include "pagoda/runtime/cross_layer_share.h"

namespace pagoda::runtime {

Status validate_cross_layer_share(int32_t group, int32_t num_layers, std::string_view flag) {
  if (group < 1) return invalid_argument_error("{} {}: must be >= 1 (1: no sharing)", flag, group);
  if (group > 1 && group > num_layers / 2)
    return invalid_argument_error("{} {}: the model has {} layers; groups are cut from the upper half, so at most {}",
                                  flag, group, num_layers, num_layers / 2);
  return ok_status();
}

}  // namespace pagoda::runtime
