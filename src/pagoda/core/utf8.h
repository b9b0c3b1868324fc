#pragma once
// UTF-8 encoding and decoding of single code points, shared by the chat template engine
// (chat/unicode_text.h) and the grammar parsers (grammar/).
//
// Thread safety: pure functions.

#include <cstddef>
#include <string>
#include <string_view>

namespace pagoda {

// Decodes the code point starting at text[offset] (offset < text.size()); sets *length to its
// byte length. An invalid sequence (a stray continuation byte, a truncated sequence, an overlong
// form, a surrogate, a value above U+10FFFF) decodes as U+FFFD with *length 1, so a caller that
// must reject invalid input checks for a lead byte >= 0x80 with *length == 1.
char32_t decode_utf8_at(std::string_view text, size_t offset, size_t* length);
// Appends the UTF-8 bytes of `code_point` (<= U+10FFFF).
void append_utf8(std::string& out, char32_t code_point);

}  // namespace pagoda
