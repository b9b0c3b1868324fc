#pragma once
// The "pre_tokenizer" stage of tokenizer.json: cuts normalized text into the pieces ("words")
// that BPE runs on, without ever merging across a piece boundary.
//
// Supported types: Split (Regex or String pattern; behaviours Isolated, Removed,
// MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space,
// use_regex with GPT-2's pattern; the byte -> alphabet mapping itself happens in the BPE model,
// which works on raw bytes), Metaspace (replacement, prepend_scheme always/first/never, split),
// Whitespace, WhitespaceSplit, Digits, and Sequence.
//
// Pieces are handed to a callback as views that are valid only during the call (no allocation
// per piece on the common paths).
//
// Thread safety: immutable after from_json(); pre_tokenize() is const and reentrant.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/status.h"
#include "pagoda/tokenizer/pcre2_regex.h"

namespace pagoda::tokenizer {

// A non-owning callable taking one piece.
class PieceSink {
 public:
  template <typename F>
  PieceSink(F& f)  // NOLINT: implicit so lambdas pass directly
      : context_(&f), call_([](void* context, std::string_view piece) {
          (*static_cast<F*>(context))(piece);
        }) {}
  void operator()(std::string_view piece) const { call_(context_, piece); }

 private:
  void* context_;
  void (*call_)(void*, std::string_view);
};

class PreTokenizer {
 public:
  // `spec` is tokenizer.json's "pre_tokenizer" value (null: the whole text is one piece).
  static StatusOr<PreTokenizer> from_json(const nlohmann::json& spec, std::string_view where);

  // Cuts `text` into pieces and calls `sink` on each non-empty one, in order.
  // `at_text_start`: the text begins at offset 0 of the original input (Metaspace "first").
  void pre_tokenize(std::string_view text, bool at_text_start, PieceSink sink) const;

  // True when there is no pre-tokenizer: the model sees whole segments.
  bool is_identity() const { return steps_.empty(); }

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    Kind kind = Kind::kSplit;
    std::shared_ptr<const Pcre2Regex> regex;  // Split (and ByteLevel with use_regex)
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;   // ByteLevel
    std::string replacement;         // Metaspace
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
    bool split_on_replacement = true;  // Metaspace "split"
  };
  // One component (not a Sequence: for_each_component unrolls those).
  static Status add_step(const nlohmann::json& spec, std::string_view where, const std::string& type,
                         std::vector<Step>& steps);
  void run_step(size_t index, std::string_view piece, bool at_text_start, PieceSink sink) const;
  void run_split(size_t index, const Step& step, std::string_view piece, bool at_text_start,
                 PieceSink sink) const;

  std::vector<Step> steps_;
};

}  // namespace pagoda::tokenizer
