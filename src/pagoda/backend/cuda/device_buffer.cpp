#include "pagoda/backend/cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_check.h"

namespace pagoda::cuda {

StatusOr<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  const cudaError_t err = cudaMalloc(&buffer.data_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
    return resource_exhausted_error("cudaMalloc of {:.2f} GiB failed: {}", bytes / double(1ull << 30),
                                    cudaGetErrorString(err));
  }
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

StatusOr<PinnedBuffer> PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  const cudaError_t err = cudaMallocHost(&buffer.data_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return resource_exhausted_error("cudaMallocHost of {} bytes failed: {}", bytes, cudaGetErrorString(err));
  }
  buffer.bytes_ = bytes;
  return buffer;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace pagoda::cuda
