#pragma once
// The vocabulary as the grammar sees it, built once per tokenizer: the bytes each token adds to
// the output, a byte trie over them (for token masks: a walk shares the work of common
// prefixes and drops a whole subtree at its first impossible byte), and the ids that end
// generation.
//
// Special tokens (added tokens marked special, e.g. <|im_end|>) are not text: they are never in
// the trie; end-of-sequence ids are allowed exactly when the grammar is complete. Non-special
// added tokens count as their content.
//
// Trie layout: nodes in depth-first preorder, so a node's subtree is the index range
// [i, subtree_end[i]) and skipping it is one assignment.
//
// Thread safety: immutable after build(); share it freely.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::tokenizer {
class Tokenizer;
}

namespace pagoda::grammar {

class TokenVocabulary {
 public:
  // `token_bytes[id]`: the bytes of token id (empty for ids that never appear under a grammar);
  // `end_ids`: the tokens that end generation (allowed when the grammar is complete).
  static std::shared_ptr<const TokenVocabulary> build(std::vector<std::string> token_bytes,
                                                      std::vector<int32_t> end_ids);
  // From a loaded tokenizer: token_bytes() of every non-special id, end ids = eos_token_ids().
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const tokenizer::Tokenizer& tokenizer);

  int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }
  // Number of 64-bit words of a mask over this vocabulary.
  size_t mask_words() const { return (token_bytes_.size() + 63) / 64; }
  std::string_view bytes(int32_t id) const { return token_bytes_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  bool is_end(int32_t id) const;

  // Trie (preorder). Node i: its byte, its depth (1 for children of the root), the end of its
  // subtree, and the tokens whose bytes end exactly here.
  size_t num_nodes() const { return node_byte_.size(); }
  uint8_t node_byte(size_t i) const { return node_byte_[i]; }
  uint16_t node_depth(size_t i) const { return node_depth_[i]; }
  uint32_t subtree_end(size_t i) const { return subtree_end_[i]; }
  std::span<const int32_t> node_tokens(size_t i) const {
    return {node_token_ids_.data() + node_token_begin_[i], node_token_begin_[i + 1] - node_token_begin_[i]};
  }
  uint16_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> token_bytes_;
  std::vector<int32_t> end_ids_;
  std::vector<uint8_t> node_byte_;
  std::vector<uint16_t> node_depth_;
  std::vector<uint32_t> subtree_end_;
  std::vector<uint32_t> node_token_begin_;  // num_nodes + 1 entries
  std::vector<int32_t> node_token_ids_;
  uint16_t max_depth_ = 0;
};

}  // namespace pagoda::grammar
