#include "pagoda/server/tokenizer_fingerprint.h"

#include <openssl/evp.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include <fmt/format.h>

namespace pagoda::server {

StatusOr<std::string> tokenizer_fingerprint(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(model_dir)) return not_found_error("{}: not a directory", model_dir);
  if (!fs::exists(fs::path(model_dir) / "tokenizer.json")) return std::string();
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    return internal_error("SHA-256 is not available");
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    const fs::path path = fs::path(model_dir) / name;
    const bool present = fs::exists(path);
    std::string bytes;
    if (present) {
      std::ifstream in(path, std::ios::binary);
      if (!in) return data_loss_error("{}: cannot be read", path.string());
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (in.bad()) return data_loss_error("{}: cannot be read", path.string());
    }
    const std::string_view tag(name);
    const uint64_t sizes[3] = {tag.size(), present ? 1u : 0u, bytes.size()};
    EVP_DigestUpdate(ctx.get(), sizes, sizeof(sizes));
    EVP_DigestUpdate(ctx.get(), tag.data(), tag.size());
    EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
  }
  std::array<unsigned char, 32> digest{};
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest.data(), &length);
  std::string hex;
  hex.reserve(64);
  for (unsigned char b : digest) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace pagoda::server
