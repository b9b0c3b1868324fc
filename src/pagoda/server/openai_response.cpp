#include "pagoda/server/openai_response.h"

#include <fmt/format.h>

namespace pagoda::server {

using json = nlohmann::json;

const char* finish_reason_json(engine::FinishReason reason) { return engine::finish_reason_name(reason); }

ResponseBuilder::ResponseBuilder(Endpoint endpoint, std::string id, std::string model, int64_t created, int32_t n,
                                 bool want_logprobs, TokenText token_text)
    : endpoint_(endpoint),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      want_logprobs_(want_logprobs),
      token_text_(std::move(token_text)),
      choices_(std::max(1, n)) {}

void ResponseBuilder::accumulate(const engine::RequestOutput& delta) {
  prompt_scores_.insert(prompt_scores_.end(), delta.prompt_logprobs.begin(), delta.prompt_logprobs.end());
  for (const auto& d : delta.choices) {
    if (d.index < 0 || d.index >= static_cast<int32_t>(choices_.size())) continue;
    Choice& c = choices_[d.index];
    c.text += d.text;
    c.tokens.insert(c.tokens.end(), d.tokens.begin(), d.tokens.end());
    c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    if (d.stop_token && want_logprobs_) c.logprobs.push_back(*d.stop_token);
    if (d.finish_reason != engine::FinishReason::kNone) c.finish = d.finish_reason;
  }
}

json ResponseBuilder::usage_json(const engine::Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

std::string ResponseBuilder::token_name(int32_t token, const std::string& text) const {
  return tokens_by_id_ ? fmt::format("token_id:{}", token) : text;
}

json ResponseBuilder::logprobs_json(const std::vector<engine::SampledToken>& tokens, size_t text_offset,
                                    bool with_prompt) const {
  if (endpoint_ == Endpoint::kCompletions) {
    json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    auto add = [&](int32_t token, json logprob, json top) {
      const std::string text = token_text_(token);
      out["tokens"].push_back(token_name(token, text));
      out["token_logprobs"].push_back(std::move(logprob));
      out["top_logprobs"].push_back(std::move(top));
      out["text_offset"].push_back(text_offset);
      text_offset += text.size();
    };
    auto top_of = [&](const engine::SampledToken& t, size_t k) {
      json top = json::object();
      for (size_t i = 0; i < std::min(k, t.top_logprobs.size()); ++i)
        top[token_name(t.top_logprobs[i].token, token_text_(t.top_logprobs[i].token))] = t.top_logprobs[i].logprob;
      return top;
    };
    if (with_prompt && !prompt_.tokens.empty()) {
      add(prompt_.tokens[0], nullptr, nullptr);  // the first prompt token: nothing predicts it
      // The engine may score more alternatives than echo's logprobs asks for (prompt_logprobs).
      for (const auto& t : prompt_scores_) add(t.token, t.logprob, top_of(t, prompt_.echo_top_logprobs));
      text_offset = prompt_.text.size();  // where the completion starts in the echoed text
    }
    for (const auto& t : tokens) add(t.token, t.logprob, top_of(t, t.top_logprobs.size()));
    return out;
  }
  auto entry = [&](int32_t token, float logprob) {
    const std::string text = token_text_(token);
    json bytes = json::array();
    for (unsigned char ch : text) bytes.push_back(static_cast<int>(ch));
    return json{{"token", token_name(token, text)}, {"logprob", logprob}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const auto& t : tokens) {
    json e = entry(t.token, t.logprob);
    e["top_logprobs"] = json::array();
    for (const auto& alt : t.top_logprobs) e["top_logprobs"].push_back(entry(alt.token, alt.logprob));
    content.push_back(e);
  }
  return {{"content", content}};
}

json ResponseBuilder::prompt_logprobs_json() const {
  json out = json::array({nullptr});  // the first prompt token: nothing predicts it
  const size_t k = static_cast<size_t>(prompt_.prompt_logprobs.value_or(0));
  for (const auto& t : prompt_scores_) {
    json entry = json::object();
    auto add = [&](int32_t token, float logprob, size_t rank) {
      entry[std::to_string(token)] = {{"logprob", logprob}, {"rank", rank}, {"decoded_token", token_text_(token)}};
    };
    add(t.token, t.logprob, static_cast<size_t>(t.rank));
    // vLLM's order: an alternative that is the prompt token itself keeps the alternative's rank.
    for (size_t i = 0; i < std::min(k, t.top_logprobs.size()); ++i)
      add(t.top_logprobs[i].token, t.top_logprobs[i].logprob, i + 1);
    out.push_back(std::move(entry));
  }
  return out;
}

bool ResponseBuilder::any_choice_finished(engine::FinishReason reason) const {
  for (const Choice& c : choices_)
    if (c.finish == reason) return true;
  return false;
}

json ResponseBuilder::final_response(const engine::Usage& usage) const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const int64_t index = first_index_ + static_cast<int64_t>(i);
    json choice = {{"index", index}, {"finish_reason", finish_reason_json(c.finish)}};
    choice["logprobs"] = want_logprobs_ ? logprobs_json(c.logprobs, 0, prompt_.echo) : json(nullptr);
    const std::string echoed = prompt_.echo ? prompt_.text : std::string();  // chat's echo
    if (endpoint_ == Endpoint::kCompletions) {
      choice["text"] = prompt_.echo ? prompt_.text + c.text : c.text;
      if (prompt_.prompt_logprobs) choice["prompt_logprobs"] = prompt_logprobs_json();
    } else if (auto parsed = parse_tool_calls(c.text, tool_call_syntax_)) {
      json calls = json::array();
      for (size_t k = 0; k < parsed->calls.size(); ++k)
        calls.push_back({{"id", fmt::format("call_{}_{}_{}", id_, index, k)},
                         {"type", "function"},
                         {"function", {{"name", parsed->calls[k].name}, {"arguments", parsed->calls[k].arguments}}}});
      const std::string content = echoed + parsed->content;
      choice["message"] = {{"role", "assistant"},
                           {"content", content.empty() ? json(nullptr) : json(content)},
                           {"tool_calls", calls}};
      if (c.finish == engine::FinishReason::kStop) choice["finish_reason"] = "tool_calls";
    } else {
      choice["message"] = {{"role", "assistant"}, {"content", echoed + c.text}};
    }
    choices.push_back(choice);
  }
  json body = {{"id", id_},
               {"object", endpoint_ == Endpoint::kCompletions ? "text_completion" : "chat.completion"},
               {"created", created_},
               {"model", model_},
               {"choices", choices},
               {"usage", usage_json(usage)}};
  if (endpoint_ == Endpoint::kChatCompletions && prompt_.prompt_logprobs)
    body["prompt_logprobs"] = prompt_logprobs_json();
  return body;
}

json ResponseBuilder::chunk_base() const {
  return {{"id", id_},
          {"object", endpoint_ == Endpoint::kCompletions ? "text_completion" : "chat.completion.chunk"},
          {"created", created_},
          {"model", model_}};
}

std::vector<json> ResponseBuilder::chunks(const engine::RequestOutput& delta) {
  std::vector<json> out;
  prompt_scores_.insert(prompt_scores_.end(), delta.prompt_logprobs.begin(), delta.prompt_logprobs.end());
  for (const auto& d : delta.choices) {
    if (d.index < 0 || d.index >= static_cast<int32_t>(choices_.size())) continue;
    Choice& c = choices_[d.index];
    const size_t offset = c.text.size();
    // echo: a choice's first chunk starts with the prompt (its scores came in earlier deltas, or this one).
    const bool echo_now = prompt_.echo && !c.role_sent;
    const std::string text = echo_now ? prompt_.text + d.text : d.text;
    c.text += text;
    const bool finished = d.finish_reason != engine::FinishReason::kNone;
    if (text.empty() && !finished && c.role_sent) continue;
    const int32_t index = first_index_ + d.index;
    json choice = {{"index", index}};
    choice["finish_reason"] = finished ? json(finish_reason_json(d.finish_reason)) : json(nullptr);
    std::vector<engine::SampledToken> logprobs = d.logprobs;
    if (d.stop_token) logprobs.push_back(*d.stop_token);
    const bool echo_scores = echo_now && endpoint_ == Endpoint::kCompletions;  // chat's echo is text only
    choice["logprobs"] = want_logprobs_ && (!logprobs.empty() || echo_scores)
                             ? logprobs_json(logprobs, offset, echo_scores)
                             : json(nullptr);
    if (endpoint_ == Endpoint::kCompletions) {
      choice["text"] = text;
    } else if (tool_call_syntax_ != ToolCallSyntax::kNone) {
      if (!c.tool_stream) c.tool_stream.emplace(tool_call_syntax_);
      ToolCallStream::Delta td = c.tool_stream->feed(d.text);
      if (finished) {
        ToolCallStream::Delta rest = c.tool_stream->finish();
        td.content += rest.content;
        for (auto& call : rest.calls) td.calls.push_back(std::move(call));
      }
      if (echo_now) td.content = prompt_.text + td.content;  // chat's echo leads, never parsed as a call
      if (td.content.empty() && td.calls.empty() && !finished && c.role_sent) continue;
      json delta_obj = json::object();
      if (!c.role_sent) delta_obj["role"] = "assistant";
      if (!td.content.empty() || !c.role_sent) delta_obj["content"] = td.content;
      if (!td.calls.empty()) {
        json calls = json::array();
        for (auto& call : td.calls) {
          const size_t k = c.tool_calls_sent++;
          calls.push_back({{"index", k},
                           {"id", fmt::format("call_{}_{}_{}", id_, index, k)},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        delta_obj["tool_calls"] = calls;
      }
      choice["delta"] = delta_obj;
      if (finished && c.tool_calls_sent > 0 && d.finish_reason == engine::FinishReason::kStop)
        choice["finish_reason"] = "tool_calls";
    } else {
      json delta_obj = json::object();
      if (!c.role_sent) delta_obj["role"] = "assistant";
      if (!text.empty() || !c.role_sent) delta_obj["content"] = text;
      choice["delta"] = delta_obj;
    }
    c.role_sent = true;
    json chunk = chunk_base();
    chunk["choices"] = json::array({choice});
    out.push_back(std::move(chunk));
  }
  return out;
}

json ResponseBuilder::usage_chunk(const engine::Usage& usage) const {
  json chunk = chunk_base();
  chunk["choices"] = json::array();
  chunk["usage"] = usage_json(usage);
  return chunk;
}

std::string ResponseBuilder::sse_event(const json& payload) {
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace pagoda::server
