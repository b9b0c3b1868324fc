#include "pagoda/core/utf8.h"

namespace pagoda {

char32_t decode_utf8_at(std::string_view text, size_t offset, size_t* length) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(offset);
  const size_t left = text.size() - offset;
  *length = 1;
  if (lead < 0x80) return lead;
  size_t need = 0;
  char32_t code_point = 0;
  if ((lead & 0xE0) == 0xC0) {
    need = 2;
    code_point = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    need = 3;
    code_point = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    need = 4;
    code_point = lead & 0x07;
  } else {
    return 0xFFFD;
  }
  if (left < need) return 0xFFFD;
  for (size_t i = 1; i < need; ++i) {
    if ((byte(offset + i) & 0xC0) != 0x80) return 0xFFFD;
    code_point = (code_point << 6) | (byte(offset + i) & 0x3F);
  }
  // overlong forms, surrogates and out-of-range values are invalid: one byte each
  static constexpr char32_t kMinimum[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (code_point < kMinimum[need] || code_point > 0x10FFFF ||
      (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    return 0xFFFD;
  }
  *length = need;
  return code_point;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace pagoda
