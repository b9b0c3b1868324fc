// Block records: a record round-trips; every field that is wrong (magic,
// version, key, length, checksum, a flipped payload byte, truncation) is
// refused with kDataLoss, never decoded into K/V.

#include <gtest/gtest.h>

#include "pagoda/kvstore/block_record.h"

namespace pagoda::kvstore {
namespace {

std::vector<std::byte> payload_of(size_t n) {
  std::vector<std::byte> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(i * 7 + 3);
  return p;
}

kv::StableKey key_of(uint8_t seed) {
  kv::StableKey k;
  for (size_t i = 0; i < 32; ++i) k.bytes[i] = static_cast<uint8_t>(seed + i);
  return k;
}

TEST(BlockRecordTest, RoundTrips) {
  const auto payload = payload_of(1000);
  const auto record = encode_record(key_of(1), payload);
  ASSERT_EQ(record.size(), kRecordHeaderBytes + 1000);
  std::vector<std::byte> out(1000);
  ASSERT_TRUE(decode_record(record, key_of(1), out).ok());
  EXPECT_EQ(out, payload);
  auto header = parse_record_header(record);
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->key, key_of(1));
  EXPECT_EQ(header->payload_bytes, 1000u);
}

TEST(BlockRecordTest, EveryCorruptionIsRefused) {
  const auto payload = payload_of(256);
  const auto good = encode_record(key_of(2), payload);
  std::vector<std::byte> out(256);
  auto refused = [&](std::vector<std::byte> record, const kv::StableKey& key, size_t out_size = 256) {
    std::vector<std::byte> o(out_size);
    const Status s = decode_record(record, key, o);
    return s.code() == StatusCode::kDataLoss;
  };
  EXPECT_TRUE(refused(good, key_of(3)));                 // another key
  EXPECT_TRUE(refused(good, key_of(2), 255));            // another length
  for (size_t at : {size_t{0}, size_t{8}, size_t{20}, size_t{50}, size_t{60}, kRecordHeaderBytes + 128,
                    good.size() - 1}) {
    auto bad = good;
    bad[at] ^= std::byte{0x40};
    EXPECT_TRUE(refused(bad, key_of(2))) << "flipped byte " << at;
  }
  for (size_t len : {size_t{0}, size_t{10}, kRecordHeaderBytes, good.size() - 1}) {
    EXPECT_TRUE(refused(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)), key_of(2)))
        << "truncated to " << len;
  }
  auto longer = good;
  longer.push_back(std::byte{0});
  EXPECT_TRUE(refused(longer, key_of(2)));
  ASSERT_TRUE(decode_record(good, key_of(2), out).ok());
}

}  // namespace
}  // namespace pagoda::kvstore
