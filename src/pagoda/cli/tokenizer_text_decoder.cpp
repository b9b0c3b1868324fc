#include "pagoda/cli/tokenizer_text_decoder.h"

#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {
namespace {

class TokenizerTextDecoder final : public engine::TextDecoder {
 public:
  TokenizerTextDecoder(std::shared_ptr<const tokenizer::Tokenizer> tok, bool skip_special_tokens)
      : tok_(std::move(tok)), detok_(*tok_, skip_special_tokens) {}
  std::string append(int32_t token) override { return detok_.feed(token); }
  std::string finish() override { return detok_.flush(); }

 private:
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  tokenizer::IncrementalDetokenizer detok_;
};

}  // namespace

engine::TextDecoderFactory make_tokenizer_text_decoder_factory(std::shared_ptr<const tokenizer::Tokenizer> tok) {
  return [tok](std::span<const int32_t>, bool skip_special_tokens) {
    return std::make_unique<TokenizerTextDecoder>(tok, skip_special_tokens);
  };
}

}  // namespace pagoda::cli
