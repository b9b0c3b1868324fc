#include "pagoda/engine/text_decoder.h"

#include <fmt/format.h>

namespace pagoda::engine {
namespace {

class TokenIdTextDecoder final : public TextDecoder {
 public:
  std::string append(int32_t token) override { return fmt::format(" <{}>", token); }
  std::string finish() override { return {}; }
};

}  // namespace

std::unique_ptr<TextDecoder> make_token_id_text_decoder() { return std::make_unique<TokenIdTextDecoder>(); }

}  // namespace pagoda::engine
