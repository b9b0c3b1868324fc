#pragma once
// PromptHasher: a request's prompt as a backend's prefix cache keys it, so the
// router can look the prompt up in each backend's PrefixIndex.
//
// The router tokenizes for itself, exactly as `pagoda serve` does: the same
// request parser (server/openai_request.h), the same chat template rendering
// (server/chat_prompt.h) and tokenizer, loaded from the same model directory
// (`pagoda route --model DIR`). Chat prompts are rendered and encoded without
// added special tokens (templates write their own BOS); completion text is
// encoded with them; token-id prompts are taken as they are. A body the
// parser refuses has no prompt here: the router forwards it anyway (the
// backend answers the error) and routes it by load.
//
// block_keys() then chains the blocks as the KV manager does
// (kv::chain_block_hash from the namespace's seed, kv/prefix_cache.h), over
// the blocks a match can use: (prompt length - 1) / block_size of them, since
// the last prompt token is always computed.
//
// Thread safety: const methods may be called concurrently.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/chat/chat_template.h"
#include "pagoda/core/status.h"
#include "pagoda/server/chat_prompt.h"
#include "pagoda/server/openai_request.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::router {

class PromptHasher {
 public:
  // Loads tokenizer.json and the chat template (tokenizer_config.json or
  // chat_template.jinja) of a model directory. A directory without
  // tokenizer.json can still hash token-id prompts; a missing chat template
  // leaves chat prompts unhashed. Errors name the file.
  static StatusOr<std::unique_ptr<PromptHasher>> load(const std::string& model_dir);
  // Token-id prompts only (no model directory).
  static std::unique_ptr<PromptHasher> token_ids_only();

  // The prompt's token ids, or an error saying why there are none (bad body,
  // no tokenizer or template for this kind of prompt).
  StatusOr<std::vector<int32_t>> prompt_tokens(std::string_view body, server::Endpoint endpoint) const;

  static std::vector<uint64_t> block_keys(uint64_t namespace_seed, std::span<const int32_t> tokens,
                                          int32_t block_size);

  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  bool has_chat_template() const { return static_cast<bool>(renderer_); }

 private:
  PromptHasher() = default;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  server::ChatRenderer renderer_;
};

}  // namespace pagoda::router
