// Exact equality with Hugging Face (tests/fixtures/tokenizer/<name>.json, made on the GPU machine
// from the same tokenizer files by tools/make_tokenizer_fixtures.py): ids with and without
// special tokens, decode with and without skipping special tokens, decode of invalid / truncated
// UTF-8 byte tokens, special ids, and streaming == decode.
//
// Two references per case: `tokenizers` 0.23 running tokenizer.json literally (fields "ids",
// "ids_special", ...) and transformers 5's AutoTokenizer (the same, overridden by the case's
// "transformers" object where it differs). pagoda's default load must match AutoTokenizer; a
// literal load (follow_transformers_class = false) must match `tokenizers`. They differ only for
// the npm "llama2" file (tokenizer_class LlamaTokenizer, legacy: true), whose pipeline
// transformers rebuilds with a Metaspace pre-tokenizer: runs of spaces, leading spaces and text
// next to <s> / </s>.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include "pagoda/tokenizer/tokenizer.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

using Ids = std::vector<TokenId>;

const std::filesystem::path kSourceDir = PAGODA_SOURCE_DIR;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::string sha256_hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

struct Reference {
  nlohmann::json fixture;
  std::shared_ptr<const Tokenizer> tokenizer;  // as AutoTokenizer reads it (the default)
  std::shared_ptr<const Tokenizer> literal;    // tokenizer.json as `tokenizers` runs it
};

std::filesystem::path model_dir_of(const std::string& name) {
  if (name == "pagoda-tiny") return kSourceDir / "models/pagoda-tiny";
  return kSourceDir / ".cache/npm" / name / "package/models";
}

// The fixture's expectation under AutoTokenizer: its "transformers" override, else the field.
const nlohmann::json& auto_expected(const nlohmann::json& c, const char* field) {
  if (c.contains("transformers") && c["transformers"].contains(field)) return c["transformers"][field];
  return c[field];
}

// Loads the fixture and the tokenizer it was made from (once per process); fails the test when
// either is missing or the npm file is not the one the fixture was made from.
const Reference* reference(const std::string& name) {
  static std::map<std::string, Reference> cache;
  if (auto it = cache.find(name); it != cache.end()) return &it->second;
  const auto fixture_path = kSourceDir / "tests/fixtures/tokenizer" / (name + ".json");
  const auto model_dir = model_dir_of(name);
  if (!std::filesystem::exists(fixture_path)) {
    ADD_FAILURE() << fixture_path << " is missing (tools/make_tokenizer_fixtures.py makes it)";
    return nullptr;
  }
  if (!std::filesystem::exists(model_dir / "tokenizer.json")) {
    ADD_FAILURE() << model_dir << "/tokenizer.json is missing: run scripts/fetch-test-data.sh";
    return nullptr;
  }
  Reference ref;
  ref.fixture = nlohmann::json::parse(read_file(fixture_path));
  const std::string sha = sha256_hex(read_file(model_dir / "tokenizer.json"));
  if (sha != ref.fixture["tokenizer_json_sha256"].get<std::string>()) {
    ADD_FAILURE() << model_dir << "/tokenizer.json is not the file the fixture was made from "
                  << "(sha256 " << sha << "): re-run scripts/fetch-test-data.sh";
    return nullptr;
  }
  auto tok = Tokenizer::load(model_dir);
  auto literal = Tokenizer::load(model_dir, /*follow_transformers_class=*/false);
  if (!tok.ok() || !literal.ok()) {
    ADD_FAILURE() << tok.status().to_string() << " / " << literal.status().to_string();
    return nullptr;
  }
  ref.tokenizer = *tok;
  ref.literal = *literal;
  return &cache.emplace(name, std::move(ref)).first->second;
}

class HfFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixtureTest, EncodeMatchesAutoTokenizer) {
  const Reference* ref = reference(GetParam());
  ASSERT_TRUE(ref);
  size_t compared = 0;
  for (const auto& c : ref->fixture["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::string label = GetParam() + " / " + c["name"].get<std::string>();
    EXPECT_EQ(ref->tokenizer->encode(text, false), auto_expected(c, "ids").get<Ids>()) << label;
    EXPECT_EQ(ref->tokenizer->encode(text, true), auto_expected(c, "ids_special").get<Ids>()) << label;
    ++compared;
  }
  EXPECT_GE(compared, 70u);
}

TEST_P(HfFixtureTest, LiteralLoadMatchesTokenizersLibrary) {
  const Reference* ref = reference(GetParam());
  ASSERT_TRUE(ref);
  for (const auto& c : ref->fixture["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::string label = GetParam() + " / " + c["name"].get<std::string>();
    EXPECT_EQ(ref->literal->encode(text, false), c["ids"].get<Ids>()) << label;
    EXPECT_EQ(ref->literal->encode(text, true), c["ids_special"].get<Ids>()) << label;
    const Ids ids = c["ids_special"].get<Ids>();
    EXPECT_EQ(ref->literal->decode(ids, false), c["decode"].get<std::string>()) << label;
    EXPECT_EQ(ref->literal->decode(ids, true), c["decode_skip"].get<std::string>()) << label;
  }
}

TEST_P(HfFixtureTest, RebuildsThePipelineExactlyWhenTransformersDoes) {
  const Reference* ref = reference(GetParam());
  ASSERT_TRUE(ref);
  const auto& pipeline = ref->fixture["transformers_pipeline"];
  ASSERT_TRUE(pipeline.is_object());
  // transformers' class for the file: LlamaTokenizer rebuilds with Metaspace; the others run the
  // tokenizer.json pipeline (Qwen2Tokenizer's rebuilt one is identical to its file's).
  const bool metaspace = pipeline["pre_tokenizer"].is_object() &&
                         pipeline["pre_tokenizer"].value("type", "") == "Metaspace";
  EXPECT_EQ(ref->tokenizer->follows_transformers_rebuild(), metaspace) << GetParam();
  EXPECT_FALSE(ref->literal->follows_transformers_rebuild());
}

TEST_P(HfFixtureTest, DecodeMatchesExactly) {
  const Reference* ref = reference(GetParam());
  ASSERT_TRUE(ref);
  for (const auto& c : ref->fixture["cases"]) {
    const Ids ids = c["ids_special"].get<Ids>();
    const std::string label = GetParam() + " / " + c["name"].get<std::string>();
    EXPECT_EQ(ref->tokenizer->decode(ids, false), auto_expected(c, "decode").get<std::string>()) << label;
    EXPECT_EQ(ref->tokenizer->decode(ids, true), auto_expected(c, "decode_skip").get<std::string>())
        << label;
  }
}

TEST_P(HfFixtureTest, InvalidUtf8DecodesLikeHf) {
  const Reference* ref = reference(GetParam());
  ASSERT_TRUE(ref);
  size_t compared = 0;
  for (const auto& c : ref->fixture["byte_decode_cases"]) {
    if (!c.contains("ids")) continue;
    EXPECT_EQ(ref->tokenizer->decode(c["ids"].get<Ids>(), false), c["decode"].get<std::string>())
        << GetParam() << " / " << c["name"].get<std::string>();
    ++compared;
  }
  // pagoda-tiny's fixture carries no byte cases; the npm ones carry all ten.
  EXPECT_EQ(compared, ref->fixture["byte_decode_cases"].empty() ? 0u : 10u);
}

TEST_P(HfFixtureTest, StreamingMatchesHfDecode) {
  const Reference* ref = reference(GetParam());
  ASSERT_TRUE(ref);
  auto check = [&](const Ids& ids, const std::string& expected, bool skip, const std::string& label) {
    IncrementalDetokenizer stream(*ref->tokenizer, skip);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string chunk = stream.feed(id);
      EXPECT_TRUE(is_valid_utf8(chunk)) << label;
      streamed += chunk;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, expected) << label;
  };
  for (const auto& c : ref->fixture["cases"]) {
    const std::string label = GetParam() + " / " + c["name"].get<std::string>();
    check(c["ids_special"].get<Ids>(), auto_expected(c, "decode_skip").get<std::string>(), true, label);
    check(c["ids_special"].get<Ids>(), auto_expected(c, "decode").get<std::string>(), false, label);
  }
  for (const auto& c : ref->fixture["byte_decode_cases"]) {
    if (!c.contains("ids")) continue;
    check(c["ids"].get<Ids>(), c["decode"].get<std::string>(), false,
          GetParam() + " / bytes " + c["name"].get<std::string>());
  }
}

TEST_P(HfFixtureTest, SpecialIdsMatchTransformers) {
  const Reference* ref = reference(GetParam());
  ASSERT_TRUE(ref);
  const auto& special = ref->fixture["special"];
  auto expect_id = [&](const char* field, std::optional<TokenId> actual) {
    if (special[field].is_null()) {
      EXPECT_EQ(actual, std::nullopt) << GetParam() << " " << field;
    } else {
      EXPECT_EQ(actual, special[field].get<TokenId>()) << GetParam() << " " << field;
    }
  };
  expect_id("bos_token_id", ref->tokenizer->bos_token_id());
  expect_id("eos_token_id", ref->tokenizer->eos_token_id());
  expect_id("pad_token_id", ref->tokenizer->pad_token_id());
  expect_id("unk_token_id", ref->tokenizer->unk_token_id());
  for (TokenId id : special["all_special_ids"].get<Ids>()) {
    EXPECT_TRUE(ref->tokenizer->is_special(id)) << GetParam() << " id " << id;
  }
  EXPECT_EQ(ref->tokenizer->vocab_size(), ref->fixture["vocab_size_with_added"].get<int32_t>());
}

INSTANTIATE_TEST_SUITE_P(Npm, HfFixtureTest, ::testing::Values("qwen3", "llama3", "llama2", "pagoda-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace pagoda::tokenizer
