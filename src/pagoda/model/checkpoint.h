#pragma once
// The tensors of a Hugging Face model directory: model.safetensors, or the shards
// listed by model.safetensors.index.json ({"weight_map": {tensor: shard file}}).
// Every file is mmapped and validated (see safetensors_file.h); the index is
// cross-checked (each listed tensor must be in its shard, shard names may not
// leave the directory, a tensor may not sit in two shards).
//
// Thread safety: immutable after open.

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/model/safetensors_file.h"

namespace pagoda {

class Checkpoint {
 public:
  // progress (optional) gets one line per file opened, for stderr.
  static StatusOr<Checkpoint> open(const std::filesystem::path& dir,
                                   const std::function<void(const std::string&)>& progress = {});

  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  size_t num_tensors() const { return by_name_.size(); }
  size_t total_bytes() const { return total_bytes_; }
  const std::filesystem::path& dir() const { return dir_; }
  // "model.safetensors" or "model.safetensors.index.json", for error messages.
  const std::string& source_name() const { return source_name_; }

 private:
  std::filesystem::path dir_;
  std::string source_name_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, const TensorInfo*, std::less<>> by_name_;
  size_t total_bytes_ = 0;
};

}  // namespace pagoda
