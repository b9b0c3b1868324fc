#pragma once
// GPT-2's byte-level alphabet: every byte 0..255 is shown as one printable code point ("Ġ" for
// the space byte 0x20, "Ċ" for 0x0A, printable ASCII as itself). Byte-level BPE vocabularies
// (GPT-2, Llama 3, Qwen) are written in this alphabet in tokenizer.json; pagoda converts them
// to raw bytes once at load time and runs BPE on bytes.
//
// Thread safety: immutable tables.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pagoda::tokenizer {

// The code point that stands for `byte`.
char32_t byte_level_char(uint8_t byte);

// The byte a code point stands for, or -1 when it is not in the alphabet.
int byte_level_byte(char32_t code_point);

// "Ġthe" -> " the". nullopt when a character is outside the alphabet (or bad UTF-8).
std::optional<std::string> byte_level_to_bytes(std::string_view token);

// " the" -> "Ġthe".
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace pagoda::tokenizer
