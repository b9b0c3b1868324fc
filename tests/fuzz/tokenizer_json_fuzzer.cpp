// tokenizer.json (tokenizer/tokenizer_json_reader.h and Tokenizer): any bytes
// as the file; a tokenizer that loads must encode and decode a fixed text.

#include <string>

#include "fuzz_target.h"
#include "pagoda/tokenizer/tokenizer.h"
#include "pagoda/tokenizer/tokenizer_json_reader.h"

namespace pagoda::fuzz {

int fuzz_tokenizer_json(const uint8_t* data, size_t size) {
  const std::string_view text = as_text(data, size);
  (void)tokenizer::read_tokenizer_json(text, "fuzz.json");
  tokenizer::TokenizerFiles files;
  files.tokenizer_json = std::string(text);
  auto tok = tokenizer::Tokenizer::load_from_contents(files);
  if (!tok.ok()) return 0;
  const std::vector<int32_t> ids = (*tok)->encode("Hello, world! 123 \xE4\xB8\xAD\xE6\x96\x87 <s>", true);
  for (int32_t id : ids)
    if (id < 0 || id >= (*tok)->vocab_size()) fail("encode returned an id outside the vocabulary");
  (void)(*tok)->decode(ids, false);
  return 0;
}

}  // namespace pagoda::fuzz

PAGODA_FUZZ_TARGET(fuzz_tokenizer_json)
