#include "pagoda/server/openai_request.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace pagoda::server {
namespace {

// Ordered: tools and tool-call arguments reach the chat template in the client's key order.
using json = nlohmann::ordered_json;

// Field readers: nullopt when absent or null; ApiError when the type is wrong.
struct Reader {
  const json& body;
  std::optional<ApiError> error;

  const json* field(const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void fail(std::string message, const char* param) {
    if (!error) error = invalid_request(std::move(message), std::string(param));
  }
  std::optional<double> number(const char* name) {
    const json* f = field(name);
    if (!f) return std::nullopt;
    if (!f->is_number()) {
      fail(fmt::format("'{}' must be a number", name), name);
      return std::nullopt;
    }
    double v = f->get<double>();
    if (!std::isfinite(v)) {
      fail(fmt::format("'{}' must be a finite number", name), name);
      return std::nullopt;
    }
    return v;
  }
  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) {
    const json* f = field(name);
    if (!f) return std::nullopt;
    if (!f->is_number_integer()) {
      fail(fmt::format("'{}' must be an integer", name), name);
      return std::nullopt;
    }
    // Unsigned values above int64 max arrive as number_unsigned.
    if (f->is_number_unsigned() && f->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      fail(fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, f->get<uint64_t>()), name);
      return std::nullopt;
    }
    int64_t v = f->get<int64_t>();
    if (v < lo || v > hi) {
      fail(fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, v), name);
      return std::nullopt;
    }
    return v;
  }
  std::optional<bool> boolean(const char* name) {
    const json* f = field(name);
    if (!f) return std::nullopt;
    if (!f->is_boolean()) {
      fail(fmt::format("'{}' must be a boolean", name), name);
      return std::nullopt;
    }
    return f->get<bool>();
  }
  std::optional<std::string> string(const char* name) {
    const json* f = field(name);
    if (!f) return std::nullopt;
    if (!f->is_string()) {
      fail(fmt::format("'{}' must be a string", name), name);
      return std::nullopt;
    }
    return f->get<std::string>();
  }
};

std::optional<ApiError> read_token_ids(const json& array, const char* param, std::vector<int32_t>& out) {
  for (const auto& v : array) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX) ||
        v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return invalid_request(fmt::format("'{}' token ids must be non-negative integers", param), std::string(param));
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return std::nullopt;
}

// One prompt: a string, or a non-empty array of token ids. `where` names it in messages.
std::optional<ApiError> read_one_prompt(const json& p, const std::string& where, PromptInput& out) {
  if (p.is_string()) {
    out.text = p.get<std::string>();
    return std::nullopt;
  }
  if (!p.is_array() || p.empty() || p[0].is_string() || p[0].is_array())
    return invalid_request(fmt::format("{} must be a string or a non-empty array of token ids", where), "prompt");
  return read_token_ids(p, "prompt", out.tokens);
}

// "prompt": one prompt, or an array of up to `max_prompts` (a batch: strings, token-id arrays, or both).
std::optional<ApiError> read_prompts(const json& body, std::vector<PromptInput>& prompts, bool required,
                                     size_t max_prompts) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    if (required) return invalid_request("'prompt' is required", "prompt", "missing_required_parameter");
    return std::nullopt;
  }
  const json& p = *it;
  const bool batch = p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array());
  if (!batch) return read_one_prompt(p, "'prompt'", prompts.emplace_back());
  if (p.size() > max_prompts)
    return invalid_request(max_prompts == 1 ? std::string("a list of prompts is not accepted here: send one prompt")
                                            : fmt::format("'prompt' lists {} prompts, more than the {} one request "
                                                          "may batch; split them over several requests",
                                                          p.size(), max_prompts),
                           "prompt", "unsupported");
  for (size_t i = 0; i < p.size(); ++i) {
    const std::string where = p.size() == 1 ? std::string("'prompt'") : fmt::format("'prompt' item {}", i);
    if (p[i].is_array() && p[i].empty()) return invalid_request(fmt::format("{} must not be empty", where), "prompt");
    if (auto e = read_one_prompt(p[i], where, prompts.emplace_back())) return e;
  }
  return std::nullopt;
}

// Chat fields reach the template engine, whose JSON conversion and tojson
// recurse: a body nested a million levels deep would overflow the stack. No
// real request (tool schemas included) comes near the limit. Names the
// top-level field that nests too deep.
std::optional<ApiError> check_nesting(const json& body) {
  for (auto it = body.begin(); it != body.end(); ++it)
    if (nests_deeper_than(it.value(), kMaxJsonNesting - 1))
      return invalid_request(fmt::format("'{}' nests deeper than {} levels", it.key(), kMaxJsonNesting), it.key());
  return std::nullopt;
}

std::optional<ApiError> check_unsupported(const json& body) {
  if (auto it = body.find("suffix"); it != body.end() && !it->is_null())
    return invalid_request("'suffix' is not supported", "suffix", "unsupported");
  // Fields that change the output and that pagoda does not implement (OpenAI's and vLLM's): any
  // value but their default is refused, never silently ignored. docs/API.md lists them.
  static const std::vector<std::pair<const char*, json>> kUnsupported = {
      {"functions", nullptr}, {"function_call", nullptr}, {"prediction", nullptr}, {"audio", nullptr},
      {"modalities", nullptr}, {"reasoning_effort", nullptr}, {"web_search_options", nullptr},
      {"guided_whitespace_pattern", nullptr}, {"logits_processors", nullptr},
      {"use_beam_search", false}, {"length_penalty", 1.0}, {"spaces_between_special_tokens", true}};
  for (const auto& [name, default_value] : kUnsupported) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null() || *it == default_value) continue;
    return invalid_request(fmt::format("'{}' is not supported (only its default, {}, is)", name, default_value.dump()),
                           std::string(name), "unsupported");
  }
  return std::nullopt;
}

// OpenAI's logit_bias: {"token id": bias, ...}; the ids as decimal strings.
std::optional<ApiError> read_logit_bias(const json& body, std::vector<std::pair<int32_t, float>>& out) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object())
    return invalid_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
  for (auto m = it->begin(); m != it->end(); ++m) {
    const std::string& key = m.key();
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX)
      return invalid_request(fmt::format("logit_bias: key '{}' is not a token id (a non-negative integer)", key),
                             "logit_bias");
    if (!m->is_number() || !std::isfinite(m->get<double>()))
      return invalid_request(fmt::format("logit_bias: the bias of token {} must be a number", key), "logit_bias");
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(m->get<double>()));
  }
  return std::nullopt;
}

// vLLM's allowed_token_ids (a non-empty array of ids) and bad_words (strings, tokenized by the server).
std::optional<ApiError> read_token_rules(const json& body, engine::SamplingParams& s, std::vector<std::string>& bad) {
  if (auto it = body.find("allowed_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array() || it->empty())
      return invalid_request("'allowed_token_ids' must be a non-empty array of token ids", "allowed_token_ids");
    if (auto e = read_token_ids(*it, "allowed_token_ids", s.allowed_token_ids)) return e;
  }
  if (auto it = body.find("bad_words"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return invalid_request("'bad_words' must be an array of strings", "bad_words");
    for (const auto& v : *it) {
      if (!v.is_string() || v.get<std::string>().find_first_not_of(" \t\n\r") == std::string::npos)
        return invalid_request("'bad_words' must be an array of non-blank strings", "bad_words");
      bad.push_back(v.get<std::string>());
    }
    if (bad.size() > engine::kMaxBadWordSequences / 2)
      return invalid_request(fmt::format("'bad_words' accepts at most {} words, got {}",
                                         engine::kMaxBadWordSequences / 2, bad.size()),
                             "bad_words");
  }
  return std::nullopt;
}

// response_format and the vLLM-style guided_* fields; at most one of them.
std::optional<ApiError> read_structured_output(const json& body, StructuredOutputSpec& out) {
  auto claim = [&](const char* param) -> std::optional<ApiError> {
    if (out.kind != StructuredOutputSpec::Kind::kNone)
      return invalid_request(fmt::format("'{}' cannot be combined with '{}'", param, out.param), std::string(param));
    out.param = param;
    return std::nullopt;
  };
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      return invalid_request("'response_format' must be an object with a string 'type'", "response_format");
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      if (auto e = claim("response_format")) return e;
      out.kind = StructuredOutputSpec::Kind::kJsonObject;
    } else if (type == "json_schema") {
      if (auto e = claim("response_format")) return e;
      auto spec = it->find("json_schema");
      if (spec == it->end() || !spec->is_object())
        return invalid_request("response_format.json_schema must be an object", "response_format.json_schema");
      if (auto name = spec->find("name"); name != spec->end() && !name->is_string())
        return invalid_request("response_format.json_schema.name must be a string", "response_format.json_schema.name");
      if (auto strict = spec->find("strict"); strict != spec->end() && !strict->is_null() && !strict->is_boolean())
        return invalid_request("response_format.json_schema.strict must be a boolean",
                               "response_format.json_schema.strict");
      auto schema = spec->find("schema");
      out.kind = StructuredOutputSpec::Kind::kJsonSchema;
      out.schema_path = "response_format.json_schema.schema";
      // No schema: any JSON value (OpenAI requires one; vLLM accepts its absence).
      out.schema = schema == spec->end() || schema->is_null() ? json::object() : *schema;
      if (!out.schema.is_object() && !out.schema.is_boolean())
        return invalid_request("response_format.json_schema.schema must be an object", out.schema_path);
    } else if (type != "text") {
      return invalid_request(
          fmt::format("response_format type '{}' is not supported (text, json_object, json_schema are)", type),
          "response_format.type", "unsupported");
    }
  }
  if (auto it = body.find("guided_json"); it != body.end() && !it->is_null()) {
    if (auto e = claim("guided_json")) return e;
    out.kind = StructuredOutputSpec::Kind::kJsonSchema;
    out.schema_path = "guided_json";
    if (it->is_string()) {
      out.schema = json::parse(it->get<std::string>(), nullptr, false);
      if (out.schema.is_discarded()) return invalid_request("'guided_json' is not valid JSON", "guided_json");
    } else {
      out.schema = *it;
    }
    if (!out.schema.is_object() && !out.schema.is_boolean())
      return invalid_request("'guided_json' must be a JSON Schema object", "guided_json");
  }
  for (auto [name, kind] : {std::pair{"guided_regex", StructuredOutputSpec::Kind::kRegex},
                            std::pair{"guided_grammar", StructuredOutputSpec::Kind::kGrammar}}) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_string() || it->get<std::string>().empty())
      return invalid_request(fmt::format("'{}' must be a non-empty string", name), std::string(name));
    if (auto e = claim(name)) return e;
    out.kind = kind;
    out.text = it->get<std::string>();
  }
  if (auto it = body.find("guided_choice"); it != body.end() && !it->is_null()) {
    if (!it->is_array() || it->empty())
      return invalid_request("'guided_choice' must be a non-empty array of strings", "guided_choice");
    if (auto e = claim("guided_choice")) return e;
    out.kind = StructuredOutputSpec::Kind::kChoice;
    for (const auto& v : *it) {
      if (!v.is_string() || v.get<std::string>().empty())
        return invalid_request("'guided_choice' must be a non-empty array of strings", "guided_choice");
      out.choices.push_back(v.get<std::string>());
    }
  }
  return std::nullopt;
}

// The pagoda extension "kv_compression": {"policy": "snapkv", "budget": 256,
// "sink_tokens": 4, "window": 32, "span": 16}; unset members take their defaults.
std::optional<ApiError> read_kv_compression(const json& body, std::optional<runtime::KvCompressionConfig>& out) {
  auto it = body.find("kv_compression");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return invalid_request("'kv_compression' must be an object", "kv_compression");
  runtime::KvCompressionConfig c;
  for (auto m = it->begin(); m != it->end(); ++m) {
    const std::string param = "kv_compression." + m.key();
    if (m.key() == "policy") {
      if (!m->is_string()) return invalid_request(fmt::format("'{}' must be a string", param), param);
      auto policy = runtime::parse_kv_compression_policy(m->get<std::string>(), param);
      if (!policy.ok()) return invalid_request(policy.status().message(), param);
      c.policy = *policy;
    } else if (m.key() == "budget" || m.key() == "sink_tokens" || m.key() == "window" || m.key() == "span") {
      if (!m->is_number_integer() || m->get<int64_t>() < 0 || m->get<int64_t>() > (1 << 24))
        return invalid_request(fmt::format("'{}' must be an integer in [0, {}]", param, 1 << 24), param);
      const auto v = static_cast<int32_t>(m->get<int64_t>());
      (m.key() == "budget"   ? c.budget
       : m.key() == "window" ? c.window
       : m.key() == "span"   ? c.span
                             : c.sink_tokens) = v;
    } else {
      return invalid_request(
          fmt::format("'{}' is not a kv_compression setting (policy, budget, sink_tokens, window, span)", param),
                             param);
    }
  }
  if (Status s = runtime::validate_kv_compression(c, "kv_compression."); !s.ok()) {
    // validate_kv_compression's messages start with the field they name.
    const std::string& msg = s.message();
    return invalid_request(msg, msg.substr(0, msg.find(' ')));
  }
  out = c;
  return std::nullopt;
}

}  // namespace

std::variant<OpenAiRequest, ApiError> parse_openai_request(std::string_view text, Endpoint endpoint) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    return invalid_request("the request body is not valid JSON (or not valid UTF-8)", std::nullopt, "invalid_json");
  if (!body.is_object()) return invalid_request("the request body must be a JSON object", std::nullopt, "invalid_json");
  if (auto e = check_nesting(body)) return *e;

  OpenAiRequest req;
  req.endpoint = endpoint;
  Reader r{body, std::nullopt};
  auto model = r.string("model");
  if (r.error) return *r.error;
  if (!model) return invalid_request("'model' is required", "model", "missing_required_parameter");
  req.model = *model;

  if (endpoint == Endpoint::kCompletions) {
    if (auto e = read_prompts(body, req.prompts, true, kMaxBatchedPrompts)) return *e;
  } else {
    if (auto e = read_chat_prompt(body, req.chat)) return *e;
  }
  if (auto e = check_unsupported(body)) return *e;
  if (auto e = read_structured_output(body, req.structured)) return *e;
  if (auto e = read_kv_compression(body, req.kv_compression)) return *e;

  auto& s = req.sampling;
  if (auto v = r.number("temperature")) s.temperature = static_cast<float>(*v);
  if (r.error) return *r.error;
  if (!(s.temperature >= 0.0f && s.temperature <= 2.0f))
    return invalid_request(fmt::format("'temperature' must be in [0, 2], got {}", s.temperature), "temperature");
  if (auto v = r.number("top_p")) s.top_p = static_cast<float>(*v);
  if (auto v = r.integer("top_k", -1, 1 << 30)) s.top_k = *v < 0 ? 0 : static_cast<int32_t>(*v);
  if (auto v = r.number("min_p")) s.min_p = static_cast<float>(*v);
  if (auto v = r.number("repetition_penalty")) s.repetition_penalty = static_cast<float>(*v);
  if (auto v = r.number("frequency_penalty")) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = r.number("presence_penalty")) s.presence_penalty = static_cast<float>(*v);
  if (auto v = r.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    s.seed = static_cast<uint64_t>(*v);
  if (auto v = r.integer("n", 1, 16)) s.n = static_cast<int32_t>(*v);
  const char* max_name = "max_tokens";
  auto max_tokens = r.integer("max_tokens", 0, kMaxTokensLimit);
  if (!max_tokens && !r.error && endpoint == Endpoint::kChatCompletions) {
    max_name = "max_completion_tokens";
    max_tokens = r.integer(max_name, 0, kMaxTokensLimit);
  }
  if (max_tokens) {
    s.max_tokens = static_cast<int32_t>(*max_tokens);
    req.max_tokens_given = true;
  }
  if (auto v = r.boolean("stream")) req.stream = *v;
  if (auto v = r.boolean("ignore_eos")) s.ignore_eos = *v;
  if (auto v = r.integer("min_tokens", 0, kMaxTokensLimit)) s.min_tokens = static_cast<int32_t>(*v);
  if (auto v = r.boolean("include_stop_str_in_output")) s.include_stop_str_in_output = *v;
  if (auto v = r.boolean("skip_special_tokens")) s.skip_special_tokens = *v;
  if (auto v = r.integer("truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max())) {
    if (*v == 0) return invalid_request("'truncate_prompt_tokens' must be -1 or >= 1, got 0", "truncate_prompt_tokens");
    req.truncate_prompt_tokens = *v;
  }
  if (r.error) return *r.error;
  if (auto e = read_logit_bias(body, s.logit_bias)) return *e;
  if (auto e = read_token_rules(body, s, req.bad_words)) return *e;

  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_request("'stream_options' must be an object", "stream_options");
    Reader so{*it, std::nullopt};
    if (auto v = so.boolean("include_usage")) req.include_usage = *v;
    if (so.error) return invalid_request("'stream_options.include_usage' must be a boolean", "stream_options");
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      s.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& v : *it) {
        if (!v.is_string()) return invalid_request("'stop' must be a string or an array of strings", "stop");
        s.stop.push_back(v.get<std::string>());
      }
    } else {
      return invalid_request("'stop' must be a string or an array of strings", "stop");
    }
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return invalid_request("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    if (auto e = read_token_ids(*it, "stop_token_ids", s.stop_token_ids)) return *e;
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto v = r.integer("logprobs", 0, 20)) s.logprobs = static_cast<int32_t>(*v);
  } else {
    auto want = r.boolean("logprobs");
    auto top = r.integer("top_logprobs", 0, 20);
    if (r.error) return *r.error;
    if (top && !(want && *want))
      return invalid_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    if (want && *want) s.logprobs = top ? static_cast<int32_t>(*top) : 0;
  }
  if (auto v = r.integer("prompt_logprobs", 0, 20)) req.prompt_logprobs = static_cast<int32_t>(*v);
  if (auto v = r.boolean("echo")) (endpoint == Endpoint::kCompletions ? req.echo : req.echo_final_message) = *v;
  req.add_special_tokens = r.boolean("add_special_tokens").value_or(endpoint == Endpoint::kCompletions);
  if (auto v = r.boolean("return_tokens_as_token_ids")) req.return_tokens_as_token_ids = *v;
  if (auto v = r.integer("priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()))
    req.priority = static_cast<int32_t>(*v);
  if (r.error) return *r.error;
  if (req.prompt_logprobs && req.stream)
    return invalid_request("'prompt_logprobs' is not available with stream: true", "prompt_logprobs");
  if (req.max_tokens_given && s.max_tokens == 0 && !req.echo && !req.prompt_logprobs)
    return invalid_request("max_tokens 0 (score the prompt alone) needs echo or prompt_logprobs", max_name);
  if (req.max_tokens_given && s.max_tokens == 0 && s.n > 1)
    return invalid_request("max_tokens 0 (score the prompt alone) takes n = 1", "n");
  // What the engine scores: prompt_logprobs' alternatives, echo's logprobs' (the prompt's tokens
  // lead the logprobs), and nothing to report but the prompt when max_tokens is 0.
  if (req.prompt_logprobs) s.prompt_logprobs = req.prompt_logprobs;
  if (req.echo && s.logprobs) s.prompt_logprobs = std::max(s.prompt_logprobs.value_or(0), *s.logprobs);
  if (req.max_tokens_given && s.max_tokens == 0 && !s.prompt_logprobs) s.prompt_logprobs = 0;
  if (auto v = r.integer("best_of", 1, 16); v && *v != s.n)
    return invalid_request("'best_of' other than n is not supported", "best_of", "unsupported");
  if (auto v = r.string("user")) (void)v;
  if (r.error) return *r.error;

  // Ranges of the sampling fields (vocabulary-dependent checks come later). Without max_tokens the
  // server picks it later, at least min_tokens where the context has room.
  engine::SamplingParams checked = s;
  if (!req.max_tokens_given) checked.max_tokens = std::max(checked.max_tokens, checked.min_tokens);
  Status st = engine::validate_sampling_params(checked, std::numeric_limits<int32_t>::max());
  if (!st.ok()) {
    std::string param = st.message().substr(0, st.message().find_first_of(" :"));
    if (param == "max_tokens") param = max_name;
    return invalid_request(st.message(), param);
  }
  return req;
}

std::variant<CacheDropRequest, ApiError> parse_cache_drop_request(std::string_view text) {
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object())
    return invalid_request("the request body must be a JSON object", std::nullopt, "invalid_json");
  if (auto e = check_nesting(body)) return *e;
  CacheDropRequest req;
  Reader r{body, std::nullopt};
  if (auto v = r.boolean("all")) req.all = *v;
  if (auto v = r.integer("keep_prefix_tokens", 0, std::numeric_limits<int32_t>::max())) req.keep_prefix_tokens = *v;
  req.add_special_tokens = r.boolean("add_special_tokens").value_or(!body.contains("messages"));
  if (r.error) return *r.error;
  if (req.all) return req;
  if (body.contains("messages")) {
    req.chat.emplace();
    if (auto e = read_chat_prompt(body, *req.chat)) return *e;
    return req;
  }
  std::vector<PromptInput> prompts;
  if (auto e = read_prompts(body, prompts, false, 1)) return *e;
  if (prompts.empty())
    return invalid_request("give 'prompt', 'messages' or \"all\": true", "prompt", "missing_required_parameter");
  req.prompt = std::move(prompts[0]);
  return req;
}

namespace {

// The body as a JSON object no deeper than the generation endpoints accept, and its "model".
std::optional<ApiError> read_object_and_model(std::string_view text, json& body, std::string& model) {
  body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    return invalid_request("the request body is not valid JSON (or not valid UTF-8)", std::nullopt, "invalid_json");
  if (!body.is_object()) return invalid_request("the request body must be a JSON object", std::nullopt, "invalid_json");
  if (auto e = check_nesting(body)) return e;
  Reader r{body, std::nullopt};
  auto m = r.string("model");
  if (r.error) return r.error;
  if (!m) return invalid_request("'model' is required", "model", "missing_required_parameter");
  model = *m;
  return std::nullopt;
}

}  // namespace

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view text) {
  json body;
  TokenizeRequest req;
  if (auto e = read_object_and_model(text, body, req.model)) return *e;
  Reader r{body, std::nullopt};
  const bool chat = body.contains("messages");
  if (chat && body.contains("prompt"))
    return invalid_request("give 'prompt' or 'messages', not both", "prompt");
  if (chat) {
    if (auto e = read_chat_prompt(body, req.chat)) return *e;
  } else {
    req.prompt = r.string("prompt");
    if (r.error) return *r.error;
    if (!req.prompt)
      return invalid_request("give 'prompt' (a string) or 'messages'", "prompt", "missing_required_parameter");
  }
  req.add_special_tokens = r.boolean("add_special_tokens").value_or(!chat);
  req.return_token_strs = r.boolean("return_token_strs").value_or(false);
  if (r.error) return *r.error;
  return req;
}

std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view text) {
  json body;
  DetokenizeRequest req;
  if (auto e = read_object_and_model(text, body, req.model)) return *e;
  auto it = body.find("tokens");
  if (it == body.end() || it->is_null())
    return invalid_request("'tokens' is required", "tokens", "missing_required_parameter");
  if (!it->is_array()) return invalid_request("'tokens' must be an array of token ids", "tokens");
  if (auto e = read_token_ids(*it, "tokens", req.tokens)) return *e;
  return req;
}

}  // namespace pagoda::server
