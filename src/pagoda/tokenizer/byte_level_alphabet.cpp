#include "pagoda/tokenizer/byte_level_alphabet.h"

#include <array>

#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

struct Tables {
  std::array<char32_t, 256> char_of_byte{};
  std::array<int16_t, 512> byte_of_char{};  // every alphabet code point is below 0x144
};

// Printable Latin-1 bytes map to themselves; the rest get 256, 257, ... in byte order.
Tables make_tables() {
  Tables tables;
  tables.byte_of_char.fill(-1);
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
    tables.char_of_byte[b] = cp;
    tables.byte_of_char[cp] = static_cast<int16_t>(b);
  }
  return tables;
}

const Tables& tables() {
  static const Tables instance = make_tables();
  return instance;
}

}  // namespace

char32_t byte_level_char(uint8_t byte) { return tables().char_of_byte[byte]; }

int byte_level_byte(char32_t code_point) {
  return code_point < 512 ? tables().byte_of_char[code_point] : -1;
}

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t cp = 0;
    const size_t length = decode_utf8(token, pos, cp);
    if (length == 0) return std::nullopt;
    const int byte = byte_level_byte(cp);
    if (byte < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte));
    pos += length;
  }
  return bytes;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_level_char(static_cast<uint8_t>(c)));
  return out;
}

}  // namespace pagoda::tokenizer
