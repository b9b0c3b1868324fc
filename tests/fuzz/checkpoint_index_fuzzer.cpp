// The sharded-checkpoint index (model/checkpoint.h): any bytes as
// model.safetensors.index.json in a directory holding one valid shard. Shard
// names must never leave the directory; what opens must find its tensors.

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_target.h"
#include "pagoda/model/checkpoint.h"

namespace pagoda::fuzz {
namespace {

// A directory with "shard.safetensors" (one F32 tensor "w" of 2 values), made once.
const std::filesystem::path& fixture_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("pagoda_fuzz_index_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    const std::string header = R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
    std::ofstream out(d / "shard.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
    const float values[2] = {1.0f, 2.0f};
    out.write(reinterpret_cast<const char*>(values), sizeof values);
    return d;
  }();
  return dir;
}

}  // namespace

int fuzz_checkpoint_index(const uint8_t* data, size_t size) {
  const auto& dir = fixture_dir();
  {
    std::ofstream out(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto checkpoint = Checkpoint::open(dir);
  if (checkpoint.ok()) {
    const TensorInfo* w = checkpoint->find("w");
    float second = 0;
    if (w != nullptr && w->num_bytes == 8) std::memcpy(&second, static_cast<const char*>(w->data) + 4, 4);
    if (w != nullptr && (w->num_bytes != 8 || second != 2.0f)) fail("the index let a tensor be read wrongly");
  }
  return 0;
}

}  // namespace pagoda::fuzz

PAGODA_FUZZ_TARGET(fuzz_checkpoint_index)
