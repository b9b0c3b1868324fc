#pragma once
// One .safetensors file, mmapped and validated; tensors are zero-copy views.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}, then the data section; offsets are relative to it.
//
// open() checks everything before any tensor is used, and every error names the
// file (and the tensor): file shorter than 8 bytes, header length past the end,
// header not JSON / not an object, missing or ill-typed fields, unsupported
// dtype, negative dims, offsets out of the data section, byte count that
// disagrees with shape x dtype, and overlapping tensors.
//
// Thread safety: immutable after open.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/model/mapped_file.h"

namespace pagoda {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the mapping; valid while the file is open
  size_t num_bytes = 0;
  std::string file_name;       // for error messages: "model-00001-of-00002.safetensors"

  int64_t num_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// "[4096, 128]".
std::string shape_to_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  static StatusOr<SafetensorsFile> open(const std::filesystem::path& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  const std::filesystem::path& path() const { return file_->path(); }

 private:
  std::shared_ptr<const MappedFile> file_;
  std::vector<TensorInfo> tensors_;  // sorted by name
};

}  // namespace pagoda
