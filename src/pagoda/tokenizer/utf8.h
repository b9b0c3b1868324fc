#pragma once
// UTF-8 helpers shared by the tokenizer stages: strict decoding of one code point, encoding, and
// lossy repair that replaces every maximal invalid subsequence by one U+FFFD (the Unicode
// "substitution of maximal subparts" practice, as Rust's String::from_utf8_lossy and Python's
// bytes.decode(errors="replace") do).
//
// Thread safety: stateless functions.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pagoda/core/utf8.h"

namespace pagoda::tokenizer {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Decodes the code point starting at text[pos]. Returns its length in bytes (1..4) and sets
// `code_point`, or returns 0 when the bytes there are not valid UTF-8 (truncated, overlong,
// surrogate, above U+10FFFF).
size_t decode_utf8(std::string_view text, size_t pos, char32_t& code_point);

// Length of the valid UTF-8 sequence starting at text[pos], without the code point; 0 if invalid.
inline size_t utf8_char_length(std::string_view text, size_t pos) {
  char32_t ignored;
  return decode_utf8(text, pos, ignored);
}

using pagoda::append_utf8;  // core/utf8.h

bool is_valid_utf8(std::string_view text);

// `bytes` with each maximal invalid subsequence replaced by U+FFFD.
std::string repair_utf8(std::string_view bytes);

// Appends repair_utf8(bytes) to out.
void append_repaired_utf8(std::string& out, std::string_view bytes);

// True when `bytes` ends with a sequence that is a valid but incomplete prefix of a UTF-8
// character (more bytes could still complete it).
bool ends_with_incomplete_utf8(std::string_view bytes);

}  // namespace pagoda::tokenizer
