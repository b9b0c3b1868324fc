#include "pagoda/server/structured_output.h"

#include <fmt/format.h>

#include "pagoda/grammar/gbnf_parser.h"
#include "pagoda/grammar/json_schema_to_grammar.h"
#include "pagoda/grammar/regex_to_grammar.h"
#include "pagoda/server/chat_prompt.h"

namespace pagoda::server {
namespace {

using Json = nlohmann::ordered_json;

// Most text one jump-forward looks at (a fixed key and its punctuation fit easily).
constexpr size_t kMaxForcedBytes = 256;

using Encoder = std::function<std::vector<int32_t>(std::string_view)>;

// `text` without a trailing incomplete UTF-8 sequence (the tokenizer encodes whole characters).
std::string_view whole_characters(std::string_view text) {
  size_t end = text.size();
  size_t start = end;
  while (start > 0 && end - start < 4 && (static_cast<uint8_t>(text[start - 1]) & 0xC0) == 0x80) --start;
  if (start == 0) return text.substr(0, end);
  const uint8_t lead = static_cast<uint8_t>(text[start - 1]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return end - (start - 1) < need ? text.substr(0, start - 1) : text;
}

// A grammar matcher as the engine's per-choice constraint.
//
// With an encoder, text the grammar forces is written in its canonical tokens: the tokenizer's
// tokens of the forced text alone, less the last one (it may merge with the free text after
// it). While such tokens are pending the mask allows only the next of them, whether or not
// jump-forward hands them to the engine at once, so the output is the same token for token
// with jump-forward on or off (for greedy decoding; a sampled row draws differently).
class GrammarConstraint final : public engine::TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<grammar::CompiledGrammar> compiled, std::shared_ptr<const Encoder> encode,
                    bool jump_forward)
      : matcher_(std::move(compiled)), encode_(std::move(encode)), jump_forward_(jump_forward && encode_) {}
  size_t fill_allowed(std::span<uint64_t> allowed) override {
    refresh_pending();
    if (next_pending_ >= pending_.size()) return matcher_.fill_mask(allowed);
    std::fill(allowed.begin(), allowed.end(), 0);
    const int32_t id = pending_[next_pending_];
    allowed[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    return 1;
  }
  bool accept(int32_t token) override {
    if (!matcher_.accept(token)) return false;
    if (next_pending_ < pending_.size() && pending_[next_pending_] == token) {
      if (++next_pending_ == pending_.size()) pending_known_ = false;
    } else {
      pending_known_ = false;
    }
    return true;
  }
  std::unique_ptr<engine::TokenConstraint> clone() const override {
    return std::make_unique<GrammarConstraint>(*this);
  }
  void forced_tokens(std::vector<int32_t>& out) override {
    out.clear();
    if (!jump_forward_) return;
    refresh_pending();
    out.assign(pending_.begin() + static_cast<std::ptrdiff_t>(next_pending_), pending_.end());
  }

 private:
  // The canonical tokens of the text forced from the current state, once per forced run: a
  // run's tokens are not recomputed part-way (a shorter text could tokenize differently).
  void refresh_pending() {
    if (pending_known_ || !encode_) return;
    pending_known_ = true;
    pending_.clear();
    next_pending_ = 0;
    const std::string forced = matcher_.forced_text(kMaxForcedBytes);
    const std::string_view text = whole_characters(forced);
    // Text that starts inside a character (the last token ended part-way through one) is left
    // to the model: the tokenizer encodes whole characters.
    if (text.empty() || (static_cast<uint8_t>(text[0]) & 0xC0) == 0x80) return;
    std::vector<int32_t> ids = (*encode_)(text);
    if (!ids.empty()) ids.pop_back();
    // Only tokens that spell the forced text exactly, in order (a normalizer could write
    // something else).
    const grammar::TokenVocabulary& vocab = matcher_.compiled().vocabulary();
    size_t at = 0;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab.size()) break;
      const std::string_view bytes = vocab.bytes(id);
      if (bytes.empty() || text.substr(at, bytes.size()) != bytes) break;
      pending_.push_back(id);
      at += bytes.size();
    }
  }

  grammar::TokenMatcher matcher_;
  std::shared_ptr<const Encoder> encode_;  // null: no canonical tokens, no jump-forward
  bool jump_forward_;
  bool pending_known_ = false;
  std::vector<int32_t> pending_;
  size_t next_pending_ = 0;
};

// References inside a tool's parameters point at the parameters object; once it sits inside the
// call schema they must point there.
void rebase_refs(Json& schema, const std::string& prefix) {
  if (schema.is_object()) {
    for (auto& [key, value] : schema.items()) {
      if (key == "$ref" && value.is_string() && value.get<std::string>().starts_with("#")) {
        value = prefix + value.get<std::string>().substr(1);
      } else {
        rebase_refs(value, prefix);
      }
    }
  } else if (schema.is_array()) {
    for (auto& value : schema) rebase_refs(value, prefix);
  }
}

std::string json_pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string cache_key(const StructuredOutputSpec& spec) {
  std::string key = fmt::format("{}:{}", static_cast<int>(spec.kind),
                                spec.kind == StructuredOutputSpec::Kind::kJsonSchema ? spec.schema.dump() : spec.text);
  for (const std::string& c : spec.choices) key += "\x1F" + c;
  return key;
}

}  // namespace

StructuredOutputCompiler::StructuredOutputCompiler(std::shared_ptr<const grammar::TokenVocabulary> vocabulary,
                                                   Options options)
    : vocabulary_(std::move(vocabulary)), options_(std::move(options)) {
  if (options_.encode) encode_ = std::make_shared<const Encoder>(options_.encode);
  if (options_.warm_json_object) {
    warm_thread_ = std::thread([this] {
      StructuredOutputSpec spec;
      spec.kind = StructuredOutputSpec::Kind::kJsonObject;
      const std::string key = cache_key(spec);
      if (!cached(key)) (void)compile(key, grammar::json_object_grammar(), grammar::kStartupPrecompute);
    });
  }
}

StructuredOutputCompiler::~StructuredOutputCompiler() {
  if (warm_thread_.joinable()) warm_thread_.join();
}

GrammarCacheCounters StructuredOutputCompiler::counters() {
  std::lock_guard lock(mutex_);
  GrammarCacheCounters c;
  c.grammars = static_cast<int64_t>(lru_.size());
  for (const auto& [key, compiled] : lru_) c.bytes += static_cast<int64_t>(compiled->memory_bytes());
  c.compiled = compiled_count_;
  c.evictions = evictions_;
  return c;
}

ToolCallSyntax StructuredOutputCompiler::forced_tool_syntax(ToolCallSyntax template_syntax) {
  return template_syntax == ToolCallSyntax::kNone ? ToolCallSyntax::kHermes : template_syntax;
}

StructuredOutputCompiler::GrammarOrError StructuredOutputCompiler::build_grammar(
    const StructuredOutputSpec& spec) const {
  StatusOr<std::shared_ptr<const grammar::Grammar>> g = internal_error("no grammar");
  std::string param = spec.param;
  switch (spec.kind) {
    case StructuredOutputSpec::Kind::kNone:
      return invalid_request("no structured output was asked for", spec.param);
    case StructuredOutputSpec::Kind::kJsonObject:
      return grammar::json_object_grammar();
    case StructuredOutputSpec::Kind::kJsonSchema:
      g = grammar::json_schema_to_grammar(spec.schema, spec.schema_path);
      param = spec.schema_path;
      break;
    case StructuredOutputSpec::Kind::kRegex:
      g = grammar::regex_to_grammar(spec.text);
      break;
    case StructuredOutputSpec::Kind::kGrammar:
      g = grammar::parse_gbnf(spec.text);
      break;
    case StructuredOutputSpec::Kind::kChoice: {
      std::vector<grammar::ExprPtr> options;
      for (const std::string& choice : spec.choices) options.push_back(grammar::make_literal(choice));
      std::map<std::string, grammar::ExprPtr> rules{{"root", grammar::make_alternatives(std::move(options))}};
      g = grammar::lower_grammar(rules, "root");
      break;
    }
  }
  if (!g.ok()) {
    const std::string message = g.status().message();
    return invalid_request(message.starts_with(param) ? message : fmt::format("{}: {}", param, message), param,
                           g.status().code() == StatusCode::kUnimplemented ? "unsupported" : "invalid_value");
  }
  return *g;
}

StructuredOutputCompiler::GrammarOrError StructuredOutputCompiler::build_tool_grammar(const ChatPrompt& chat,
                                                                                      ToolCallSyntax syntax) const {
  const bool llama3 = syntax == ToolCallSyntax::kLlama3Json;
  const char* args_key = llama3 ? "parameters" : "arguments";
  Json options = Json::array();
  for (size_t i = 0; i < chat.tools.size(); ++i) {
    const Json& function = chat.tools[i]["function"];
    const std::string name = function.value("name", std::string());
    if (chat.tool_choice == ToolChoice::kNamed && name != chat.tool_choice_name) continue;
    Json parameters = function.contains("parameters") && !function["parameters"].is_null() ? function["parameters"]
                                                                                             : Json{{"type", "object"}};
    const std::string where = fmt::format("tools[{}].function.parameters", i);
    // Checked on its own first, so an error names the tool's own path.
    if (auto alone = grammar::json_schema_to_grammar(parameters, where); !alone.ok()) {
      return invalid_request(alone.status().message(), where,
                             alone.status().code() == StatusCode::kUnimplemented ? "unsupported" : "invalid_value");
    }
    const size_t branch = options.size();
    rebase_refs(parameters, fmt::format("#/anyOf/{}/properties/{}", branch, json_pointer_token(args_key)));
    Json call = {{"type", "object"},
                 {"properties", {{"name", {{"const", name}}}, {args_key, parameters}}},
                 {"required", {"name", args_key}},
                 {"additionalProperties", false}};
    options.push_back(std::move(call));
  }
  if (options.empty()) return invalid_request("tool_choice matches no tool", "tool_choice");
  const Json schema = {{"anyOf", options}};
  grammar::JsonFraming framing;
  // Several calls when allowed, a bounded number so a generation always ends.
  const uint32_t most = chat.tool_choice == ToolChoice::kRequired && chat.parallel_tool_calls ? 8 : 1;
  framing.max_items = most;
  switch (syntax) {
    case ToolCallSyntax::kHermes:
    case ToolCallSyntax::kNone:
      framing.item_prefix = "<tool_call>\n";
      framing.item_suffix = "\n</tool_call>";
      framing.separator = "\n";
      break;
    case ToolCallSyntax::kLlama3Json:
      framing.separator = "; ";
      break;
    case ToolCallSyntax::kMistral:
      framing.open = "[TOOL_CALLS][";
      framing.close = "]";
      framing.separator = ", ";
      break;
  }
  auto g = grammar::framed_json_schema_grammar(schema, "tools", framing);
  if (!g.ok()) return invalid_request(g.status().message(), "tools");
  return *g;
}

std::shared_ptr<grammar::CompiledGrammar> StructuredOutputCompiler::cached(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  std::shared_ptr<grammar::CompiledGrammar> compiled = it->second->second;
  // Cached grammars grow as requests use them: the bound is checked on every use too.
  evict_locked();
  return compiled;
}

void StructuredOutputCompiler::remember(const std::string& key, std::shared_ptr<grammar::CompiledGrammar> compiled) {
  std::lock_guard lock(mutex_);
  ++compiled_count_;
  if (!index_.contains(key)) {
    lru_.emplace_front(key, std::move(compiled));
    index_[key] = lru_.begin();
  }
  evict_locked();
}

void StructuredOutputCompiler::evict_locked() {
  // The newest grammar stays even when it alone is over the memory bound: the request that
  // asked for it runs with it either way.
  while (lru_.size() > 1 && lru_.size() > std::max<size_t>(1, options_.max_grammars)) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++evictions_;
  }
  size_t total = 0;
  for (const auto& [key, compiled] : lru_) total += compiled->memory_bytes();
  while (lru_.size() > 1 && total > options_.max_memory_bytes) {
    total -= std::min(total, lru_.back().second->memory_bytes());
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++evictions_;
  }
}

std::shared_ptr<grammar::CompiledGrammar> StructuredOutputCompiler::compile(
    const std::string& key, std::shared_ptr<const grammar::Grammar> grammar, grammar::PrecomputeBudget budget) {
  auto compiled = std::make_shared<grammar::CompiledGrammar>(std::move(grammar), vocabulary_);
  // The windows of the states a generation is likely to meet (breadth first from the start,
  // bounded) and the first mask are made here, on the request's thread, so that the engine
  // steps compose masks from windows instead of walking the vocabulary trie.
  // The budget spent on the HTTP thread once per grammar (compiled grammars are cached): every
  // reachable state of a small schema, a bounded part of an unbounded one.
  (void)compiled->precompute(budget.states, budget.seconds);
  grammar::TokenMatcher first(compiled);
  std::vector<uint64_t> scratch(vocabulary_->mask_words());
  first.fill_mask(scratch);
  remember(key, compiled);
  return compiled;
}

std::variant<std::shared_ptr<const engine::TokenConstraint>, ApiError> StructuredOutputCompiler::constraint_for(
    const StructuredOutputSpec& spec, const ChatPrompt* chat, ToolCallSyntax syntax) {
  const bool forced_tools =
      chat != nullptr && (chat->tool_choice == ToolChoice::kRequired || chat->tool_choice == ToolChoice::kNamed);
  if (forced_tools && spec.kind != StructuredOutputSpec::Kind::kNone) {
    return invalid_request(fmt::format("'{}' cannot be combined with tool_choice \"required\" or a named function",
                                       spec.param),
                           spec.param);
  }
  if (!forced_tools && spec.kind == StructuredOutputSpec::Kind::kNone) {
    return std::shared_ptr<const engine::TokenConstraint>();
  }
  std::string key;
  if (forced_tools) {
    const ToolCallSyntax forced = forced_tool_syntax(syntax);
    key = fmt::format("tools:{}:{}:{}:{}:{}", static_cast<int>(forced), static_cast<int>(chat->tool_choice),
                      chat->tool_choice_name, chat->parallel_tool_calls, chat->tools.dump());
  } else {
    key = cache_key(spec);
  }
  std::shared_ptr<grammar::CompiledGrammar> compiled = cached(key);
  if (!compiled) {
    GrammarOrError built = forced_tools ? build_tool_grammar(*chat, forced_tool_syntax(syntax)) : build_grammar(spec);
    if (auto* error = std::get_if<ApiError>(&built)) return *error;
    compiled = compile(key, std::get<std::shared_ptr<const grammar::Grammar>>(built));
  }
  return std::shared_ptr<const engine::TokenConstraint>(std::make_shared<GrammarConstraint>(std::move(compiled), encode_, options_.jump_forward));
}

}  // namespace pagoda::server
