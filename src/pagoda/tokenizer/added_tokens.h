#pragma once
// Added tokens of tokenizer.json ("added_tokens"): special tokens like <|im_start|> and other
// added tokens like <think>. They are found in the text before anything else runs and never
// reach the normalizer or the BPE model, as in HF's AddedVocabulary:
//   - tokens with "normalized": false are matched in the raw text, the others in the normalized
//     text of each remaining piece;
//   - matching is leftmost-longest over all tokens;
//   - "lstrip"/"rstrip" make a match swallow the whitespace to its left/right; "single_word"
//     rejects a match glued to a word character.
//
// Thread safety: immutable after construction; split() is const and reentrant.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `tokens`: the added tokens of one kind (all normalized or all not normalized).
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  bool empty() const { return tokens_.empty(); }

  // One piece of text: either a stretch of plain text or a matched added token.
  struct Piece {
    size_t begin, end;   // byte range in the text (for a token, including stripped whitespace)
    int32_t token_id;    // -1 for plain text
  };
  // Cuts `text` into plain stretches and matched tokens, in order (empty stretches omitted).
  void split(std::string_view text, std::vector<Piece>& pieces) const;

 private:
  // Longest token matching at `pos` (index into tokens_), or -1.
  int longest_match_at(std::string_view text, size_t pos) const;
  bool accept(const AddedToken& token, std::string_view text, size_t begin, size_t end) const;

  std::vector<AddedToken> tokens_;
  // A byte trie over the token contents: node -> 256 children is too big, so each node keeps a
  // sorted edge list.
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token_index = -1;
  };
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace pagoda::tokenizer
