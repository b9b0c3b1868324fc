// Replays, in the normal build, every committed fuzz corpus input
// (tests/fuzz/corpus/<target>/) and every input that once crashed a target
// (tests/fuzz/regressions/<target>/) through the same target functions the
// libFuzzer binaries run. A target that fails on any of them fails here.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_target.h"

namespace pagoda::fuzz {

int fuzz_api_keys(const uint8_t*, size_t);
int fuzz_chat_template(const uint8_t*, size_t);
int fuzz_checkpoint_index(const uint8_t*, size_t);
int fuzz_http_request(const uint8_t*, size_t);
int fuzz_openai_request(const uint8_t*, size_t);
int fuzz_safetensors(const uint8_t*, size_t);
int fuzz_tokenizer_json(const uint8_t*, size_t);

[[noreturn]] void fail(const char* what) { throw std::runtime_error(what); }

namespace {

struct Target {
  const char* name;
  int (*run)(const uint8_t*, size_t);
};

const Target kTargets[] = {{"api_keys", fuzz_api_keys},           {"chat_template", fuzz_chat_template},
                           {"checkpoint_index", fuzz_checkpoint_index}, {"http_request", fuzz_http_request},
                           {"openai_request", fuzz_openai_request}, {"safetensors", fuzz_safetensors},
                           {"tokenizer_json", fuzz_tokenizer_json}};

class FuzzRegression : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzRegression, EveryCorpusAndCrashInputPasses) {
  const Target& target = GetParam();
  int replayed = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const auto dir = std::filesystem::path(PAGODA_SOURCE_DIR) / "tests/fuzz" / kind / target.name;
    if (!std::filesystem::exists(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (!entry.is_regular_file() || entry.path().filename() == "README.md") continue;
      std::ifstream in(entry.path(), std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      try {
        target.run(bytes.data(), bytes.size());
      } catch (const std::exception& e) {
        ADD_FAILURE() << target.name << " on " << entry.path() << ": " << e.what();
      }
      ++replayed;
    }
  }
  EXPECT_GT(replayed, 0) << "no corpus for " << target.name;
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzRegression, ::testing::ValuesIn(kTargets),
                         [](const ::testing::TestParamInfo<Target>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pagoda::fuzz
