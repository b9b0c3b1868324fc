#include "pagoda/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagoda/tokenizer/added_tokens.h"
#include "pagoda/tokenizer/bpe_model.h"
#include "pagoda/tokenizer/byte_level_alphabet.h"
#include "pagoda/tokenizer/decoder.h"
#include "pagoda/tokenizer/normalizer.h"
#include "pagoda/tokenizer/post_processor.h"
#include "pagoda/tokenizer/pre_tokenizer.h"
#include "pagoda/tokenizer/tokenizer_json_reader.h"
#include "pagoda/tokenizer/transformers_class.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {

struct Tokenizer::Impl {
  std::unique_ptr<BpeModel> model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  PostProcessor post_processor;
  Decoder decoder;
  std::vector<AddedToken> added_tokens;
  AddedTokenMatcher raw_matcher;         // added tokens with "normalized": false
  AddedTokenMatcher normalized_matcher;  // the others
  std::vector<int32_t> added_index_by_id;  // id -> index into added_tokens, or -1
  StringMap added_ids;                     // content -> id
  int32_t vocab_size = 0;
  std::vector<bool> byte_fallback_token;  // by id: "<0xAB>" under a ByteFallback decoder

  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::vector<TokenId> generation_eos_ids;
  std::string chat_template;
  std::string tokenizer_class;
  bool pipeline_rebuilt = false;

  const AddedToken* added(TokenId id) const {
    if (id < 0 || static_cast<size_t>(id) >= added_index_by_id.size()) return nullptr;
    const int32_t index = added_index_by_id[id];
    return index < 0 ? nullptr : &added_tokens[index];
  }
  std::optional<TokenId> lookup(const std::optional<std::string>& token) const {
    if (!token) return std::nullopt;
    const int32_t added_id = added_ids.find(*token);
    if (added_id >= 0) return added_id;
    const int32_t id = model->token_to_id(*token);
    if (id >= 0) return id;
    return std::nullopt;
  }

  void encode_segment(std::string_view segment, bool at_text_start,
                      std::vector<TokenId>& out) const;
};

namespace {

StatusOr<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open {}", path.string());
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return io_error("cannot read {}", path.string());
  return contents.str();
}

StatusOr<nlohmann::json> parse_json(std::string_view contents, std::string_view name) {
  try {
    return nlohmann::json::parse(contents);
  } catch (const nlohmann::json::exception& error) {
    return data_loss_error("{}: not valid JSON: {}", name, error.what());
  }
}

// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
std::optional<std::string> config_token(const nlohmann::json& config, const char* field) {
  if (!config.is_object() || !config.contains(field)) return std::nullopt;
  const auto& value = config[field];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

bool json_mentions_type(const nlohmann::json& spec, std::string_view type) {
  if (spec.is_object()) {
    if (spec.contains("type") && spec["type"].is_string() && spec["type"].get<std::string>() == type) {
      return true;
    }
    for (const auto& [key, value] : spec.items()) {
      if (json_mentions_type(value, type)) return true;
    }
  } else if (spec.is_array()) {
    for (const auto& value : spec) {
      if (json_mentions_type(value, type)) return true;
    }
  }
  return false;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::load(const std::filesystem::path& model_dir,
                                                          bool follow_transformers_class) {
  TokenizerFiles files;
  files.follow_transformers_class = follow_transformers_class;
  const auto tokenizer_path = model_dir / "tokenizer.json";
  files.source_name = tokenizer_path.string();
  std::error_code error;
  if (!std::filesystem::is_regular_file(tokenizer_path, error)) {
    return not_found_error("{}: no such file (a model directory needs tokenizer.json)",
                           tokenizer_path.string());
  }
  PAGODA_ASSIGN_OR_RETURN(files.tokenizer_json, read_file(tokenizer_path));
  for (auto [name, target] : {std::pair{"tokenizer_config.json", &files.tokenizer_config_json},
                              std::pair{"generation_config.json", &files.generation_config_json}}) {
    const auto path = model_dir / name;
    if (std::filesystem::is_regular_file(path, error)) {
      PAGODA_ASSIGN_OR_RETURN(*target, read_file(path));
    }
  }
  auto loaded = load_from_contents(files);
  if (!loaded.ok()) return loaded.status();
  return loaded;
}

StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::load_from_contents(const TokenizerFiles& files) {
  // The readers use nlohmann's value()/get(), which throw on a field of the
  // wrong type (found by fuzzing: "special": "yes" ended the process). A wrong
  // type anywhere in the files is a DATA_LOSS error, never an exception.
  try {
    return load_from_contents_checked(files);
  } catch (const nlohmann::json::exception& e) {
    return data_loss_error("{}: a field has the wrong type ({})", files.source_name, e.what());
  }
}

StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::load_from_contents_checked(const TokenizerFiles& files) {
  const std::string& name = files.source_name;
  PAGODA_ASSIGN_OR_RETURN(TokenizerJson parsed, read_tokenizer_json(files.tokenizer_json, name));
  const nlohmann::json& spec = parsed.document;
  if (!spec.contains("model")) return data_loss_error("{}: no \"model\" field", name);
  if (!parsed.has_vocab) return data_loss_error("{}: model.vocab: missing", name);
  if (!parsed.has_merges) return data_loss_error("{}: model.merges: missing", name);

  auto impl = std::make_unique<Impl>();
  const nlohmann::json null_value;
  auto field = [&](const char* key) -> const nlohmann::json& {
    return spec.contains(key) ? spec[key] : null_value;
  };
  PipelineSpecs specs{field("normalizer"), field("pre_tokenizer"), field("post_processor"),
                      field("decoder"), spec["model"]};
  const std::string config_name = "tokenizer_config.json";
  nlohmann::json config;
  if (!files.tokenizer_config_json.empty()) {
    PAGODA_ASSIGN_OR_RETURN(config, parse_json(files.tokenizer_config_json, config_name));
  }
  if (files.follow_transformers_class) {
    auto token_id = [&](const std::string& token) -> std::optional<int32_t> {
      for (const auto& entry : field("added_tokens")) {
        if (entry.is_object() && entry.value("content", std::string()) == token &&
            entry.contains("id") && entry["id"].is_number_integer()) {
          return entry["id"].get<int32_t>();
        }
      }
      for (const auto& [vocab_token, id] : parsed.vocab) {
        if (vocab_token == token) return static_cast<int32_t>(id);
      }
      return std::nullopt;
    };
    PAGODA_ASSIGN_OR_RETURN(TransformersClassReport report,
                            apply_transformers_class(config, token_id, config_name, specs));
    impl->tokenizer_class = report.tokenizer_class;
    impl->pipeline_rebuilt = report.pipeline_rebuilt;
  } else if (config.is_object() && config.contains("tokenizer_class") &&
             config["tokenizer_class"].is_string()) {
    impl->tokenizer_class = config["tokenizer_class"].get<std::string>();
  }
  // Names in errors say where a rebuilt component came from.
  const std::string rebuilt = impl->pipeline_rebuilt ? " (as rebuilt for " + impl->tokenizer_class + ")" : "";
  PAGODA_ASSIGN_OR_RETURN(impl->normalizer,
                          Normalizer::from_json(specs.normalizer, name + ": normalizer" + rebuilt));
  PAGODA_ASSIGN_OR_RETURN(impl->pre_tokenizer, PreTokenizer::from_json(
                                                   specs.pre_tokenizer, name + ": pre_tokenizer" + rebuilt));
  PAGODA_ASSIGN_OR_RETURN(impl->post_processor,
                          PostProcessor::from_json(specs.post_processor, name + ": post_processor"));
  PAGODA_ASSIGN_OR_RETURN(impl->decoder, Decoder::from_json(specs.decoder, name + ": decoder" + rebuilt));
  const bool byte_level =
      json_mentions_type(specs.pre_tokenizer, "ByteLevel") || impl->decoder.has_byte_level();
  PAGODA_ASSIGN_OR_RETURN(impl->model,
                          BpeModel::from_json(specs.model, parsed.vocab, parsed.merges,
                                              byte_level, name + ": model"));
  impl->vocab_size = impl->model->id_limit();

  // Added tokens.
  const auto& added = field("added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return data_loss_error("{}: added_tokens: expected an array", name);
  }
  std::vector<AddedToken> raw_tokens, normalized_tokens;
  if (added.is_array()) {
    impl->added_ids.reserve(added.size(), 64 * added.size());
    for (size_t i = 0; i < added.size(); ++i) {
      const auto& entry = added[i];
      if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
          entry["id"].get<int64_t>() < 0 || entry["id"].get<int64_t>() >= kMaxTokenIds || !entry.contains("content") ||
          !entry["content"].is_string()) {
        return data_loss_error("{}: added_tokens[{}]: expected {{\"id\": int, \"content\": string}}",
                               name, i);
      }
      AddedToken token;
      token.id = entry["id"].get<int32_t>();
      token.content = entry["content"].get<std::string>();
      token.special = entry.value("special", false);
      token.normalized = entry.value("normalized", !token.special);
      token.lstrip = entry.value("lstrip", false);
      token.rstrip = entry.value("rstrip", false);
      token.single_word = entry.value("single_word", false);
      impl->vocab_size = std::max(impl->vocab_size, token.id + 1);
      impl->added_ids.insert(token.content, token.id);
      (token.normalized ? normalized_tokens : raw_tokens).push_back(token);
      impl->added_tokens.push_back(std::move(token));
    }
  }
  // The post-processor's ids are written around every encoded text: each must
  // be a token of this vocabulary (found by fuzzing: a template naming id 8 in
  // a 7-token vocabulary made encode() return an id past vocab_size()).
  for (const auto* ids : {&impl->post_processor.prefix(), &impl->post_processor.suffix()})
    for (int32_t id : *ids)
      if (id < 0 || id >= impl->vocab_size)
        return data_loss_error("{}: post_processor: special token id {} is not in the vocabulary (ids [0, {}))", name,
                               id, impl->vocab_size);
  impl->added_index_by_id.assign(static_cast<size_t>(impl->vocab_size), -1);
  for (size_t i = 0; i < impl->added_tokens.size(); ++i) {
    impl->added_index_by_id[impl->added_tokens[i].id] = static_cast<int32_t>(i);
  }
  impl->byte_fallback_token.assign(static_cast<size_t>(impl->vocab_size), false);
  if (impl->decoder.has_byte_fallback()) {
    for (int b = 0; b < 256; ++b) {
      const int32_t id = impl->model->token_to_id(fmt::format("<0x{:02X}>", b));
      if (id >= 0 && impl->added(id) == nullptr) impl->byte_fallback_token[id] = true;
    }
  }
  impl->raw_matcher = AddedTokenMatcher(raw_tokens);
  impl->normalized_matcher = AddedTokenMatcher(normalized_tokens);

  // tokenizer_config.json and generation_config.json.
  if (!files.tokenizer_config_json.empty()) {
    impl->bos_token = config_token(config, "bos_token");
    impl->eos_token = config_token(config, "eos_token");
    impl->pad_token = config_token(config, "pad_token");
    impl->unk_token = config_token(config, "unk_token");
    for (auto [field_name, token] : {std::pair{"bos_token", &impl->bos_token},
                                     std::pair{"eos_token", &impl->eos_token}}) {
      if (*token && !impl->lookup(*token)) {
        return data_loss_error("{}: {}: \"{}\" is not a token of {}", config_name, field_name,
                               **token, name);
      }
    }
    if (config.contains("chat_template") && config["chat_template"].is_string()) {
      impl->chat_template = config["chat_template"].get<std::string>();
    }
  }
  if (!files.generation_config_json.empty()) {
    const std::string generation_name = "generation_config.json";
    PAGODA_ASSIGN_OR_RETURN(nlohmann::json generation,
                            parse_json(files.generation_config_json, generation_name));
    if (generation.is_object() && generation.contains("eos_token_id")) {
      const auto& value = generation["eos_token_id"];
      auto add_id = [&](const nlohmann::json& id) -> Status {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= impl->vocab_size) {
          return data_loss_error("{}: eos_token_id: {} is not a token id (vocab size {})",
                                 generation_name, id.dump(), impl->vocab_size);
        }
        impl->generation_eos_ids.push_back(id.get<int32_t>());
        return ok_status();
      };
      if (value.is_array()) {
        for (const auto& id : value) PAGODA_RETURN_IF_ERROR(add_id(id));
      } else if (!value.is_null()) {
        PAGODA_RETURN_IF_ERROR(add_id(value));
      }
    }
  }
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

void Tokenizer::Impl::encode_segment(std::string_view segment, bool at_text_start,
                                     std::vector<TokenId>& out) const {
  auto encode_plain = [&](std::string_view text, bool at_start) {
    auto sink = [&](std::string_view piece) { model->encode_word(piece, out); };
    pre_tokenizer.pre_tokenize(text, at_start, sink);
  };
  std::string normalized;
  std::string_view view = segment;
  if (!normalizer.is_identity()) {
    normalized.assign(segment);
    normalizer.normalize(normalized);
    view = normalized;
  }
  if (normalized_matcher.empty()) {
    encode_plain(view, at_text_start);
    return;
  }
  std::vector<AddedTokenMatcher::Piece> pieces;
  normalized_matcher.split(view, pieces);
  for (const auto& piece : pieces) {
    if (piece.token_id >= 0) {
      out.push_back(piece.token_id);
    } else {
      encode_plain(view.substr(piece.begin, piece.end - piece.begin),
                   at_text_start && piece.begin == 0);
    }
  }
}

void Tokenizer::encode_into(std::string_view text, bool add_special_tokens,
                            std::vector<TokenId>& out) const {
  const Impl& impl = *impl_;
  if (add_special_tokens) {
    out.insert(out.end(), impl.post_processor.prefix().begin(), impl.post_processor.prefix().end());
  }
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  thread_local std::vector<AddedTokenMatcher::Piece> pieces;
  pieces.clear();
  impl.raw_matcher.split(text, pieces);
  // Copy: encode_segment may re-enter split() on this thread for normalized tokens.
  const std::vector<AddedTokenMatcher::Piece> segments = pieces;
  for (const auto& piece : segments) {
    if (piece.token_id >= 0) {
      out.push_back(piece.token_id);
    } else {
      impl.encode_segment(text.substr(piece.begin, piece.end - piece.begin), piece.begin == 0, out);
    }
  }
  if (add_special_tokens) {
    out.insert(out.end(), impl.post_processor.suffix().begin(), impl.post_processor.suffix().end());
  }
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_into(text, add_special_tokens, ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (TokenId id : ids) {
    if (const AddedToken* added = impl.added(id)) {
      if (skip_special_tokens && added->special) continue;
      tokens.push_back(added->content);
    } else if (const std::string* token = impl.model->id_to_token(id)) {
      tokens.push_back(*token);
    }
  }
  return impl.decoder.decode(std::move(tokens));
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const int32_t added_id = impl_->added_ids.find(token);
  if (added_id >= 0) return added_id;
  const int32_t id = impl_->model->token_to_id(token);
  if (id >= 0) return id;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (const AddedToken* added = impl_->added(id)) return added->content;
  if (const std::string* token = impl_->model->id_to_token(id)) return *token;
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::is_special(TokenId id) const {
  const AddedToken* added = impl_->added(id);
  return added != nullptr && added->special;
}

std::optional<TokenId> Tokenizer::bos_token_id() const { return impl_->lookup(impl_->bos_token); }
std::optional<TokenId> Tokenizer::eos_token_id() const { return impl_->lookup(impl_->eos_token); }
std::optional<TokenId> Tokenizer::pad_token_id() const { return impl_->lookup(impl_->pad_token); }
std::optional<TokenId> Tokenizer::unk_token_id() const { return impl_->lookup(impl_->unk_token); }
std::optional<std::string> Tokenizer::bos_token() const { return impl_->bos_token; }
std::optional<std::string> Tokenizer::eos_token() const { return impl_->eos_token; }

std::vector<TokenId> Tokenizer::eos_token_ids() const {
  std::vector<TokenId> ids;
  if (auto id = eos_token_id()) ids.push_back(*id);
  for (TokenId id : impl_->generation_eos_ids) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

bool Tokenizer::decode_depends_on_next(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->byte_fallback_token.size() &&
         impl_->byte_fallback_token[id];
}

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::tokenizer_class() const { return impl_->tokenizer_class; }
bool Tokenizer::follows_transformers_rebuild() const { return impl_->pipeline_rebuilt; }

std::string Tokenizer::token_bytes(TokenId id) const {
  if (const AddedToken* added = impl_->added(id)) return added->content;
  const std::string* token = impl_->model->id_to_token(id);
  if (token == nullptr) return {};
  if (impl_->model->byte_level()) {
    if (auto bytes = byte_level_to_bytes(*token)) return *bytes;
    return *token;
  }
  if (token->size() == 6 && token->starts_with("<0x") && token->back() == '>') {
    return std::string(1, static_cast<char>(std::stoi(token->substr(3, 2), nullptr, 16)));
  }
  std::string bytes;
  constexpr std::string_view kMetaspace = "\u2581";
  for (size_t pos = 0; pos < token->size();) {
    if (token->compare(pos, kMetaspace.size(), kMetaspace) == 0) {
      bytes.push_back(' ');
      pos += kMetaspace.size();
    } else {
      bytes.push_back((*token)[pos++]);
    }
  }
  return bytes;
}

}  // namespace pagoda::tokenizer
