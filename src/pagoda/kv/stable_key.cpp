#include "pagoda/kv/stable_key.h"

#include <openssl/evp.h>

#include <vector>

namespace pagoda::kv {
namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

StableKey sha256(const std::vector<uint8_t>& data) {
  StableKey key;
  unsigned int len = 0;
  // EVP_Digest with SHA-256 cannot fail on valid memory; a failure would leave
  // the key zero, which no real block hashes to (and is then just a miss).
  EVP_Digest(data.data(), data.size(), key.bytes.data(), &len, EVP_sha256(), nullptr);
  return key;
}

}  // namespace

StableKey stable_namespace_root(std::string_view model_fingerprint, std::string_view tenant_namespace) {
  static constexpr std::string_view kDomain = "pagoda-kv-key/1";
  std::vector<uint8_t> data(kDomain.begin(), kDomain.end());
  put_u32(data, static_cast<uint32_t>(model_fingerprint.size()));
  data.insert(data.end(), model_fingerprint.begin(), model_fingerprint.end());
  put_u32(data, static_cast<uint32_t>(tenant_namespace.size()));
  data.insert(data.end(), tenant_namespace.begin(), tenant_namespace.end());
  return sha256(data);
}

StableKey stable_block_key(const StableKey& previous, const TokenId* tokens, int32_t block_size) {
  std::vector<uint8_t> data(previous.bytes.begin(), previous.bytes.end());
  data.reserve(32 + 4 + 4 * static_cast<size_t>(block_size));
  put_u32(data, static_cast<uint32_t>(block_size));
  for (int32_t i = 0; i < block_size; ++i) put_u32(data, static_cast<uint32_t>(tokens[i]));
  return sha256(data);
}

std::string stable_key_hex(const StableKey& key) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    out[2 * i] = kDigits[key.bytes[i] >> 4];
    out[2 * i + 1] = kDigits[key.bytes[i] & 15];
  }
  return out;
}

}  // namespace pagoda::kv
