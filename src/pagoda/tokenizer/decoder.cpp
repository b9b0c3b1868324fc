#include "pagoda/tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "pagoda/tokenizer/byte_level_alphabet.h"
#include "pagoda/tokenizer/tokenizer_json_reader.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  if (from.empty() || text.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string::npos;) {
    out.append(text, pos, hit - pos).append(to);
    pos = hit + from.size();
  }
  out.append(text, pos, std::string::npos);
  text = std::move(out);
}

// "<0xAB>" -> 0xAB, else -1.
int parse_byte_token(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    value <<= 4;
    if (c >= '0' && c <= '9') value |= c - '0';
    else if (c >= 'A' && c <= 'F') value |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') value |= c - 'a' + 10;
    else return -1;
  }
  return value;
}

// Strips up to `count` leading (or trailing) `ch` characters from a token.
void strip_chars(std::string& token, char32_t ch, size_t start, size_t stop) {
  std::string encoded;
  append_utf8(encoded, ch);
  size_t cut_start = 0;
  for (size_t i = 0; i < start && token.compare(cut_start, encoded.size(), encoded) == 0; ++i) {
    cut_start += encoded.size();
  }
  size_t cut_end = token.size();
  for (size_t i = 0; i < stop && cut_end >= cut_start + encoded.size() &&
                     token.compare(cut_end - encoded.size(), encoded.size(), encoded) == 0;
       ++i) {
    cut_end -= encoded.size();
  }
  token = token.substr(cut_start, cut_end - cut_start);
}

}  // namespace

Status Decoder::add_step(const nlohmann::json& spec, std::string_view where, const std::string& type,
                         std::vector<Step>& steps) {
  if (type == "ByteLevel") { steps.push_back(Step{.kind = Kind::kByteLevel}); return ok_status(); }
  if (type == "ByteFallback") { steps.push_back(Step{.kind = Kind::kByteFallback}); return ok_status(); }
  if (type == "Fuse") { steps.push_back(Step{.kind = Kind::kFuse}); return ok_status(); }
  if (type == "Metaspace") {
    Step step{.kind = Kind::kMetaspace,
              .from = spec.value("replacement", std::string("\u2581")),
              .to = " "};
    std::string scheme = spec.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = spec.value("add_prefix_space", true) ? "always" : "never";
    step.strip_first_space = scheme != "never";
    steps.push_back(std::move(step));
    return ok_status();
  }
  if (type == "Replace") {
    const auto& pattern = spec.value("pattern", nlohmann::json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        !spec.contains("content") || !spec["content"].is_string()) {
      return unimplemented_error("{}: only Replace with a {{\"String\": ...}} pattern is supported",
                                 where);
    }
    steps.push_back(Step{.kind = Kind::kReplace,
                         .from = pattern["String"].get<std::string>(),
                         .to = spec["content"].get<std::string>()});
    return ok_status();
  }
  if (type == "Strip") {
    Step step{.kind = Kind::kStrip};
    const std::string content = spec.value("content", std::string(" "));
    char32_t cp = 0;
    if (content.empty() || decode_utf8(content, 0, cp) != content.size()) {
      return data_loss_error("{}.content: expected one character", where);
    }
    step.strip_char = cp;
    // Counts of characters: small non-negative integers (found by fuzzing: a
    // float past 2^64 here was an undefined conversion).
    for (const auto& [field, target] : {std::pair{"start", &step.strip_start}, std::pair{"stop", &step.strip_stop}}) {
      const auto it = spec.find(field);
      if (it == spec.end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 20))
        return data_loss_error("{}.{}: expected a count in [0, {}]", where, field, 1 << 20);
      *target = static_cast<size_t>(it->get<int64_t>());
    }
    steps.push_back(std::move(step));
    return ok_status();
  }
  return unimplemented_error("{}: decoder type \"{}\" is not supported", where, type);
}

StatusOr<Decoder> Decoder::from_json(const nlohmann::json& spec, std::string_view where) {
  Decoder decoder;
  PAGODA_RETURN_IF_ERROR(for_each_component(
      spec, where, "decoders", [&](const nlohmann::json& component, std::string_view component_where,
                                   const std::string& type) {
        return add_step(component, component_where, type, decoder.steps_);
      }));
  return decoder;
}

bool Decoder::has_byte_level() const {
  for (const Step& step : steps_) {
    if (step.kind == Kind::kByteLevel) return true;
  }
  return false;
}

bool Decoder::has_byte_fallback() const {
  for (const Step& step : steps_) {
    if (step.kind == Kind::kByteFallback) return true;
  }
  return false;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (steps_.empty()) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined.push_back(' ');
      joined += tokens[i];
    }
    return joined;
  }
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kByteLevel: {
        // All tokens become one: bytes of every alphabet character, then lossy UTF-8. A token
        // with a character outside the alphabet contributes its own UTF-8 bytes (as HF).
        std::string bytes;
        for (const std::string& token : tokens) {
          if (auto raw = byte_level_to_bytes(token)) bytes += *raw;
          else bytes += token;
        }
        tokens.assign(1, repair_utf8(bytes));
        break;
      }
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // HF drops the first token's leading replacement character (not a literal space).
          const bool strip = i == 0 && step.strip_first_space && tokens[i].starts_with(step.from);
          if (strip) tokens[i].erase(0, step.from.size());
          replace_all(tokens[i], step.from, step.to);
        }
        break;
      case Kind::kReplace:
        for (std::string& token : tokens) replace_all(token, step.from, step.to);
        break;
      case Kind::kByteFallback: {
        std::vector<std::string> out;
        out.reserve(tokens.size());
        std::string pending;
        size_t pending_count = 0;
        auto flush_pending = [&] {
          if (pending_count == 0) return;
          if (is_valid_utf8(pending)) {
            out.push_back(pending);
          } else {
            for (size_t i = 0; i < pending_count; ++i) out.emplace_back(kReplacementCharacter);
          }
          pending.clear();
          pending_count = 0;
        };
        for (std::string& token : tokens) {
          const int byte = parse_byte_token(token);
          if (byte >= 0) {
            pending.push_back(static_cast<char>(byte));
            ++pending_count;
          } else {
            flush_pending();
            out.push_back(std::move(token));
          }
        }
        flush_pending();
        tokens = std::move(out);
        break;
      }
      case Kind::kFuse: {
        std::string fused;
        for (const std::string& token : tokens) fused += token;
        tokens.assign(1, std::move(fused));
        break;
      }
      case Kind::kStrip:
        for (std::string& token : tokens) {
          strip_chars(token, step.strip_char, step.strip_start, step.strip_stop);
        }
        break;
    }
  }
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace pagoda::tokenizer
