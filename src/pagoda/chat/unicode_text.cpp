#include "pagoda/chat/unicode_text.h"

#include <utf8proc.h>

namespace pagoda::chat {

std::vector<size_t> code_point_offsets(std::string_view text) {
  std::vector<size_t> offsets;
  offsets.reserve(text.size() + 1);
  size_t offset = 0;
  while (offset < text.size()) {
    offsets.push_back(offset);
    size_t length = 1;
    decode_utf8_at(text, offset, &length);
    offset += length;
  }
  offsets.push_back(text.size());
  return offsets;
}

size_t code_point_count(std::string_view text) {
  size_t count = 0;
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 1;
    if (static_cast<unsigned char>(text[offset]) >= 0x80) decode_utf8_at(text, offset, &length);
    offset += length;
    ++count;
  }
  return count;
}

bool is_python_whitespace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

namespace {

// Strips code points matching `strip_this` from either end.
template <typename Predicate>
std::string strip_if(std::string_view text, bool left, bool right, Predicate strip_this) {
  size_t begin = 0;
  size_t end = text.size();
  if (left) {
    while (begin < end) {
      size_t length = 1;
      const char32_t c = decode_utf8_at(text, begin, &length);
      if (!strip_this(c)) break;
      begin += length;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;  // walk back to the lead byte of the last code point
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80 &&
             end - start < 4) {
        --start;
      }
      size_t length = 1;
      char32_t c = decode_utf8_at(text, start, &length);
      if (start + length != end) {  // not a clean code point: treat the last byte alone
        start = end - 1;
        c = 0xFFFD;
      }
      if (!strip_this(c)) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

template <typename Map>
std::string map_code_points(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 1;
    const char32_t c = decode_utf8_at(text, offset, &length);
    if (c == 0xFFFD && length == 1 && static_cast<unsigned char>(text[offset]) >= 0x80) {
      out.push_back(text[offset]);  // keep invalid bytes as they are
    } else {
      append_utf8(out, map(c));
    }
    offset += length;
  }
  return out;
}

bool is_cased(char32_t c) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL ||
         category == UTF8PROC_CATEGORY_LT;
}

}  // namespace

std::string python_strip(std::string_view text, bool left, bool right) {
  return strip_if(text, left, right, is_python_whitespace);
}

std::string python_strip_chars(std::string_view text, std::string_view chars, bool left,
                               bool right) {
  std::vector<char32_t> set;
  size_t offset = 0;
  while (offset < chars.size()) {
    size_t length = 1;
    set.push_back(decode_utf8_at(chars, offset, &length));
    offset += length;
  }
  return strip_if(text, left, right, [&](char32_t c) {
    for (char32_t s : set) {
      if (s == c) return true;
    }
    return false;
  });
}

std::vector<std::string> python_split_whitespace(std::string_view text, int64_t max_split) {
  std::vector<std::string> parts;
  size_t offset = 0;
  const auto skip_space = [&] {
    while (offset < text.size()) {
      size_t length = 1;
      if (!is_python_whitespace(decode_utf8_at(text, offset, &length))) break;
      offset += length;
    }
  };
  skip_space();
  while (offset < text.size()) {
    if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
      // the rest, with trailing whitespace stripped, is the last part
      parts.push_back(python_strip(text.substr(offset), false, true));
      return parts;
    }
    const size_t start = offset;
    while (offset < text.size()) {
      size_t length = 1;
      if (is_python_whitespace(decode_utf8_at(text, offset, &length))) break;
      offset += length;
    }
    parts.emplace_back(text.substr(start, offset - start));
    skip_space();
  }
  return parts;
}

std::vector<std::string> python_split(std::string_view text, std::string_view separator,
                                      int64_t max_split) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
    const size_t found = text.find(separator, start);
    if (found == std::string_view::npos) break;
    parts.emplace_back(text.substr(start, found - start));
    start = found + separator.size();
  }
  parts.emplace_back(text.substr(start));
  return parts;
}

std::vector<std::string> python_rsplit(std::string_view text, std::string_view separator,
                                       int64_t max_split) {
  std::vector<std::string> reversed;
  size_t end = text.size();
  while (max_split < 0 || static_cast<int64_t>(reversed.size()) < max_split) {
    if (end < separator.size()) break;
    const size_t found = text.rfind(separator, end - separator.size());
    if (found == std::string_view::npos) break;
    reversed.emplace_back(text.substr(found + separator.size(), end - found - separator.size()));
    end = found;
  }
  reversed.emplace_back(text.substr(0, end));
  return {reversed.rbegin(), reversed.rend()};
}

std::string python_upper(std::string_view text) {
  return map_code_points(text, [](char32_t c) {
    return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
  });
}

std::string python_lower(std::string_view text) {
  return map_code_points(text, [](char32_t c) {
    return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  });
}

std::string python_title(std::string_view text) {
  bool previous_is_cased = false;
  return map_code_points(text, [&](char32_t c) {
    const auto code = static_cast<utf8proc_int32_t>(c);
    const char32_t mapped = static_cast<char32_t>(previous_is_cased ? utf8proc_tolower(code)
                                                                    : utf8proc_totitle(code));
    previous_is_cased = is_cased(c);
    return mapped;
  });
}

std::string python_capitalize(std::string_view text) {
  bool first = true;
  return map_code_points(text, [&](char32_t c) {
    const auto code = static_cast<utf8proc_int32_t>(c);
    const char32_t mapped =
        static_cast<char32_t>(first ? utf8proc_totitle(code) : utf8proc_tolower(code));
    first = false;
    return mapped;
  });
}

bool python_is_alpha(char32_t c) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return category >= UTF8PROC_CATEGORY_LU && category <= UTF8PROC_CATEGORY_LO;
}

bool python_is_digit(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
}

}  // namespace pagoda::chat
