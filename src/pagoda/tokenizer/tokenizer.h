#pragma once
// Tokenizer: Hugging Face tokenizer.json (+ tokenizer_config.json, generation_config.json) loaded
// and run the way transformers 5's AutoTokenizer runs it, byte for byte: tokenizer.json as the
// `tokenizers` library runs it, except where the tokenizer_class named in tokenizer_config.json
// makes transformers rebuild parts of the pipeline (transformers_class.h: the Llama /
// sentencepiece classes' Metaspace pre-tokenizer, add_bos_token / add_eos_token). The literal
// `tokenizers` reading stays available (TokenizerFiles::follow_transformers_class = false).
//
// Pipeline of encode(text): added/special tokens are cut out of the raw text first (leftmost-
// longest, as HF's AddedVocabulary does), every other piece goes through the normalizer (NFC,
// Prepend, Replace, ...), the pre-tokenizer (Split regexes through PCRE2 JIT, ByteLevel,
// Metaspace, ...), the BPE model (byte-level or sentencepiece-style with byte_fallback), and
// finally the post-processor (BOS/EOS template) when add_special_tokens is true.
//
// Supported: BPE models as used by GPT-2, Llama 3, Qwen2/Qwen3 (byte-level) and Llama 2 /
// Mistral (metaspace + byte_fallback). Other model types (WordPiece, Unigram) and unknown
// normalizer / pre-tokenizer / decoder types make load() fail with UNIMPLEMENTED naming the
// field and type.
//
// Text is UTF-8 everywhere. encode() never fails: bytes of `text` that are not valid UTF-8 are
// replaced by U+FFFD first (HF cannot even receive such input). decode() always returns valid
// UTF-8: byte sequences that do not form UTF-8 become U+FFFD as HF does (errors="replace").
//
// Thread safety: a loaded Tokenizer is immutable; encode/decode/lookups may run concurrently
// from any number of threads (the internal BPE word cache is guarded).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::tokenizer {

using TokenId = int32_t;

// Where the tokenizer files come from. All but tokenizer_json may be empty.
struct TokenizerFiles {
  std::string tokenizer_json;           // contents of tokenizer.json (required)
  std::string tokenizer_config_json;    // contents of tokenizer_config.json (optional)
  std::string generation_config_json;   // contents of generation_config.json (optional)
  std::string source_name = "tokenizer.json";  // used in error messages (usually the path)
  // true: read the files as transformers 5's AutoTokenizer does (tokenizer_config.json's
  // tokenizer_class may rebuild the pipeline; see transformers_class.h). false: run
  // tokenizer.json literally, as the `tokenizers` library's Tokenizer.from_file does.
  bool follow_transformers_class = true;
};

struct EncodeOptions {
  bool add_special_tokens = true;  // apply the post-processor (BOS/EOS template)
};

class Tokenizer {
 public:
  // Loads <model_dir>/tokenizer.json, plus tokenizer_config.json and generation_config.json when
  // present. Errors name the file and the field: NOT_FOUND (no tokenizer.json), DATA_LOSS (bad
  // JSON / bad field), UNIMPLEMENTED (a model / normalizer / pre-tokenizer type pagoda lacks).
  static StatusOr<std::shared_ptr<const Tokenizer>> load(const std::filesystem::path& model_dir,
                                                         bool follow_transformers_class = true);
  // Same, from contents already in memory (tests, embedded models).
  static StatusOr<std::shared_ptr<const Tokenizer>> load_from_contents(const TokenizerFiles& files);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text -> ids, exactly as AutoTokenizer(text, add_special_tokens).input_ids (or, loaded
  // literally, tokenizers' Tokenizer.encode(text, add_special_tokens).ids).
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const;
  // Appends to `out` (reuses its capacity); same result as encode().
  void encode_into(std::string_view text, bool add_special_tokens, std::vector<TokenId>& out) const;

  // Ids -> text, exactly as AutoTokenizer.decode / Tokenizer.decode(ids, skip_special_tokens)
  // (transformers skips clean_up_tokenization_spaces for BPE models, so they agree). Ids outside
  // the vocabulary are skipped (HF does the same).
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  // Token string (as written in tokenizer.json, e.g. "Ġthe", "▁the", "<|im_end|>") <-> id.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(TokenId id) const;

  // Number of ids: max id (model vocab and added tokens) + 1.
  int32_t vocab_size() const;

  // True for added tokens marked "special": true (skipped by decode(skip_special_tokens)).
  bool is_special(TokenId id) const;

  // Special tokens. bos/eos come from tokenizer_config.json ("bos_token"/"eos_token", string or
  // {"content": ...}); eos_token_ids() also holds generation_config.json's "eos_token_id"
  // (a number or a list), which is what generation should stop on. Empty/nullopt when absent.
  std::optional<TokenId> bos_token_id() const;
  std::optional<TokenId> eos_token_id() const;      // tokenizer_config's eos_token
  std::vector<TokenId> eos_token_ids() const;       // union of the above and generation_config
  std::optional<TokenId> pad_token_id() const;
  std::optional<TokenId> unk_token_id() const;
  std::optional<std::string> bos_token() const;     // the token strings, for chat templates
  std::optional<std::string> eos_token() const;

  // tokenizer_config.json's "chat_template" when it is a string (else empty); rendering it is
  // pagoda::chat's job.
  const std::string& chat_template() const;

  // tokenizer_config.json's "tokenizer_class" ("" when absent) and whether loading rebuilt the
  // pipeline for it the way transformers does (false when loaded literally).
  const std::string& tokenizer_class() const;
  bool follows_transformers_rebuild() const;

  // The raw bytes that `id` stands for, before any decoder-level joining: for byte-level
  // vocabularies the decoded bytes of the token, for sentencepiece ones with "▁" -> " " and
  // "<0xAB>" -> the byte. Used by IncrementalDetokenizer; empty for unknown ids.
  std::string token_bytes(TokenId id) const;

  // True when the decoded text of `id` can still change once the following ids are known:
  // "<0xAB>" byte tokens under a ByteFallback decoder (HF turns a whole run of them into U+FFFD
  // per byte when the run is not valid UTF-8). IncrementalDetokenizer holds such runs back.
  bool decode_depends_on_next(TokenId id) const;

  struct Impl;

 private:
  static StatusOr<std::shared_ptr<const Tokenizer>> load_from_contents_checked(const TokenizerFiles& files);
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer for one sequence: feed ids one at a time as they are sampled and get back
// only text that is final. Guarantees:
//   - every string returned is valid UTF-8 and never ends in the middle of a character;
//   - the concatenation of everything returned by feed() and then flush() equals
//     tokenizer.decode(all ids, skip_special_tokens);
//   - bytes that never complete a character become U+FFFD (as HF decode with errors="replace");
//     they are held back only while a following token could still complete them;
//   - with sentencepiece byte_fallback vocabularies, a run of "<0xAB>" byte tokens is held until
//     a token that decode() keeps ends it (HF decodes the run as a whole: one bad byte turns the
//     entire run into U+FFFD per byte), so such text arrives one token late.
// Cost: each feed() decodes a small window of recent ids (O(window), not O(sequence)).
// Thread safety: one instance per sequence; not safe for concurrent use. The tokenizer must
// outlive it.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Returns the newly final text (possibly empty).
  std::string feed(TokenId id);
  // End of sequence: returns whatever is still held back (incomplete bytes -> U+FFFD).
  std::string flush();

  // All ids fed so far.
  const std::vector<TokenId>& ids() const { return ids_; }

 private:
  std::string decode_range(size_t begin, size_t end) const;

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<TokenId> ids_;
  size_t prefix_offset_ = 0;  // start of the decode window
  size_t read_offset_ = 0;    // ids before this are already emitted
  bool in_byte_run_ = false;  // the last visible id was a ByteFallback byte token
};

}  // namespace pagoda::tokenizer
