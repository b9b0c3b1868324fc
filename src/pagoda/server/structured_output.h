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
// Compiled grammars are kept by their text in a small LRU cache, so a schema that recurs costs
// nothing to compile and its token masks are already warm (token_matcher.h); a new grammar's
// windows (CompiledGrammar::precompute, at most 0.5 s) and first mask are computed on the
// calling (HTTP) thread, not in an engine step. Memory: each cached grammar holds at most
// max_cached_masks masks (vocabulary / 8 bytes each), max_tables transition tables (1 KiB
// each) and max_window_bytes of windows, see CompiledGrammar::Limits.
//
// Errors are ApiErrors naming the request field, with the path inside a schema, e.g.
// param "response_format.json_schema.schema" and message
// "response_format.json_schema.schema.properties.age.maximum: not supported ...".
//
// Thread safety: StructuredOutputCompiler is safe to call from every HTTP thread.

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/engine/token_constraint.h"
#include "pagoda/grammar/token_matcher.h"
#include "pagoda/server/api_error.h"
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
  explicit StructuredOutputCompiler(std::shared_ptr<const grammar::TokenVocabulary> vocabulary,
                                    size_t max_cached_grammars = 32);

  // The constraint for a request: from `spec`, or from the chat prompt's tool_choice when it is
  // "required" or names a function (written in `syntax`). nullptr when nothing is asked for.
  std::variant<std::shared_ptr<const engine::TokenConstraint>, ApiError> constraint_for(
      const StructuredOutputSpec& spec, const ChatPrompt* chat, ToolCallSyntax syntax);

  // The syntax tool calls are forced into: the template's, else Hermes blocks.
  static ToolCallSyntax forced_tool_syntax(ToolCallSyntax template_syntax);

  const grammar::TokenVocabulary& vocabulary() const { return *vocabulary_; }

 private:
  using GrammarOrError = std::variant<std::shared_ptr<const grammar::Grammar>, ApiError>;
  GrammarOrError build_grammar(const StructuredOutputSpec& spec) const;
  GrammarOrError build_tool_grammar(const ChatPrompt& chat, ToolCallSyntax syntax) const;
  std::shared_ptr<grammar::CompiledGrammar> cached(const std::string& key);
  void remember(const std::string& key, std::shared_ptr<grammar::CompiledGrammar> compiled);

  std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;
  const size_t max_cached_;
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<grammar::CompiledGrammar>>> lru_;  // newest first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace pagoda::server
