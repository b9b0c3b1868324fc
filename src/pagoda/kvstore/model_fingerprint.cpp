#include "pagoda/kvstore/model_fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "pagoda/kv/stable_key.h"

namespace pagoda::kvstore {
namespace fs = std::filesystem;
namespace {

struct Digest {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  Digest() { EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr); }
  ~Digest() { EVP_MD_CTX_free(ctx); }
  void add(std::string_view tag, std::string_view bytes) {
    const uint64_t sizes[2] = {tag.size(), bytes.size()};
    EVP_DigestUpdate(ctx, sizes, sizeof(sizes));
    EVP_DigestUpdate(ctx, tag.data(), tag.size());
    EVP_DigestUpdate(ctx, bytes.data(), bytes.size());
  }
  std::string hex() {
    kv::StableKey out;
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, out.bytes.data(), &len);
    return kv::stable_key_hex(out);
  }
};

}  // namespace

StatusOr<std::string> model_fingerprint(const std::string& model_dir, const std::string& config_path,
                                        std::string_view kv_settings) {
  Digest d;
  std::ifstream config(config_path, std::ios::binary);
  if (!config) return not_found_error("model fingerprint: cannot read {}", config_path);
  const std::string config_bytes((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  d.add("config.json", config_bytes);
  if (!model_dir.empty()) {
    std::vector<fs::path> files;
    std::error_code ec;
    for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".safetensors") files.push_back(it->path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      std::ifstream in(file, std::ios::binary);
      unsigned char len_bytes[8] = {};
      if (!in.read(reinterpret_cast<char*>(len_bytes), 8))
        return data_loss_error("model fingerprint: {}: shorter than a safetensors header", file.string());
      uint64_t len = 0;
      for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
      if (len > (uint64_t{1} << 30))
        return data_loss_error("model fingerprint: {}: safetensors header of {} bytes", file.string(), len);
      std::string header(len, '\0');
      if (!in.read(header.data(), static_cast<std::streamsize>(len)))
        return data_loss_error("model fingerprint: {}: truncated safetensors header", file.string());
      d.add(file.filename().string(), header);
    }
  }
  d.add("kv", kv_settings);
  return d.hex();
}

}  // namespace pagoda::kvstore
