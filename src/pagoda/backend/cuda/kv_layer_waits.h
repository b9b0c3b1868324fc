#pragma once
// What a forward must wait for, layer by layer, before it touches the KV pool:
// the host tier's copies issued one layer at a time (cuda_host_kv_pool.h), so
// that a step's layer l waits only for layer l's copies, not for the whole
// load (SGLang HiCache's layer-by-layer overlap).
//
// events[l * per_layer + k], k < per_layer: the events of layer l (one per
// copy direction in flight). The last layer's events complete after every
// earlier layer's (each direction's copies run in order on one stream), so
// waiting on them orders a stream after every copy.
//
// Thread safety: a plain value.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace pagoda::cuda {

struct KvLayerWaits {
  std::vector<cudaEvent_t> events;
  int32_t per_layer = 0;

  bool empty() const { return per_layer == 0; }
  int32_t num_layers() const { return per_layer == 0 ? 0 : static_cast<int32_t>(events.size()) / per_layer; }
  // Makes `stream` wait for layer `layer`'s copies (nothing if out of range).
  cudaError_t wait_layer(cudaStream_t stream, int32_t layer) const {
    if (layer < 0 || layer >= num_layers()) return cudaSuccess;
    for (int32_t k = 0; k < per_layer; ++k) {
      const cudaError_t e = cudaStreamWaitEvent(stream, events[static_cast<size_t>(layer * per_layer + k)], 0);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  // Makes `stream` wait for every copy.
  cudaError_t wait_all(cudaStream_t stream) const { return wait_layer(stream, num_layers() - 1); }
};

}  // namespace pagoda::cuda
