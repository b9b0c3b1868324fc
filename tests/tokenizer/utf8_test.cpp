#include "pagoda/tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace pagoda::tokenizer {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// Expected values follow Python's bytes.decode("utf-8", errors="replace").
TEST(Utf8Test, RepairReplacesEachMaximalInvalidSubpartOnce) {
  EXPECT_EQ(repair_utf8("abc"), "abc");
  EXPECT_EQ(repair_utf8("\xE2\x82\xAC"), "\xE2\x82\xAC");              // euro sign, valid
  EXPECT_EQ(repair_utf8("\xE2\x82"), kFffd);                           // truncated: one U+FFFD
  EXPECT_EQ(repair_utf8("\xE2\x82" "A"), kFffd + "A");
  EXPECT_EQ(repair_utf8("\x80" "A" "\xBF"), kFffd + "A" + kFffd);      // lone continuations
  EXPECT_EQ(repair_utf8("A\xFF" "B"), "A" + kFffd + "B");
  EXPECT_EQ(repair_utf8("\xC0\x80"), kFffd + kFffd);                   // overlong: C0 never valid
  EXPECT_EQ(repair_utf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);       // surrogate
  EXPECT_EQ(repair_utf8("\xF0\x9F\x98" "x"), kFffd + "x");             // truncated emoji
  EXPECT_EQ(repair_utf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
}

TEST(Utf8Test, DecodeAndValidate) {
  char32_t cp = 0;
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80", 0, cp), 4u);
  EXPECT_EQ(cp, U'\U0001F600');
  EXPECT_EQ(decode_utf8("\xE2\x82", 0, cp), 0u);
  EXPECT_TRUE(is_valid_utf8("héllo 世界"));
  EXPECT_FALSE(is_valid_utf8("\xC3"));
  std::string out;
  append_utf8(out, U'\u4E16');
  EXPECT_EQ(out, "世");
}

TEST(Utf8Test, IncompleteTailIsRecognised) {
  EXPECT_TRUE(ends_with_incomplete_utf8("ab\xE2\x82"));
  EXPECT_TRUE(ends_with_incomplete_utf8("\xF0"));
  EXPECT_FALSE(ends_with_incomplete_utf8("ab\xE2\x82\xAC"));
  EXPECT_FALSE(ends_with_incomplete_utf8("ab"));
  EXPECT_FALSE(ends_with_incomplete_utf8("\xFF"));       // invalid, not incomplete
  EXPECT_FALSE(ends_with_incomplete_utf8("\xE2" "A"));
}

}  // namespace
}  // namespace pagoda::tokenizer
