// JSON Schema -> grammar: every sentence of the grammar is JSON that validates against the schema
// (random sentences over many schemas and seeds), the whole grammar is not empty where it must not
// be, and bad schemas are refused naming the schema path.

#include <gtest/gtest.h>

#include <fstream>

#include "grammar_test_util.h"
#include "pagoda/grammar/json_schema_to_grammar.h"
#include "pagoda/grammar/json_schema_validator.h"

namespace pagoda::grammar {
namespace {

using testing::matches;

nlohmann::ordered_json load(const char* name) {
  std::ifstream in(std::string(PAGODA_SOURCE_DIR) + "/tests/fixtures/grammar/" + name);
  return nlohmann::ordered_json::parse(in);
}

TEST(JsonSchemaToGrammarTest, RandomSentencesValidateOnEveryCorpusSchema) {
  const auto schemas = load("schemas.json");
  ASSERT_GE(schemas.size(), 20u);
  for (const auto& [name, schema] : schemas.items()) {
    auto grammar = json_schema_to_grammar(schema, "schema");
    ASSERT_TRUE(grammar.ok()) << name << ": " << grammar.status().to_string();
    int produced = 0;
    for (uint64_t seed = 0; seed < 30; ++seed) {
      auto text = testing::random_sentence(*grammar, seed * 7919 + 1, 3000, 0.5);
      if (!text) continue;
      ++produced;
      nlohmann::json value;
      try {
        value = nlohmann::json::parse(*text);
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << " seed " << seed << ": not JSON: " << *text << " (" << e.what() << ")";
        continue;
      }
      Status valid = validate_json_schema(value, nlohmann::json(schema));
      EXPECT_TRUE(valid.ok()) << name << " seed " << seed << ": " << *text << "\n" << valid.to_string();
    }
    EXPECT_GE(produced, 15) << name << ": random walks rarely finished";
  }
}

TEST(JsonSchemaToGrammarTest, PropertiesFollowTheSchemaOrderAndOptionalsMayBeSkipped) {
  auto schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"integer"},"m":{"type":"boolean"}},"required":["a"]})");
  auto g = json_schema_to_grammar(schema, "s");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_TRUE(matches(*g, R"({"z": 1, "a": 2, "m": true})"));
  EXPECT_TRUE(matches(*g, R"({"a":2})"));
  EXPECT_TRUE(matches(*g, "{\n  \"a\": 2,\n  \"m\": false\n}"));
  EXPECT_FALSE(matches(*g, R"({"a": 2, "z": 1})"));  // out of order
  EXPECT_FALSE(matches(*g, R"({"z": 1})"));          // "a" is required
  EXPECT_FALSE(matches(*g, R"({"a": 2,})"));
  EXPECT_FALSE(matches(*g, R"({"a": 2, "extra": 1})"));
}

TEST(JsonSchemaToGrammarTest, StringsNumbersAndArraysKeepTheirBounds) {
  auto g = json_schema_to_grammar(nlohmann::ordered_json::parse(
      R"({"type":"array","items":{"type":"string","minLength":1,"maxLength":2},"minItems":1,"maxItems":2})"), "s");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(matches(*g, R"(["a"])"));
  EXPECT_TRUE(matches(*g, R"(["\u00e9\n", "\u4e2d"])"));  // one escape counts as one character
  EXPECT_FALSE(matches(*g, R"([])"));
  EXPECT_FALSE(matches(*g, R"([""])"));
  EXPECT_FALSE(matches(*g, R"(["abc"])"));
  EXPECT_FALSE(matches(*g, R"(["a","b","c"])"));
  EXPECT_FALSE(matches(*g, R"(["\ud800"])"));  // no lone surrogate escapes
  auto n = json_schema_to_grammar(nlohmann::ordered_json::parse(R"({"type":"integer","minimum":0})"), "s");
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE(matches(*n, "0"));
  EXPECT_TRUE(matches(*n, "120"));
  EXPECT_FALSE(matches(*n, "-1"));
  EXPECT_FALSE(matches(*n, "01"));
  EXPECT_FALSE(matches(*n, "1.5"));
}

TEST(JsonSchemaToGrammarTest, BadSchemasNameThePath) {
  const auto cases = load("bad_schemas.json");
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    auto g = json_schema_to_grammar(c[0], "schema");
    ASSERT_FALSE(g.ok()) << c[0].dump();
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    const std::string expected_path = c[1].get<std::string>() + ":";
    EXPECT_EQ(g.status().message().rfind(expected_path, 0), 0u)
        << "wanted a message starting with " << expected_path << ", got " << g.status().message();
  }
}

TEST(JsonSchemaToGrammarTest, JsonObjectGrammarAcceptsObjectsOnly) {
  auto g = json_object_grammar();
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5e3, {"b": null}], "c": "\u00e9"})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
  for (uint64_t seed = 0; seed < 30; ++seed) {
    auto text = testing::random_sentence(g, seed, 6000, 0.5);
    if (!text) continue;
    EXPECT_NO_THROW((void)nlohmann::json::parse(*text)) << *text;
  }
}

}  // namespace
}  // namespace pagoda::grammar
