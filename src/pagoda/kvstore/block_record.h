#pragma once
// The stored form of one KV block in a tier below the host (a file on disk, a
// value in redis): a fixed 64-byte header, then the block's bytes as the host
// tier holds them (runtime/host_block_layout.h).
//
//   offset  size  field
//        0     8  magic "PGKVBLK\0"
//        8     4  format version (1), little-endian
//       12     4  reserved, 0
//       16    32  the block's stable key (kv/stable_key.h)
//       48     8  payload length in bytes
//       56     8  XXH3-64 of bytes [0, 56) and of the payload
//
// A record whose magic, version, key, length or checksum is not what the
// reader expects is refused (kDataLoss naming the field): a torn, short or
// corrupt record is a miss, never K/V.
//
// Thread safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/kv/stable_key.h"

namespace pagoda::kvstore {

inline constexpr size_t kRecordHeaderBytes = 64;
inline constexpr uint32_t kRecordFormatVersion = 1;

std::vector<std::byte> encode_record(const kv::StableKey& key, std::span<const std::byte> payload);

// The header's key and payload length, checked for magic and version only
// (index rebuilds read headers without the payload).
struct RecordHeader {
  kv::StableKey key;
  uint64_t payload_bytes = 0;
};
StatusOr<RecordHeader> parse_record_header(std::span<const std::byte> header);

// Checks the whole record against `expected_key` and `payload.size()` and
// copies the payload out. kDataLoss naming what is wrong.
Status decode_record(std::span<const std::byte> record, const kv::StableKey& expected_key,
                     std::span<std::byte> payload);
// As decode_record, for a record read in two pieces: its 64-byte header and
// its payload, already where the payload is wanted (a disk read straight into
// a host-pool block). Nothing is copied; on kDataLoss the payload is garbage.
Status verify_record(std::span<const std::byte> header, const kv::StableKey& expected_key,
                     std::span<const std::byte> payload);

}  // namespace pagoda::kvstore
