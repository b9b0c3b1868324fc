#include "pagoda/router/prompt_hasher.h"

#include <filesystem>
#include <variant>

#include "pagoda/kv/prefix_cache.h"

namespace pagoda::router {

StatusOr<std::unique_ptr<PromptHasher>> PromptHasher::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(model_dir)) return not_found_error("--model {}: not a directory", model_dir);
  std::unique_ptr<PromptHasher> out(new PromptHasher());
  if (!fs::exists(fs::path(model_dir) / "tokenizer.json")) return out;
  PAGODA_ASSIGN_OR_RETURN(out->tokenizer_, tokenizer::Tokenizer::load(model_dir));
  auto chat_template = chat::ChatTemplate::load_from_model_dir(model_dir);
  if (chat_template.ok()) out->renderer_ = server::make_chat_renderer(std::move(*chat_template));
  else if (chat_template.status().code() != StatusCode::kNotFound) return chat_template.status();
  return out;
}

std::unique_ptr<PromptHasher> PromptHasher::token_ids_only() { return std::unique_ptr<PromptHasher>(new PromptHasher()); }

StatusOr<std::vector<int32_t>> PromptHasher::prompt_tokens(std::string_view body, server::Endpoint endpoint) const {
  auto parsed = server::parse_openai_request(body, endpoint);
  if (const auto* error = std::get_if<server::ApiError>(&parsed)) return invalid_argument_error("{}", error->message);
  const server::OpenAiRequest& req = std::get<server::OpenAiRequest>(parsed);
  std::vector<int32_t> tokens;
  if (endpoint == server::Endpoint::kChatCompletions) {
    if (!tokenizer_ || !renderer_) return failed_precondition_error("no tokenizer or chat template to render chats");
    PAGODA_ASSIGN_OR_RETURN(std::string text, renderer_(req.chat));
    tokens = tokenizer_->encode(text, req.add_special_tokens);
  } else if (const server::PromptInput& prompt = req.prompts.front(); prompt.text) {
    // A batched request is routed by its first prompt.
    if (!tokenizer_) return failed_precondition_error("no tokenizer to encode text prompts");
    tokens = tokenizer_->encode(*prompt.text, req.add_special_tokens);
  } else {
    tokens = prompt.tokens;
  }
  // truncate_prompt_tokens k > 0: the backend keeps the prompt's last k tokens, so its cache holds those
  // (-1, the backend's context length, is left whole: the router does not know it).
  if (req.truncate_prompt_tokens && *req.truncate_prompt_tokens > 0 &&
      static_cast<int64_t>(tokens.size()) > *req.truncate_prompt_tokens)
    tokens.erase(tokens.begin(), tokens.end() - static_cast<std::ptrdiff_t>(*req.truncate_prompt_tokens));
  return tokens;
}

std::vector<uint64_t> PromptHasher::block_keys(uint64_t namespace_seed, std::span<const int32_t> tokens,
                                               int32_t block_size) {
  std::vector<uint64_t> keys;
  if (block_size < 1 || tokens.size() < 2) return keys;
  const size_t blocks = (tokens.size() - 1) / static_cast<size_t>(block_size);
  keys.reserve(blocks);
  uint64_t key = namespace_seed;
  for (size_t i = 0; i < blocks; ++i) {
    key = kv::chain_block_hash(key, tokens.data() + i * block_size, block_size);
    keys.push_back(key);
  }
  return keys;
}

}  // namespace pagoda::router
