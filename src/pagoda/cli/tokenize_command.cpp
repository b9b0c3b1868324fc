// `pagoda tokenize`: text <-> token ids with a model directory's tokenizer.json, for checking
// pagoda against Hugging Face tokenizers from the shell.
//
//   pagoda tokenize --model DIR [--add-special-tokens | --no-special-tokens] [--jsonl] [--decode]
//
// Encode (default): stdin is the text (read whole, bytes as given); prints {"ids": [...]}.
// --jsonl: each stdin line is {"text": "..."}; prints one {"ids": [...]} per line.
// --decode: the reverse: stdin is {"ids": [...]} (or, with --jsonl, one per line); prints
// {"text": "..."}. --skip-special-tokens drops special tokens from decoded text.

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {
namespace {

struct TokenizeOptions {
  std::string model_dir;
  bool add_special_tokens = true;
  bool add_flag = false;      // --add-special-tokens (the default, accepted for clarity)
  bool no_special = false;    // --no-special-tokens
  bool jsonl = false;
  bool decode = false;
  bool skip_special_tokens = false;
};

nlohmann::json ids_json(const std::vector<tokenizer::TokenId>& ids) {
  return nlohmann::json{{"ids", ids}};
}

// Parses {"ids": [...]} and checks every id; `where` names the input line.
std::vector<tokenizer::TokenId> parse_ids(const std::string& line, const std::string& where,
                                          int32_t vocab_size) {
  nlohmann::json value = nlohmann::json::parse(line, nullptr, false);
  if (value.is_discarded()) fail(where + ": not valid JSON");
  if (!value.is_object() || !value.contains("ids") || !value["ids"].is_array()) {
    fail(where + ": expected {\"ids\": [...]}");
  }
  std::vector<tokenizer::TokenId> ids;
  for (size_t i = 0; i < value["ids"].size(); ++i) {
    const auto& id = value["ids"][i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
      fail(where + ": ids[" + std::to_string(i) + "] = " + id.dump() +
           " is not a token id (vocab size " + std::to_string(vocab_size) + ")");
    }
    ids.push_back(id.get<tokenizer::TokenId>());
  }
  return ids;
}

void run_tokenize(const TokenizeOptions& options) {
  auto loaded = tokenizer::Tokenizer::load(options.model_dir);
  if (!loaded.ok()) fail(loaded.status().to_string());
  const tokenizer::Tokenizer& tok = **loaded;

  // Output must be byte-exact: decoded text is valid UTF-8 by contract.
  auto print = [](const nlohmann::json& value) {
    std::string line = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), stdout);
  };

  if (!options.jsonl) {
    std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    if (options.decode) {
      const auto ids = parse_ids(input, "stdin", tok.vocab_size());
      print(nlohmann::json{{"text", tok.decode(ids, options.skip_special_tokens)}});
    } else {
      print(ids_json(tok.encode(input, options.add_special_tokens)));
    }
    return;
  }
  std::string line;
  size_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (line.empty() || line == "\r") continue;
    const std::string where = "stdin line " + std::to_string(line_number);
    if (options.decode) {
      const auto ids = parse_ids(line, where, tok.vocab_size());
      print(nlohmann::json{{"text", tok.decode(ids, options.skip_special_tokens)}});
      continue;
    }
    nlohmann::json value = nlohmann::json::parse(line, nullptr, false);
    if (value.is_discarded()) fail(where + ": not valid JSON");
    if (!value.is_object() || !value.contains("text") || !value["text"].is_string()) {
      fail(where + ": expected {\"text\": \"...\"}");
    }
    print(ids_json(tok.encode(value["text"].get<std::string>(), options.add_special_tokens)));
  }
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* command = app.add_subcommand(
      "tokenize",
      "Text -> token ids (or ids -> text with --decode) using DIR/tokenizer.json, exactly as "
      "Hugging Face tokenizers.\nReads stdin, prints {\"ids\": [...]} (or {\"text\": ...}).");
  command->add_option("--model", options->model_dir, "model directory holding tokenizer.json")
      ->required();
  CLI::Option* add = command->add_flag("--add-special-tokens", options->add_flag,
                                       "add BOS/EOS as the post-processor says (default)");
  CLI::Option* no_add =
      command->add_flag("--no-special-tokens", options->no_special, "do not add BOS/EOS");
  add->excludes(no_add);
  command->add_flag("--jsonl", options->jsonl,
                    "one JSON object per line: {\"text\": ...} in, {\"ids\": [...]} out");
  command->add_flag("--decode", options->decode, "ids -> text: read {\"ids\": [...]}");
  command->add_flag("--skip-special-tokens", options->skip_special_tokens,
                    "with --decode: leave special tokens out of the text");
  command->callback([options] {
    options->add_special_tokens = !options->no_special;
    run_tokenize(*options);
  });
}

}  // namespace pagoda::cli
