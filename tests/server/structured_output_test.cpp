// Structured outputs in the server: request fields -> StructuredOutputSpec (which field, which
// conflicts and unsupported values are 400s naming the field), and StructuredOutputCompiler's
// constraints on a real vocabulary (pagoda-tiny's tokenizer): the tool-call grammars of each
// syntax accept what the parsers read back, bad schemas name their path, compiled grammars are
// reused.

#include "pagoda/server/structured_output.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "pagoda/server/openai_request.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::server {
namespace {

using Json = nlohmann::ordered_json;

std::variant<OpenAiRequest, ApiError> parse_chat(const std::string& fields) {
  return parse_openai_request(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], )" + fields + "}",
                              Endpoint::kChatCompletions);
}

std::string param_of(const std::variant<OpenAiRequest, ApiError>& r) {
  const ApiError* e = std::get_if<ApiError>(&r);
  return e && e->param ? *e->param : "<no error>";
}

TEST(StructuredOutputRequestTest, ResponseFormatAndGuidedFieldsParse) {
  auto schema = parse_chat(R"("response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
      "schema": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}})");
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(schema)) << param_of(schema);
  const auto& spec = std::get<OpenAiRequest>(schema).structured;
  EXPECT_EQ(spec.kind, StructuredOutputSpec::Kind::kJsonSchema);
  EXPECT_EQ(spec.schema_path, "response_format.json_schema.schema");
  EXPECT_EQ(spec.schema["properties"].begin().key(), "b");  // the client's key order is kept
  auto object = parse_chat(R"("response_format": {"type": "json_object"})");
  EXPECT_EQ(std::get<OpenAiRequest>(object).structured.kind, StructuredOutputSpec::Kind::kJsonObject);
  auto text = parse_chat(R"("response_format": {"type": "text"})");
  EXPECT_EQ(std::get<OpenAiRequest>(text).structured.kind, StructuredOutputSpec::Kind::kNone);
  auto regex = parse_openai_request(R"({"model": "m", "prompt": "x", "guided_regex": "[0-9]+"})", Endpoint::kCompletions);
  EXPECT_EQ(std::get<OpenAiRequest>(regex).structured.kind, StructuredOutputSpec::Kind::kRegex);
  auto json_text = parse_chat(R"("guided_json": "{\"type\": \"boolean\"}")");
  EXPECT_EQ(std::get<OpenAiRequest>(json_text).structured.schema_path, "guided_json");
  auto choice = parse_chat(R"("guided_choice": ["a", "b"])");
  EXPECT_EQ(std::get<OpenAiRequest>(choice).structured.choices.size(), 2u);
}

TEST(StructuredOutputRequestTest, BadOrConflictingFieldsAre400sNamingTheField) {
  EXPECT_EQ(param_of(parse_chat(R"("response_format": {"type": "yaml"})")), "response_format.type");
  EXPECT_EQ(param_of(parse_chat(R"("response_format": {"type": "json_schema"})")), "response_format.json_schema");
  EXPECT_EQ(param_of(parse_chat(R"("response_format": {"type": "json_schema", "json_schema": {"schema": 3}})")),
            "response_format.json_schema.schema");
  EXPECT_EQ(param_of(parse_chat(R"("response_format": {"type": "json_object"}, "guided_regex": "a")")), "guided_regex");
  EXPECT_EQ(param_of(parse_chat(R"("guided_regex": "")")), "guided_regex");
  EXPECT_EQ(param_of(parse_chat(R"("guided_choice": [])")), "guided_choice");
  EXPECT_EQ(param_of(parse_chat(R"("functions": [{"name": "f"}])")), "functions");
  EXPECT_EQ(param_of(parse_chat(R"("guided_whitespace_pattern": " ")")), "guided_whitespace_pattern");
  EXPECT_EQ(param_of(parse_chat(R"("tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}})")), "tool_choice");
}

class StructuredOutputCompilerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = tokenizer::Tokenizer::load(std::string(PAGODA_SOURCE_DIR) + "/models/pagoda-tiny");
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = *tok;
    vocabulary_ = grammar::TokenVocabulary::from_tokenizer(*tokenizer_);
  }
  // Feeds `text` token by token; true when every token is allowed and the output may end there.
  static bool accepts(const std::shared_ptr<const engine::TokenConstraint>& prototype, const std::string& text) {
    auto c = prototype->clone();
    std::vector<uint64_t> mask(engine::allowed_words(vocabulary_->size()));
    for (int32_t id : tokenizer_->encode(text, false)) {
      std::fill(mask.begin(), mask.end(), 0);
      c->fill_allowed(mask);
      if (!((mask[id >> 6] >> (id & 63)) & 1) || !c->accept(id)) return false;
    }
    std::fill(mask.begin(), mask.end(), 0);
    c->fill_allowed(mask);
    const int32_t eos = *tokenizer_->eos_token_id();
    return (mask[eos >> 6] >> (eos & 63)) & 1;
  }
  static std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  static std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;
};
std::shared_ptr<const tokenizer::Tokenizer> StructuredOutputCompilerTest::tokenizer_;
std::shared_ptr<const grammar::TokenVocabulary> StructuredOutputCompilerTest::vocabulary_;

ChatPrompt tool_prompt(ToolChoice choice, bool parallel = true) {
  ChatPrompt chat;
  chat.tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "ping"}}])");
  chat.tool_choice = choice;
  chat.tool_choice_name = choice == ToolChoice::kNamed ? "get_weather" : "";
  chat.parallel_tool_calls = parallel;
  return chat;
}

TEST_F(StructuredOutputCompilerTest, ToolCallGrammarsMatchWhatEachParserReads) {
  StructuredOutputCompiler compiler(vocabulary_);
  struct Case {
    ToolCallSyntax syntax;
    std::string text;
  };
  const Case cases[] = {
      {ToolCallSyntax::kHermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
      {ToolCallSyntax::kNone, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                              "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"},
      {ToolCallSyntax::kLlama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"},
      {ToolCallSyntax::kMistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}, "
                                 "{\"name\": \"ping\", \"arguments\": {}}]"},
  };
  for (const Case& c : cases) {
    const ChatPrompt chat = tool_prompt(ToolChoice::kRequired);
    auto constraint = compiler.constraint_for({}, &chat, c.syntax);
    ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const engine::TokenConstraint>>(constraint));
    auto prototype = std::get<std::shared_ptr<const engine::TokenConstraint>>(constraint);
    EXPECT_TRUE(accepts(prototype, c.text)) << c.text;
    EXPECT_FALSE(accepts(prototype, "Sure! " + c.text));
    auto parsed = parse_tool_calls(c.text, StructuredOutputCompiler::forced_tool_syntax(c.syntax));
    ASSERT_TRUE(parsed.has_value()) << c.text;
    EXPECT_GE(parsed->calls.size(), 1u);
  }
  // Arguments must follow the schema; a named choice allows only that tool, once.
  const ChatPrompt named = tool_prompt(ToolChoice::kNamed);
  auto prototype = std::get<std::shared_ptr<const engine::TokenConstraint>>(
      compiler.constraint_for({}, &named, ToolCallSyntax::kHermes));
  EXPECT_TRUE(accepts(prototype, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}\n</tool_call>"));
  EXPECT_FALSE(accepts(prototype, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts(prototype, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3}}\n</tool_call>"));
  EXPECT_FALSE(accepts(prototype, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}\n</tool_call>\n"
                                  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Y\"}}\n</tool_call>"));
}

TEST_F(StructuredOutputCompilerTest, SchemasCompileOnceAndErrorsNameThePath) {
  StructuredOutputCompiler compiler(vocabulary_);
  StructuredOutputSpec spec;
  spec.kind = StructuredOutputSpec::Kind::kJsonSchema;
  spec.param = "response_format";
  spec.schema_path = "response_format.json_schema.schema";
  spec.schema = Json::parse(R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})");
  auto first = std::get<std::shared_ptr<const engine::TokenConstraint>>(compiler.constraint_for(spec, nullptr, ToolCallSyntax::kNone));
  EXPECT_TRUE(accepts(first, "{\"n\": 12}"));
  EXPECT_FALSE(accepts(first, "{\"n\": \"12\"}"));
  spec.schema = Json::parse(R"({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}})");
  auto bad = compiler.constraint_for(spec, nullptr, ToolCallSyntax::kNone);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "response_format.json_schema.schema");
  EXPECT_EQ(std::get<ApiError>(bad).message.rfind("response_format.json_schema.schema.properties.n.multipleOf:", 0), 0u)
      << std::get<ApiError>(bad).message;
  StructuredOutputSpec regex;
  regex.kind = StructuredOutputSpec::Kind::kRegex;
  regex.param = "guided_regex";
  regex.text = "(?=x)";
  auto bad_regex = compiler.constraint_for(regex, nullptr, ToolCallSyntax::kNone);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad_regex));
  EXPECT_EQ(std::get<ApiError>(bad_regex).param, "guided_regex");
  // A structured request and forced tools at once is refused.
  const ChatPrompt chat = tool_prompt(ToolChoice::kRequired);
  StructuredOutputSpec object;
  object.kind = StructuredOutputSpec::Kind::kJsonObject;
  object.param = "response_format";
  EXPECT_TRUE(std::holds_alternative<ApiError>(compiler.constraint_for(object, &chat, ToolCallSyntax::kHermes)));
}

StructuredOutputSpec enum_schema(int i) {
  StructuredOutputSpec spec;
  spec.kind = StructuredOutputSpec::Kind::kJsonSchema;
  spec.param = "response_format";
  spec.schema_path = "response_format.json_schema.schema";
  spec.schema = Json::parse(fmt::format(R"({{"type": "object", "properties": {{"k{0}": {{"enum": ["v{0}", "w{0}"]}},
      "n": {{"type": "integer"}}, "s": {{"type": "string"}}}}, "required": ["k{0}"]}})", i));
  return spec;
}

// Many distinct schemas: the cache drops the least recently used grammars to stay under its
// memory bound, counts them, and a constraint made earlier keeps working after its grammar left.
TEST_F(StructuredOutputCompilerTest, ManyDistinctSchemasStayUnderTheMemoryBound) {
  size_t one = 0;
  {
    StructuredOutputCompiler probe(vocabulary_);
    (void)probe.constraint_for(enum_schema(0), nullptr, ToolCallSyntax::kNone);
    one = static_cast<size_t>(probe.counters().bytes);
    ASSERT_GT(one, 0u);
  }
  StructuredOutputCompiler::Options options;
  options.max_grammars = 1000;
  options.max_memory_bytes = 4 * one;
  StructuredOutputCompiler compiler(vocabulary_, options);
  auto first = std::get<std::shared_ptr<const engine::TokenConstraint>>(
      compiler.constraint_for(enum_schema(0), nullptr, ToolCallSyntax::kNone));
  for (int i = 1; i < 40; ++i) {
    auto c = compiler.constraint_for(enum_schema(i), nullptr, ToolCallSyntax::kNone);
    ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const engine::TokenConstraint>>(c));
    EXPECT_TRUE(accepts(std::get<std::shared_ptr<const engine::TokenConstraint>>(c),
                        fmt::format("{{\"k{0}\": \"w{0}\", \"n\": 3}}", i)));
    const GrammarCacheCounters counters = compiler.counters();
    EXPECT_LE(static_cast<size_t>(counters.bytes), options.max_memory_bytes) << i;
  }
  const GrammarCacheCounters counters = compiler.counters();
  EXPECT_EQ(counters.compiled, 40);
  EXPECT_LT(counters.grammars, 40);
  EXPECT_GE(counters.grammars, 2);
  EXPECT_EQ(counters.evictions, 40 - counters.grammars);
  EXPECT_TRUE(accepts(first, "{\"k0\": \"v0\"}"));
  EXPECT_FALSE(accepts(first, "{\"k0\": \"v1\"}"));
  // A cached grammar comes back without a compile; an evicted one is compiled again.
  (void)compiler.constraint_for(enum_schema(39), nullptr, ToolCallSyntax::kNone);
  EXPECT_EQ(compiler.counters().compiled, 40);
  (void)compiler.constraint_for(enum_schema(0), nullptr, ToolCallSyntax::kNone);
  EXPECT_EQ(compiler.counters().compiled, 41);
}

// With an encoder, text the grammar forces is pending as the tokenizer's tokens of that text
// (less the last): the mask allows only the next of them, and with jump-forward the constraint
// hands them all to the engine.
TEST_F(StructuredOutputCompilerTest, ForcedTextIsWrittenInItsCanonicalTokens) {
  StructuredOutputSpec spec;
  spec.kind = StructuredOutputSpec::Kind::kJsonSchema;
  spec.param = "response_format";
  spec.schema_path = "response_format.json_schema.schema";
  spec.schema = Json::parse(R"({"type": "object", "properties": {"customer_account_number": {"type": "integer"}},
      "required": ["customer_account_number"], "additionalProperties": false})");
  const std::string key = "customer_account_number\"";
  for (bool jump_forward : {false, true}) {
    StructuredOutputCompiler::Options options;
    options.encode = [](std::string_view text) { return tokenizer_->encode(text, false); };
    options.jump_forward = jump_forward;
    StructuredOutputCompiler compiler(vocabulary_, options);
    auto c = std::get<std::shared_ptr<const engine::TokenConstraint>>(
        compiler.constraint_for(spec, nullptr, ToolCallSyntax::kNone))->clone();
    std::vector<uint64_t> mask(engine::allowed_words(vocabulary_->size()));
    std::vector<int32_t> forced;
    c->forced_tokens(forced);
    EXPECT_TRUE(forced.empty());  // "{" comes first, then a choice of whitespace or the key
    for (int32_t id : tokenizer_->encode("{\"", false)) ASSERT_TRUE(c->accept(id));
    std::vector<int32_t> canonical = tokenizer_->encode(key, false);
    ASSERT_GE(canonical.size(), 2u);
    const int32_t last = canonical.back();
    canonical.pop_back();
    c->forced_tokens(forced);
    EXPECT_EQ(forced, jump_forward ? canonical : std::vector<int32_t>{});
    for (int32_t id : canonical) {
      EXPECT_EQ(c->fill_allowed(mask), 1u);
      EXPECT_TRUE((mask[id >> 6] >> (id & 63)) & 1);
      ASSERT_TRUE(c->accept(id));
    }
    // The last piece of the key is the model's again (here one token fits: `"`), nothing pending.
    c->forced_tokens(forced);
    EXPECT_TRUE(forced.empty());
    std::fill(mask.begin(), mask.end(), 0);
    EXPECT_GE(c->fill_allowed(mask), 1u);
    EXPECT_TRUE((mask[last >> 6] >> (last & 63)) & 1);
  }
}

}  // namespace
}  // namespace pagoda::server
