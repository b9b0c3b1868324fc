#include "pagoda/grammar/token_vocabulary.h"

#include <algorithm>
#include <numeric>

#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::grammar {

std::shared_ptr<const TokenVocabulary> TokenVocabulary::build(std::vector<std::string> token_bytes,
                                                              std::vector<int32_t> end_ids) {
  auto vocab = std::shared_ptr<TokenVocabulary>(new TokenVocabulary());
  vocab->token_bytes_ = std::move(token_bytes);
  vocab->end_ids_ = std::move(end_ids);
  std::sort(vocab->end_ids_.begin(), vocab->end_ids_.end());

  // Sort the non-empty tokens by bytes; consecutive tokens share their common prefix's nodes.
  std::vector<int32_t> order;
  for (size_t id = 0; id < vocab->token_bytes_.size(); ++id)
    if (!vocab->token_bytes_[id].empty() && !vocab->is_end(static_cast<int32_t>(id)))
      order.push_back(static_cast<int32_t>(id));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return vocab->token_bytes_[a] < vocab->token_bytes_[b] || (vocab->token_bytes_[a] == vocab->token_bytes_[b] && a < b);
  });

  std::vector<uint32_t> path;  // node index at each depth of the previous token
  std::vector<std::vector<int32_t>> tokens_at;  // per node, filled in preorder
  std::string_view previous;
  for (int32_t id : order) {
    const std::string_view bytes = vocab->token_bytes_[id];
    size_t common = 0;
    while (common < bytes.size() && common < previous.size() && bytes[common] == previous[common]) ++common;
    // Close the subtrees of the previous token's nodes below the common prefix.
    for (size_t d = path.size(); d > common; --d) vocab->subtree_end_[path[d - 1]] = static_cast<uint32_t>(vocab->node_byte_.size());
    path.resize(common);
    for (size_t d = common; d < bytes.size(); ++d) {
      path.push_back(static_cast<uint32_t>(vocab->node_byte_.size()));
      vocab->node_byte_.push_back(static_cast<uint8_t>(bytes[d]));
      vocab->node_depth_.push_back(static_cast<uint16_t>(std::min<size_t>(d + 1, UINT16_MAX)));
      vocab->subtree_end_.push_back(0);
      tokens_at.emplace_back();
      vocab->max_depth_ = std::max<uint16_t>(vocab->max_depth_, static_cast<uint16_t>(std::min<size_t>(d + 1, UINT16_MAX)));
    }
    tokens_at[path.back()].push_back(id);
    previous = bytes;
  }
  for (uint32_t node : path) vocab->subtree_end_[node] = static_cast<uint32_t>(vocab->node_byte_.size());
  vocab->node_token_begin_.reserve(tokens_at.size() + 1);
  vocab->node_token_begin_.push_back(0);
  for (const auto& ids : tokens_at) {
    vocab->node_token_ids_.insert(vocab->node_token_ids_.end(), ids.begin(), ids.end());
    vocab->node_token_begin_.push_back(static_cast<uint32_t>(vocab->node_token_ids_.size()));
  }
  return vocab;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const tokenizer::Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
  }
  return build(std::move(bytes), tokenizer.eos_token_ids());
}

bool TokenVocabulary::is_end(int32_t id) const {
  return std::binary_search(end_ids_.begin(), end_ids_.end(), id);
}

}  // namespace pagoda::grammar
