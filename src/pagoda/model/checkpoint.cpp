#include "pagoda/model/checkpoint.h"

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace pagoda {

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

StatusOr<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found_error("{}: cannot open", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return data_loss_error("{}: not valid JSON", path.string());
  return j;
}

// A shard name from the index must be a plain file name inside the model directory.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name != "." && name != "..";
}

}  // namespace

StatusOr<Checkpoint> Checkpoint::open(const std::filesystem::path& dir,
                                      const std::function<void(const std::string&)>& progress) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const auto index_path = dir / kIndexFile;
  const auto single_path = dir / kSingleFile;
  std::error_code ec;

  if (std::filesystem::exists(index_path, ec)) {
    ckpt.source_name_ = kIndexFile;
    PAGODA_ASSIGN_OR_RETURN(nlohmann::json index, read_json_file(index_path));
    const auto map_it = index.is_object() ? index.find("weight_map") : index.end();
    if (map_it == index.end() || !map_it->is_object())
      return data_loss_error("{}: missing object 'weight_map'", index_path.string());
    std::vector<std::string> shard_names;
    std::map<std::string, size_t> shard_of_name;
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string())
        return data_loss_error("{}: weight_map['{}'] is not a file name", index_path.string(), tensor);
      const std::string shard_name = shard.get<std::string>();
      if (!is_plain_file_name(shard_name))
        return data_loss_error("{}: weight_map['{}'] = '{}' is not a file inside the model directory",
                               index_path.string(), tensor, shard_name);
      if (!shard_of_name.count(shard_name)) {
        shard_of_name[shard_name] = shard_names.size();
        shard_names.push_back(shard_name);
      }
    }
    if (shard_names.empty()) return data_loss_error("{}: weight_map is empty", index_path.string());
    for (size_t i = 0; i < shard_names.size(); ++i) {
      if (progress) progress(fmt::format("opening shard {}/{}: {}", i + 1, shard_names.size(), shard_names[i]));
      PAGODA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(dir / shard_names[i]));
      ckpt.files_.push_back(std::move(file));
    }
    for (const auto& [tensor, shard] : map_it->items()) {
      const SafetensorsFile& file = ckpt.files_[shard_of_name[shard.get<std::string>()]];
      const TensorInfo* info = file.find(tensor);
      if (info == nullptr) {
        return data_loss_error("{}: tensor '{}' is listed in {} but missing from {}",
                               dir.string(), tensor, kIndexFile, shard.get<std::string>());
      }
    }
  } else if (std::filesystem::exists(single_path, ec)) {
    ckpt.source_name_ = kSingleFile;
    if (progress) progress(fmt::format("opening {}", single_path.string()));
    PAGODA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(single_path));
    ckpt.files_.push_back(std::move(file));
  } else {
    return not_found_error("{}: neither {} nor {} exists", dir.string(), kSingleFile, kIndexFile);
  }

  for (const auto& file : ckpt.files_) {
    for (const auto& t : file.tensors()) {
      auto [it, inserted] = ckpt.by_name_.emplace(t.name, &t);
      if (!inserted) {
        return data_loss_error("{}: tensor '{}' appears in both {} and {}", dir.string(), t.name,
                               it->second->file_name, t.file_name);
      }
      ckpt.total_bytes_ += t.num_bytes;
    }
  }
  return ckpt;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

}  // namespace pagoda
