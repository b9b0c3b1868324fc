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
  if (tokenizer_.decode_depends_on_next(id)) {
    in_byte_run_ = true;
    return {};
  }
  // Ids that decode() drops (skipped specials, unknown ids) do not end a byte run: the bytes on
  // both sides of them are decoded as one run.
  const bool invisible = (skip_special_tokens_ && tokenizer_.is_special(id)) ||
                         !tokenizer_.id_to_token(id).has_value();
  if (invisible && in_byte_run_) return {};
  if (!invisible) in_byte_run_ = false;
  const std::string prefix_text = decode_range(prefix_offset_, read_offset_);
  const std::string new_text = decode_range(prefix_offset_, ids_.size());
  if (new_text.size() <= prefix_text.size() || new_text.ends_with(kReplacementCharacter)) {
    return {};  // nothing new yet, or the last character is still incomplete
  }
  // The window text extends the prefix text (the hold rules above make sure of it); should a
  // decoder ever rewrite earlier text, the delta is still repaired to valid UTF-8.
  std::string delta = new_text.substr(prefix_text.size());
  if (!new_text.starts_with(prefix_text)) delta = repair_utf8(delta);
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return delta;
}

std::string IncrementalDetokenizer::flush() {
  if (read_offset_ >= ids_.size()) return {};
  const std::string prefix_text = decode_range(prefix_offset_, read_offset_);
  const std::string new_text = decode_range(prefix_offset_, ids_.size());
  prefix_offset_ = read_offset_ = ids_.size();
  in_byte_run_ = false;
  if (new_text.size() <= prefix_text.size()) return {};
  return repair_utf8(new_text.substr(prefix_text.size()));
}

}  // namespace pagoda::tokenizer
