#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocab, ranked merges, and the
// merge loop that turns one pre-tokenized piece into ids, as HF tokenizers' BPE does (lowest
// rank first, leftmost on ties; ignore_merges; byte_fallback; unk with fuse_unk).
//
// Byte-level vocabularies (GPT-2 / Llama 3 / Qwen, written in the byte-level alphabet) are
// converted to raw bytes at load, so words are raw UTF-8 bytes and the first symbols are bytes.
// Other vocabularies (Llama 2 / Mistral, "▁" for spaces) start from UTF-8 characters, with
// "<0xAB>" byte tokens for characters outside the vocab when byte_fallback is on.
//
// Speed: a word cache (words under 256 bytes, like HF's), an O(n) array merge loop for short
// words and a heap-based O(n log n) loop for long ones. For sentencepiece vocabularies where no
// token has "▁" after another character, a long segment is cut before each such "▁": merges
// can never cross those points, so the result is the same and the cache works per word.
//
// Thread safety: immutable after from_json() except for the internal cache, which is guarded;
// encode_word() may run concurrently.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/status.h"
#include "pagoda/tokenizer/flat_maps.h"

namespace pagoda::tokenizer {

// Token ids a tokenizer file may use are below this (real vocabularies hold
// under 300,000): tables are sized by the largest id, so one entry with a huge
// id must not allocate gigabytes.
inline constexpr int64_t kMaxTokenIds = int64_t{1} << 24;

class BpeModel {
 public:
  // `spec` is tokenizer.json's "model" without its vocab and merges, which come separately (as
  // streamed by read_tokenizer_json; merges in rank order). `byte_level` says whether the
  // vocabulary is written in the byte-level alphabet (decided from the pre-tokenizer / decoder).
  static StatusOr<std::unique_ptr<BpeModel>> from_json(
      const nlohmann::json& spec, const std::vector<std::pair<std::string, int64_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, bool byte_level,
      std::string_view where);
  ~BpeModel();

  // Appends the ids of one piece (raw UTF-8 bytes) to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // Token strings as written in tokenizer.json.
  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  const std::string* id_to_token(int32_t id) const;   // nullptr when absent
  // Max id + 1 over the model vocab.
  int32_t id_limit() const { return static_cast<int32_t>(tokens_.size()); }

  bool byte_level() const { return byte_level_; }
  void set_cache_enabled(bool enabled) { cache_enabled_ = enabled; }

 private:
  BpeModel() = default;
  void encode_chunk(std::string_view word, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge_short(std::vector<int32_t>& symbols) const;
  void merge_long(std::vector<int32_t>& symbols) const;

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  bool split_before_metaspace_ = false;

  std::vector<std::string> tokens_;  // by id, as in tokenizer.json ("" for holes)
  std::vector<bool> has_token_;
  StringMap token_ids_;              // token string -> id
  StringMap word_ids_;               // raw bytes -> id (byte-level only; else token_ids_)
  PairMap merges_;
  int32_t byte_ids_[256];            // first symbol per byte (byte-level) or <0xAB> token

  struct Cache;
  std::unique_ptr<Cache> cache_;
  bool cache_enabled_ = true;
};

}  // namespace pagoda::tokenizer
