#include "pagoda/tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

bool is_whitespace_at(std::string_view text, size_t pos, size_t& length) {
  char32_t cp = 0;
  length = decode_utf8(text, pos, cp);
  if (length == 0) return false;
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Word characters for single_word: ASCII alphanumerics, '_' and any non-ASCII letter byte run.
bool is_word_byte(char c) {
  const auto b = static_cast<uint8_t>(c);
  return b >= 0x80 || (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') ||
         b == '_';
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  nodes_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[static_cast<uint8_t>(content[0])] = true;
    int32_t node = 0;
    for (char c : content) {
      const auto byte = static_cast<uint8_t>(c);
      auto& children = nodes_[node].children;
      auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
      if (it != children.end() && it->first == byte) {
        node = it->second;
      } else {
        const auto child = static_cast<int32_t>(nodes_.size());
        children.insert(it, {byte, child});
        nodes_.emplace_back();
        node = child;
      }
    }
    if (nodes_[node].token_index < 0) nodes_[node].token_index = static_cast<int32_t>(t);
  }
}

bool AddedTokenMatcher::accept(const AddedToken& token, std::string_view text, size_t begin,
                               size_t end) const {
  if (!token.single_word) return true;
  const bool glued_left = begin > 0 && is_word_byte(text[begin - 1]) && is_word_byte(text[begin]);
  const bool glued_right = end < text.size() && is_word_byte(text[end]) && is_word_byte(text[end - 1]);
  return !glued_left && !glued_right;
}

int AddedTokenMatcher::longest_match_at(std::string_view text, size_t pos) const {
  int best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    const auto& children = nodes_[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
    if (it == children.end() || it->first != byte) break;
    node = it->second;
    const int32_t index = nodes_[node].token_index;
    if (index >= 0 && accept(tokens_[index], text, pos, i + 1)) best = index;
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Piece>& pieces) const {
  if (tokens_.empty()) {
    if (!text.empty()) pieces.push_back({0, text.size(), -1});
    return;
  }
  size_t plain_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // Skip quickly to the next byte that can start a token.
    while (pos < text.size() && !first_byte_[static_cast<uint8_t>(text[pos])]) ++pos;
    if (pos >= text.size()) break;
    const int index = longest_match_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t match_begin = pos;
    size_t match_end = pos + token.content.size();
    if (token.lstrip) {
      // Swallow whitespace to the left, but not into the previous token.
      while (match_begin > plain_begin) {
        size_t start = match_begin - 1;
        while (start > plain_begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
        size_t length = 0;
        if (!is_whitespace_at(text, start, length) || start + length != match_begin) break;
        match_begin = start;
      }
    }
    if (token.rstrip) {
      size_t length = 0;
      while (match_end < text.size() && is_whitespace_at(text, match_end, length)) match_end += length;
    }
    if (match_begin > plain_begin) pieces.push_back({plain_begin, match_begin, -1});
    pieces.push_back({match_begin, match_end, token.id});
    plain_begin = pos = match_end;
  }
  if (plain_begin < text.size()) pieces.push_back({plain_begin, text.size(), -1});
}

}  // namespace pagoda::tokenizer
