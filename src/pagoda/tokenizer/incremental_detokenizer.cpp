// IncrementalDetokenizer (declared in tokenizer.h): the prefix/read-offset scheme of vLLM and
// TGI. The window [prefix_offset, end) is decoded and compared with the decode of
// [prefix_offset, read_offset): only the new tail is emitted, and only when it does not end in
// U+FFFD (a character still missing bytes). Decoding a window that starts one emitted token
// back keeps decoder effects that depend on the first token (Metaspace / Strip removing the
// leading space) identical to decoding the whole sequence. A run of ByteFallback byte tokens
// is held until a non-byte token ends it: HF decodes the run as a whole (all U+FFFD if any
// part is invalid), so its text is not final before.

#include "pagoda/tokenizer/tokenizer.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::decode_range(size_t begin, size_t end) const {
  return tokenizer_.decode(std::span<const TokenId>(ids_).subspan(begin, end - begin),
                           skip_special_tokens_);
}

std::string IncrementalDetokenizer::feed(TokenId id) {
  ids_.push_back(id);
  if (tokenizer_.decode_depends_on_next(id)) return {};
  const std::string prefix_text = decode_range(prefix_offset_, read_offset_);
  const std::string new_text = decode_range(prefix_offset_, ids_.size());
  if (new_text.size() <= prefix_text.size() || new_text.ends_with(kReplacementCharacter)) {
    return {};  // nothing new yet, or the last character is still incomplete
  }
  // The window text normally extends the prefix text; if a decoder rewrote earlier characters
  // (rare), emit from the first difference on what is still unemitted.
  std::string delta = new_text.substr(prefix_text.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return delta;
}

std::string IncrementalDetokenizer::flush() {
  if (read_offset_ >= ids_.size()) return {};
  const std::string prefix_text = decode_range(prefix_offset_, read_offset_);
  const std::string new_text = decode_range(prefix_offset_, ids_.size());
  prefix_offset_ = read_offset_ = ids_.size();
  if (new_text.size() <= prefix_text.size()) return {};
  return new_text.substr(prefix_text.size());
}

}  // namespace pagoda::tokenizer
