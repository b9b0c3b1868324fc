#include "pagoda/kvstore/block_record.h"

#include <xxhash.h>

#include <cstring>

namespace pagoda::kvstore {
namespace {

constexpr char kMagic[8] = {'P', 'G', 'K', 'V', 'B', 'L', 'K', '\0'};

void put_u64(std::byte* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t get_u64(const std::byte* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(std::to_integer<uint8_t>(at[i])) << (8 * i);
  return v;
}

uint64_t checksum(std::span<const std::byte> header56, std::span<const std::byte> payload) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, header56.data(), header56.size());
  XXH3_64bits_update(state, payload.data(), payload.size());
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

}  // namespace

std::vector<std::byte> encode_record(const kv::StableKey& key, std::span<const std::byte> payload) {
  std::vector<std::byte> out(kRecordHeaderBytes + payload.size());
  std::memcpy(out.data(), kMagic, 8);
  put_u64(out.data() + 8, kRecordFormatVersion);  // version (4 bytes) + reserved (4 bytes, 0)
  std::memcpy(out.data() + 16, key.bytes.data(), 32);
  put_u64(out.data() + 48, payload.size());
  if (!payload.empty()) std::memcpy(out.data() + kRecordHeaderBytes, payload.data(), payload.size());
  put_u64(out.data() + 56, checksum(std::span(out.data(), 56), payload));
  return out;
}

StatusOr<RecordHeader> parse_record_header(std::span<const std::byte> header) {
  if (header.size() < kRecordHeaderBytes)
    return data_loss_error("KV block record: {} bytes, shorter than its {}-byte header", header.size(),
                           kRecordHeaderBytes);
  if (std::memcmp(header.data(), kMagic, 8) != 0) return data_loss_error("KV block record: bad magic");
  const uint64_t version = get_u64(header.data() + 8);
  if (version != kRecordFormatVersion)
    return data_loss_error("KV block record: format version {} (expected {})", version & 0xffffffffu,
                           kRecordFormatVersion);
  RecordHeader h;
  std::memcpy(h.key.bytes.data(), header.data() + 16, 32);
  h.payload_bytes = get_u64(header.data() + 48);
  return h;
}

Status verify_record(std::span<const std::byte> header, const kv::StableKey& expected_key,
                     std::span<const std::byte> payload) {
  PAGODA_ASSIGN_OR_RETURN(RecordHeader h, parse_record_header(header));
  if (h.key != expected_key) return data_loss_error("KV block record: key differs from the one asked for");
  if (h.payload_bytes != payload.size())
    return data_loss_error("KV block record: payload length {} (expected {})", h.payload_bytes, payload.size());
  if (get_u64(header.data() + 56) != checksum(header.first(56), payload))
    return data_loss_error("KV block record: checksum mismatch");
  return ok_status();
}

Status decode_record(std::span<const std::byte> record, const kv::StableKey& expected_key,
                     std::span<std::byte> payload) {
  PAGODA_RETURN_IF_ERROR(parse_record_header(record).status());
  if (record.size() != kRecordHeaderBytes + payload.size())
    return data_loss_error("KV block record: {} bytes (expected {})", record.size(),
                           kRecordHeaderBytes + payload.size());
  const std::span<const std::byte> body = record.subspan(kRecordHeaderBytes);
  PAGODA_RETURN_IF_ERROR(verify_record(record.first(kRecordHeaderBytes), expected_key, body));
  std::memcpy(payload.data(), body.data(), payload.size());
  return ok_status();
}

}  // namespace pagoda::kvstore
