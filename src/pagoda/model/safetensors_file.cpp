#include "pagoda/model/safetensors_file.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

namespace pagoda {

namespace {

// Headers of real checkpoints are a few hundred KB; refuse absurd lengths before
// allocating anything.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::optional<DType> safetensors_dtype(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F8_E4M3") return DType::kFP8E4M3;  // FP8 checkpoints (float8_e4m3fn)
  return std::nullopt;
}

}  // namespace

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

StatusOr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  PAGODA_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  const std::string file_name = path.filename().string();
  const std::string where = path.string();
  if (file->size() < 8) {
    return data_loss_error("{}: truncated: {} bytes, shorter than the 8-byte header length", where,
                           file->size());
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);  // little-endian on every platform pagoda runs on
  if (header_len > file->size() - 8) {
    return data_loss_error("{}: header length {} runs past the end of the file ({} bytes)", where,
                           header_len, file->size());
  }
  if (header_len > kMaxHeaderBytes) {
    return data_loss_error("{}: header length {} exceeds the {} byte limit", where, header_len,
                           kMaxHeaderBytes);
  }
  const char* header_begin = reinterpret_cast<const char*>(file->data() + 8);
  nlohmann::json header =
      nlohmann::json::parse(header_begin, header_begin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return data_loss_error("{}: header is not valid JSON", where);
  if (!header.is_object()) return data_loss_error("{}: header is not a JSON object", where);

  const uint64_t data_size = file->size() - 8 - header_len;
  const uint8_t* data_begin = file->data() + 8 + header_len;

  SafetensorsFile result;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object()) return data_loss_error("{}: tensor '{}': entry is not an object", where, name);
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string())
      return data_loss_error("{}: tensor '{}': missing or non-string 'dtype'", where, name);
    if (shape_it == entry.end() || !shape_it->is_array())
      return data_loss_error("{}: tensor '{}': missing or non-array 'shape'", where, name);
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned())
      return data_loss_error("{}: tensor '{}': 'data_offsets' must be two non-negative integers", where, name);

    TensorInfo info;
    info.name = name;
    info.file_name = file_name;
    const std::string dtype_name_str = dtype_it->get<std::string>();
    const auto dtype = safetensors_dtype(dtype_name_str);
    if (!dtype) {
      return unimplemented_error("{}: tensor '{}': dtype {} not supported (supported: F32, F16, BF16, F8_E4M3)",
                                 where, name, dtype_name_str);
    }
    info.dtype = *dtype;
    uint64_t expected_bytes = static_cast<uint64_t>(dtype_bits(info.dtype) / 8);
    for (const auto& dim : *shape_it) {
      if (!dim.is_number_integer() || dim.get<int64_t>() < 0)
        return data_loss_error("{}: tensor '{}': shape has a non-integer or negative dimension", where, name);
      info.shape.push_back(dim.get<int64_t>());
      const uint64_t d = static_cast<uint64_t>(info.shape.back());
      if (d != 0 && expected_bytes > data_size / d + 1)
        return data_loss_error("{}: tensor '{}': shape {} is larger than the file", where, name,
                               shape_to_string(info.shape));
      expected_bytes *= d;
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return data_loss_error(
          "{}: tensor '{}': data_offsets [{}, {}] out of range of the data section ({} bytes)", where,
          name, begin, end, data_size);
    }
    if (end - begin != expected_bytes) {
      return data_loss_error("{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets span {}",
                             where, name, shape_to_string(info.shape), dtype_name_str,
                             expected_bytes, end - begin);
    }
    info.data = data_begin + begin;
    info.num_bytes = end - begin;
    result.tensors_.push_back(std::move(info));
  }

  // Overlap check: sort by start offset; each tensor must end before the next starts.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : result.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    const auto* cur = by_offset[i];
    if (prev->num_bytes > 0 && cur->num_bytes > 0 &&
        static_cast<const uint8_t*>(prev->data) + prev->num_bytes > static_cast<const uint8_t*>(cur->data)) {
      return data_loss_error("{}: tensors '{}' and '{}' overlap in the data section", where,
                             prev->name, cur->name);
    }
  }
  std::sort(result.tensors_.begin(), result.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  result.file_ = std::move(file);
  return result;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return (it != tensors_.end() && it->name == name) ? &*it : nullptr;
}

}  // namespace pagoda
