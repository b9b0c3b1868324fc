#include "pagoda/tokenizer/bpe_model.h"

#include <algorithm>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "pagoda/tokenizer/byte_level_alphabet.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

constexpr std::string_view kMetaspace = "\u2581";
constexpr size_t kMaxCachedWordBytes = 256;  // as HF: longer words are not cached
constexpr size_t kCacheCapacity = 10000;     // as HF: once full, nothing more is added
constexpr size_t kShortWordSymbols = 256;    // above this, the heap-based merge loop

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return hash_bytes(s); }
};

}  // namespace

struct BpeModel::Cache {
  std::shared_mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};

BpeModel::~BpeModel() = default;

StatusOr<std::unique_ptr<BpeModel>> BpeModel::from_json(
    const nlohmann::json& spec, const std::vector<std::pair<std::string, int64_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, bool byte_level,
    std::string_view where) {
  if (!spec.is_object()) return data_loss_error("{}: expected an object", where);
  const std::string type = spec.value("type", std::string("BPE"));
  if (type != "BPE") {
    return unimplemented_error("{}.type: model type \"{}\" is not supported (only BPE)", where, type);
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (spec.contains(field) && spec[field].is_string() && !spec[field].get<std::string>().empty()) {
      return unimplemented_error("{}.{}: non-empty values are not supported", where, field);
    }
  }
  if (spec.contains("dropout") && spec["dropout"].is_number() && spec["dropout"].get<double>() > 0) {
    return unimplemented_error("{}.dropout: BPE dropout is not supported", where);
  }

  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  model->byte_level_ = byte_level;
  model->byte_fallback_ = spec.value("byte_fallback", false);
  model->ignore_merges_ = spec.value("ignore_merges", false);
  model->fuse_unk_ = spec.value("fuse_unk", false);
  model->cache_ = std::make_unique<Cache>();

  // Vocab.
  size_t key_bytes = 0;
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id >= kMaxTokenIds) {
      return data_loss_error("{}.vocab[\"{}\"]: id {} is out of range [0, {})", where, token, id, kMaxTokenIds);
    }
    max_id = std::max(max_id, id);
    key_bytes += token.size();
  }
  model->tokens_.resize(static_cast<size_t>(max_id + 1));
  model->has_token_.assign(static_cast<size_t>(max_id + 1), false);
  model->token_ids_.reserve(vocab.size(), key_bytes);
  if (byte_level) model->word_ids_.reserve(vocab.size(), key_bytes);
  for (const auto& [token, id64] : vocab) {
    const auto id = static_cast<int32_t>(id64);
    model->tokens_[id] = token;
    model->has_token_[id] = true;
    model->token_ids_.insert(token, id);
    if (byte_level) {
      // Tokens outside the alphabet can never be produced from bytes; they stay decodable.
      if (auto bytes = byte_level_to_bytes(token)) model->word_ids_.insert(*bytes, id);
    }
  }

  // unk token.
  if (spec.contains("unk_token") && spec["unk_token"].is_string()) {
    const std::string unk = spec["unk_token"].get<std::string>();
    model->unk_id_ = model->token_ids_.find(unk);
    if (model->unk_id_ < 0) {
      return data_loss_error("{}.unk_token: \"{}\" is not in the vocab", where, unk);
    }
  }

  // First symbols per byte.
  for (int b = 0; b < 256; ++b) {
    if (byte_level) {
      std::string ch;
      append_utf8(ch, byte_level_char(static_cast<uint8_t>(b)));
      model->byte_ids_[b] = model->token_ids_.find(ch);
    } else {
      model->byte_ids_[b] = model->token_ids_.find(fmt::format("<0x{:02X}>", b));
    }
  }

  // Merges; rank = position.
  model->merges_.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    merged.assign(left).append(right);
    const int32_t left_id = model->token_ids_.find(left);
    const int32_t right_id = model->token_ids_.find(right);
    const int32_t merged_id = model->token_ids_.find(merged);
    if (left_id < 0 || right_id < 0 || merged_id < 0) {
      return data_loss_error("{}.merges[{}]: \"{}\" + \"{}\" uses a token missing from the vocab",
                             where, rank, left, right);
    }
    model->merges_.insert(left_id, right_id, {static_cast<int32_t>(rank), merged_id});
  }

  // Sentencepiece-style cut points (see header): valid when no token has "▁" right after
  // another character, "▁" itself is a token, and whole-word lookups are off.
  if (!byte_level && !model->ignore_merges_ && model->token_ids_.find(kMetaspace) >= 0) {
    bool safe = true;
    for (const std::string& token : model->tokens_) {
      for (size_t pos = token.find(kMetaspace, 1); pos != std::string::npos;
           pos = token.find(kMetaspace, pos + 1)) {
        if (pos < kMetaspace.size() || token.compare(pos - kMetaspace.size(), kMetaspace.size(),
                                                     kMetaspace) != 0) {
          safe = false;
          break;
        }
      }
      if (!safe) break;
    }
    model->split_before_metaspace_ = safe;
  }
  return model;
}

int32_t BpeModel::token_to_id(std::string_view token) const { return token_ids_.find(token); }

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size() || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (!split_before_metaspace_ || word.size() <= kMaxCachedWordBytes) {
    encode_chunk(word, out);
    return;
  }
  // Cut before every "▁" that follows a character other than "▁".
  size_t chunk_begin = 0;
  size_t pos = word.find(kMetaspace, 1);
  while (pos != std::string_view::npos) {
    const bool after_metaspace =
        pos >= kMetaspace.size() &&
        word.compare(pos - kMetaspace.size(), kMetaspace.size(), kMetaspace) == 0;
    if (!after_metaspace && pos > chunk_begin) {
      encode_chunk(word.substr(chunk_begin, pos - chunk_begin), out);
      chunk_begin = pos;
    }
    pos = word.find(kMetaspace, pos + kMetaspace.size());
  }
  encode_chunk(word.substr(chunk_begin), out);
}

void BpeModel::encode_chunk(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const StringMap& whole_words = byte_level_ ? word_ids_ : token_ids_;
  if (ignore_merges_) {
    const int32_t id = whole_words.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = cache_enabled_ && word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_->mutex);
    auto it = cache_->words.find(word);
    if (it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  initial_symbols(word, symbols);
  if (symbols.size() <= kShortWordSymbols) {
    merge_short(symbols);
  } else {
    merge_long(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::unique_lock lock(cache_->mutex);
    if (cache_->words.size() < kCacheCapacity) cache_->words.emplace(std::string(word), symbols);
  }
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  if (byte_level_) {
    for (char c : word) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        symbols.push_back(id);
      } else if (unk_id_ >= 0 && !(fuse_unk_ && !symbols.empty() && symbols.back() == unk_id_)) {
        symbols.push_back(unk_id_);
      }
    }
    return;
  }
  size_t pos = 0;
  while (pos < word.size()) {
    size_t length = utf8_char_length(word, pos);
    if (length == 0) length = 1;  // cannot happen for repaired input; keep going byte-wise
    const std::string_view ch = word.substr(pos, length);
    pos += length;
    const int32_t id = token_ids_.find(ch);
    if (id >= 0) {
      symbols.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (char c : ch) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        for (char c : ch) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      // fuse_unk: a run of unknown characters is one unk token.
      if (fuse_unk_ && !symbols.empty() && symbols.back() == unk_id_) continue;
      symbols.push_back(unk_id_);
    }
  }
}

// Keeps the rank of every adjacent pair; each merge looks up only the two new pairs.
void BpeModel::merge_short(std::vector<int32_t>& symbols) const {
  constexpr int32_t kNoMerge = 0x7fffffff;
  size_t n = symbols.size();
  if (n < 2) return;
  thread_local std::vector<MergeResult> pairs;
  pairs.resize(n - 1);
  for (size_t i = 0; i + 1 < n; ++i) {
    const MergeResult* merge = merges_.find(symbols[i], symbols[i + 1]);
    pairs[i] = merge ? *merge : MergeResult{kNoMerge, -1};
  }
  while (n > 1) {
    size_t best = 0;
    int32_t best_rank = pairs[0].rank;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (pairs[i].rank < best_rank) {
        best_rank = pairs[i].rank;
        best = i;
      }
    }
    if (best_rank == kNoMerge) break;
    symbols[best] = pairs[best].merged_id;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(best));
    --n;
    if (best > 0) {
      const MergeResult* merge = merges_.find(symbols[best - 1], symbols[best]);
      pairs[best - 1] = merge ? *merge : MergeResult{kNoMerge, -1};
    }
    if (best + 1 < n) {
      const MergeResult* merge = merges_.find(symbols[best], symbols[best + 1]);
      pairs[best] = merge ? *merge : MergeResult{kNoMerge, -1};
    }
  }
}

// HF's algorithm: a heap of candidate merges ordered by (rank, position), symbols in a linked
// list; stale heap entries are recognised and dropped.
void BpeModel::merge_long(std::vector<int32_t>& symbols) const {
  const size_t n = symbols.size();
  std::vector<int64_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
  }
  struct Candidate {
    int32_t rank;
    size_t pos;
    int32_t left_id, right_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](size_t pos) {
    if (next[pos] < 0) return;
    const int32_t right = symbols[static_cast<size_t>(next[pos])];
    if (const MergeResult* merge = merges_.find(symbols[pos], right)) {
      queue.push({merge->rank, pos, symbols[pos], right});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> removed(n, false);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (removed[top.pos] || next[top.pos] < 0) continue;
    const auto right = static_cast<size_t>(next[top.pos]);
    if (symbols[top.pos] != top.left_id || symbols[right] != top.right_id) continue;  // stale
    const MergeResult* merge = merges_.find(top.left_id, top.right_id);
    symbols[top.pos] = merge->merged_id;
    removed[right] = true;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<int64_t>(top.pos);
    if (prev[top.pos] >= 0) push(static_cast<size_t>(prev[top.pos]));
    push(top.pos);
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!removed[i]) symbols[out++] = symbols[i];
  }
  symbols.resize(out);
}

}  // namespace pagoda::tokenizer
