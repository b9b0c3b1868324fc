#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

// Number of bytes of a sequence with this lead byte, 0 for bytes that cannot start one.
size_t sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;  // continuation bytes, and C0/C1 (always overlong)
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

// The allowed range of the second byte depends on the lead (excludes overlongs, surrogates and
// code points above U+10FFFF); later bytes are plain continuations.
bool second_byte_ok(uint8_t lead, uint8_t second) {
  switch (lead) {
    case 0xE0: return second >= 0xA0 && second <= 0xBF;
    case 0xED: return second >= 0x80 && second <= 0x9F;
    case 0xF0: return second >= 0x90 && second <= 0xBF;
    case 0xF4: return second >= 0x80 && second <= 0x8F;
    default: return second >= 0x80 && second <= 0xBF;
  }
}

bool is_continuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// Length of the longest prefix at text[pos] that is a valid start of a sequence (>= 1 for a
// valid lead byte), and whether it is the complete sequence.
size_t valid_prefix_length(std::string_view text, size_t pos, bool& complete) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  const size_t need = sequence_length(lead);
  complete = false;
  if (need == 0) return 0;
  if (need == 1) {
    complete = true;
    return 1;
  }
  size_t have = 1;
  if (pos + 1 >= text.size() || !second_byte_ok(lead, static_cast<uint8_t>(text[pos + 1]))) {
    return have;
  }
  ++have;
  while (have < need && pos + have < text.size() &&
         is_continuation(static_cast<uint8_t>(text[pos + have]))) {
    ++have;
  }
  complete = have == need;
  return have;
}

}  // namespace

size_t decode_utf8(std::string_view text, size_t pos, char32_t& code_point) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  bool complete = false;
  const size_t length = valid_prefix_length(text, pos, complete);
  if (!complete) return 0;
  char32_t cp = lead & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  code_point = cp;
  return length;
}

bool is_valid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t length = utf8_char_length(text, pos);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

void append_repaired_utf8(std::string& out, std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    // Copy the longest valid run in one go.
    size_t run_end = pos;
    while (run_end < bytes.size()) {
      if (static_cast<uint8_t>(bytes[run_end]) < 0x80) {
        ++run_end;
        continue;
      }
      bool complete = false;
      const size_t length = valid_prefix_length(bytes, run_end, complete);
      if (!complete) break;
      run_end += length;
    }
    out.append(bytes.substr(pos, run_end - pos));
    if (run_end >= bytes.size()) break;
    bool complete = false;
    const size_t invalid = valid_prefix_length(bytes, run_end, complete);
    out.append(kReplacementCharacter);
    pos = run_end + (invalid == 0 ? 1 : invalid);  // one U+FFFD per maximal subpart
  }
}

std::string repair_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_repaired_utf8(out, bytes);
  return out;
}

bool ends_with_incomplete_utf8(std::string_view bytes) {
  // An incomplete sequence is at most 3 bytes long: look at the last lead byte.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto byte = static_cast<uint8_t>(bytes[n - back]);
    if (is_continuation(byte)) continue;
    bool complete = false;
    const size_t length = valid_prefix_length(bytes, n - back, complete);
    return !complete && length == back && length >= 1 && sequence_length(byte) > back;
  }
  return false;
}

}  // namespace pagoda::tokenizer
