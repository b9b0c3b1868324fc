#pragma once
// Structured outputs for the OpenAI server: what a request asks for (StructuredOutputSpec, read by
// openai_request.cpp from response_format, tool_choice and the vLLM-style guided_* extensions)
// and the engine constraint that enforces it (StructuredOutputCompiler, one per served model).
//
//   response_format {"type": "json_object"}                         any JSON object
//   response_format {"type": "json_schema", "json_schema": {...}}   JSON valid for its "schema"
//   tool_choice "required" / {"type": "function", ...}              tool calls in the chat
//       template's syntax (Hermes blocks, Llama 3 JSON, Mistral [TOOL_CALLS]; Hermes when the
//       template has none), each call {"name": <a tool>, "arguments": <its parameters schema>};
//       "required" allows several calls unless parallel_tool_calls is false
//   guided_json, guided_regex, guided_grammar (GBNF), guided_choice   (vLLM extensions)
//
// Jump-forward (Options::encode set, Options::jump_forward): where the grammar allows exactly
// one continuation text (e.g. `"name": "` after `{` in an object whose first key is fixed), that
// text's canonical tokens -- the tokenizer's tokens of the text alone, less its last token,
// which may merge with the free text after it -- are the only ones the mask allows, one by one,
// and with jump-forward the engine appends them at once without a forward pass each. The
// output is then the same with jump-forward on or off (token for token, for greedy decoding).
//
// Compiled grammars are kept by their text in an LRU cache, so a schema that recurs costs
// nothing to compile and its token masks are already warm (token_matcher.h); a new grammar's
// windows (CompiledGrammar::precompute, at most 0.5 s) and first mask are computed on the
// calling (HTTP) thread, not in an engine step. With Options::warm_json_object the
// json_object grammar (the same for every request) is compiled that way on a background thread
// when the compiler is made (server start), so no request pays for it.
// Memory: each cached grammar holds at most max_cached_masks masks (vocabulary / 8 bytes
// each), max_tables transition tables and max_window_bytes of windows (CompiledGrammar::Limits);
// the cache as a whole keeps at most max_grammars grammars and max_memory_bytes
// (CompiledGrammar::memory_bytes, which grows as requests meet new states): past either, the
// least recently used grammars are dropped (a running request keeps its grammar until it ends).
//
// Errors are ApiErrors naming the request field, with the path inside a schema, e.g.
// param "response_format.json_schema.schema" and message
// "response_format.json_schema.schema.properties.age.maximum: not supported ...".
//
// Thread safety: StructuredOutputCompiler is safe to call from every HTTP thread.

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/engine/token_constraint.h"
#include "pagoda/grammar/token_matcher.h"
#include "pagoda/server/api_error.h"
#include "pagoda/server/prometheus_metrics.h"
#include "pagoda/server/tool_call_parser.h"

namespace pagoda::server {

struct ChatPrompt;

struct StructuredOutputSpec {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kGrammar, kChoice };
  Kind kind = Kind::kNone;
  nlohmann::ordered_json schema;     // kJsonSchema
  std::string text;                  // kRegex: pattern; kGrammar: GBNF
  std::vector<std::string> choices;  // kChoice
  std::string param;                 // the request field that asked, e.g. "response_format"
  std::string schema_path;           // kJsonSchema: where the schema sits, for error paths
};

class StructuredOutputCompiler {
 public:
  struct Options {
    size_t max_grammars = 32;
    size_t max_memory_bytes = size_t{256} << 20;
    bool warm_json_object = false;  // compile json_object on a background thread now
    // Text -> token ids without special tokens. Set: text a grammar forces is written in its
    // canonical tokens (the file comment); null: masks allow every token that fits.
    std::function<std::vector<int32_t>(std::string_view)> encode;
    // Those tokens are reported for the engine to append at once
    // (engine::TokenConstraint::forced_tokens); needs `encode`.
    bool jump_forward = true;
  };
  StructuredOutputCompiler(std::shared_ptr<const grammar::TokenVocabulary> vocabulary, Options options);
  explicit StructuredOutputCompiler(std::shared_ptr<const grammar::TokenVocabulary> vocabulary)
      : StructuredOutputCompiler(std::move(vocabulary), Options{}) {}
  ~StructuredOutputCompiler();
  StructuredOutputCompiler(const StructuredOutputCompiler&) = delete;
  StructuredOutputCompiler& operator=(const StructuredOutputCompiler&) = delete;

  // The constraint for a request: from `spec`, or from the chat prompt's tool_choice when it is
  // "required" or names a function (written in `syntax`). nullptr when nothing is asked for.
  std::variant<std::shared_ptr<const engine::TokenConstraint>, ApiError> constraint_for(
      const StructuredOutputSpec& spec, const ChatPrompt* chat, ToolCallSyntax syntax);

  // The syntax tool calls are forced into: the template's, else Hermes blocks.
  static ToolCallSyntax forced_tool_syntax(ToolCallSyntax template_syntax);

  const grammar::TokenVocabulary& vocabulary() const { return *vocabulary_; }
  GrammarCacheCounters counters();

 private:
  using GrammarOrError = std::variant<std::shared_ptr<const grammar::Grammar>, ApiError>;
  GrammarOrError build_grammar(const StructuredOutputSpec& spec) const;
  GrammarOrError build_tool_grammar(const ChatPrompt& chat, ToolCallSyntax syntax) const;
  std::shared_ptr<grammar::CompiledGrammar> cached(const std::string& key);
  // Compiles `grammar` (precompute within `budget` + first mask) and caches it under `key`.
  std::shared_ptr<grammar::CompiledGrammar> compile(const std::string& key,
                                                    std::shared_ptr<const grammar::Grammar> grammar,
                                                    grammar::PrecomputeBudget budget = grammar::kRequestPrecompute);
  void remember(const std::string& key, std::shared_ptr<grammar::CompiledGrammar> compiled);
  // Drops least recently used grammars past the limits; mutex_ held.
  void evict_locked();

  std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;
  const Options options_;
  std::mutex mutex_;
  int64_t compiled_count_ = 0;
  int64_t evictions_ = 0;
  std::thread warm_thread_;
  std::shared_ptr<const std::function<std::vector<int32_t>(std::string_view)>> encode_;  // shared by constraints
  std::list<std::pair<std::string, std::shared_ptr<grammar::CompiledGrammar>>> lru_;  // newest first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace pagoda::server
