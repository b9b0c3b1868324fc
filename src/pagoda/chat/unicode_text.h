#pragma once
// Python-str semantics over UTF-8 bytes, for the template engine: Python indexes, slices and
// measures strings in code points and strips Unicode whitespace (str.isspace), so a template
// that does `content[-1]` or `text.strip()` must see the same thing here.
//
// Invalid UTF-8 is never rejected: each bad byte counts as one code point (U+FFFD-like) and is
// copied through unchanged, so rendering never loses or invents bytes.
//
// Thread safety: pure functions.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/utf8.h"

namespace pagoda::chat {

// One code point at a time (core/utf8.h; an invalid byte decodes to 0xFFFD, length 1).
using pagoda::append_utf8;
using pagoda::decode_utf8_at;

// Byte offsets of every code point start, plus text.size() at the end (size = count + 1).
std::vector<size_t> code_point_offsets(std::string_view text);
size_t code_point_count(std::string_view text);

// Python's str.isspace() for one code point.
bool is_python_whitespace(char32_t code_point);

// str.strip()/lstrip()/rstrip(): with no chars, Unicode whitespace; else any code point in chars.
std::string python_strip(std::string_view text, bool left, bool right);
std::string python_strip_chars(std::string_view text, std::string_view chars, bool left, bool right);

// str.split() with no separator: runs of whitespace, no empty strings; max_split < 0: no limit.
std::vector<std::string> python_split_whitespace(std::string_view text, int64_t max_split);
// str.split(sep)/rsplit(sep) with a non-empty separator.
std::vector<std::string> python_split(std::string_view text, std::string_view separator,
                                      int64_t max_split);
std::vector<std::string> python_rsplit(std::string_view text, std::string_view separator,
                                       int64_t max_split);

// str.upper()/lower()/title()/capitalize()/swapcase() through utf8proc's simple case maps
// (Python uses full mappings; they differ only for a few letters such as 'ß').
std::string python_upper(std::string_view text);
std::string python_lower(std::string_view text);
std::string python_title(std::string_view text);
std::string python_capitalize(std::string_view text);

bool python_is_alpha(char32_t code_point);
bool python_is_digit(char32_t code_point);

}  // namespace pagoda::chat
