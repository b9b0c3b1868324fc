#pragma once
// Owning handles to GPU memory (cudaMalloc) and page-locked host memory
// (cudaMallocHost). Move-only; freed on destruction. Sizes are in bytes.
//
// Thread safety: none; a buffer belongs to one owner.

#include <cstddef>
#include <utility>

#include "pagoda/core/status.h"

namespace pagoda::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Errors: kResourceExhausted when the GPU is out of memory.
  static StatusOr<DeviceBuffer> allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static StatusOr<PinnedBuffer> allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace pagoda::cuda
