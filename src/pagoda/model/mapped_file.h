#pragma once
// A read-only memory mapping of a whole file: how checkpoints stay zero-copy
// (weights are used in place, in the file's dtype). The mapping is populated at
// open (MAP_POPULATE: the file is read then, not on first use by a forward pass).
//
// Thread safety: immutable after open; share freely (std::shared_ptr).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

#include "pagoda/core/status.h"

namespace pagoda {

class MappedFile {
 public:
  // Errors: not found, not a regular file, or the OS refusing open/mmap.
  static StatusOr<std::shared_ptr<const MappedFile>> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile(std::filesystem::path path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pagoda
