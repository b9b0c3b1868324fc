#include "pagoda/tokenizer/normalizer.h"

#include <cstdlib>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include "pagoda/tokenizer/tokenizer_json_reader.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

// Code points that NFC never changes and that never combine with what precedes them: starters
// with no canonical decomposition that are not the second half of any composition. Text made
// only of these (plus ASCII) is already NFC, which skips utf8proc for most English/CJK input.
bool is_nfc_inert(char32_t cp) {
  if (cp < 0x300) return true;
  if (cp >= 0x4E00 && cp <= 0x9FFF) return true;   // CJK unified ideographs
  if (cp >= 0x3400 && cp <= 0x4DBF) return true;   // CJK extension A
  if (cp >= 0x3000 && cp <= 0x3029) return true;   // CJK symbols and punctuation
  if (cp >= 0x3030 && cp <= 0x3098) return true;   // hiragana (not the combining voicing marks)
  if (cp >= 0x309B && cp <= 0x30FF) return true;   // katakana
  if (cp >= 0xAC00 && cp <= 0xD7A3) return true;   // Hangul syllables (a following jamo is not)
  if (cp >= 0xFF01 && cp <= 0xFFEF) return true;   // full/half-width forms
  return false;
}

std::string utf8proc_normalize(std::string_view text, int options);

// NFC of `text`, running utf8proc only on the stretches that need it. The start of an inert
// character is a safe cut point: nothing before it can reorder or compose across it, so
// NFC(a + b) == NFC(a) + NFC(b) when b starts with an inert character. Each stretch reaches
// back to the inert character before the first non-inert one (it may compose with it: e + ◌́)
// and forward to the next inert character.
std::string nfc_by_stretches(std::string_view text) {
  std::string out;
  size_t copied = 0;         // text[0, copied) is already in `out`
  size_t last_boundary = 0;  // start of the last inert character seen (or of the text)
  size_t pos = 0;
  bool changed = false;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      last_boundary = pos++;
      continue;
    }
    char32_t cp = 0;
    size_t length = decode_utf8(text, pos, cp);
    if (length == 0) length = 1;  // cannot happen: input is repaired UTF-8
    if (is_nfc_inert(cp)) {
      last_boundary = pos;
      pos += length;
      continue;
    }
    const size_t stretch_begin = std::max(last_boundary, copied);
    size_t stretch_end = pos + length;
    while (stretch_end < text.size()) {
      if (static_cast<uint8_t>(text[stretch_end]) < 0x80) break;
      size_t next_length = decode_utf8(text, stretch_end, cp);
      if (next_length == 0) next_length = 1;
      if (is_nfc_inert(cp)) break;
      stretch_end += next_length;
    }
    if (!changed) {
      out.reserve(text.size() + 16);
      changed = true;
    }
    out.append(text.substr(copied, stretch_begin - copied));
    out.append(utf8proc_normalize(text.substr(stretch_begin, stretch_end - stretch_begin),
                                  UTF8PROC_COMPOSE));
    copied = pos = last_boundary = stretch_end;
  }
  if (!changed) return std::string(text);
  out.append(text.substr(copied));
  return out;
}

std::string utf8proc_normalize(std::string_view text, int options) {
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (length < 0) return std::string(text);  // invalid UTF-8 cannot reach here (input is repaired)
  std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(length));
  std::free(result);
  return out;
}

std::string to_lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp = 0;
    const size_t length = decode_utf8(text, pos, cp);
    if (length == 0) {
      out.push_back(text[pos++]);
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
    pos += length;
  }
  return out;
}

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

void strip_whitespace(std::string& text, bool left, bool right) {
  if (right) {
    while (!text.empty()) {
      size_t start = text.size() - 1;
      while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      char32_t cp = 0;
      if (decode_utf8(text, start, cp) == 0 || !is_unicode_whitespace(cp)) break;
      text.resize(start);
    }
  }
  if (left) {
    size_t pos = 0;
    while (pos < text.size()) {
      char32_t cp = 0;
      const size_t length = decode_utf8(text, pos, cp);
      if (length == 0 || !is_unicode_whitespace(cp)) break;
      pos += length;
    }
    text.erase(0, pos);
  }
}

}  // namespace

std::string to_nfc(std::string_view text) { return nfc_by_stretches(text); }

Status Normalizer::add_step(const nlohmann::json& spec, std::string_view where, const std::string& type,
                            std::vector<Step>& steps) {
  if (type == "NFC") { steps.push_back(Step{.kind = Kind::kNfc}); return ok_status(); }
  if (type == "NFD") { steps.push_back(Step{.kind = Kind::kNfd}); return ok_status(); }
  if (type == "NFKC") { steps.push_back(Step{.kind = Kind::kNfkc}); return ok_status(); }
  if (type == "NFKD") { steps.push_back(Step{.kind = Kind::kNfkd}); return ok_status(); }
  if (type == "Lowercase") { steps.push_back(Step{.kind = Kind::kLowercase}); return ok_status(); }
  if (type == "Prepend") {
    if (!spec.contains("prepend") || !spec["prepend"].is_string()) {
      return data_loss_error("{}.prepend: expected a string", where);
    }
    steps.push_back(Step{.kind = Kind::kPrepend, .text = spec["prepend"].get<std::string>()});
    return ok_status();
  }
  if (type == "Strip") {
    Step step{.kind = Kind::kStrip};
    step.strip_left = spec.value("strip_left", true);
    step.strip_right = spec.value("strip_right", true);
    steps.push_back(step);
    return ok_status();
  }
  if (type == "Replace") {
    if (!spec.contains("content") || !spec["content"].is_string() || !spec.contains("pattern") ||
        !spec["pattern"].is_object()) {
      return data_loss_error("{}: Replace needs \"pattern\" and a string \"content\"", where);
    }
    const auto& pattern = spec["pattern"];
    if (pattern.contains("String") && pattern["String"].is_string()) {
      Step step{.kind = Kind::kReplace, .text = spec["content"].get<std::string>()};
      step.literal = pattern["String"].get<std::string>();
      if (step.literal.empty()) return data_loss_error("{}.pattern.String: empty", where);
      steps.push_back(std::move(step));
      return ok_status();
    }
    StatusOr<Pcre2Regex> regex = invalid_argument_error("unset");
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex = Pcre2Regex::compile(pattern["Regex"].get<std::string>());
    } else {
      return data_loss_error("{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    }
    if (!regex.ok()) return regex.status().with_context(fmt::format("{}.pattern", where));
    steps.push_back(Step{.kind = Kind::kReplace,
                         .text = spec["content"].get<std::string>(),
                         .pattern = std::make_shared<const Pcre2Regex>(std::move(regex).value())});
    return ok_status();
  }
  return unimplemented_error("{}: normalizer type \"{}\" is not supported", where, type);
}

StatusOr<Normalizer> Normalizer::from_json(const nlohmann::json& spec, std::string_view where) {
  Normalizer normalizer;
  PAGODA_RETURN_IF_ERROR(for_each_component(
      spec, where, "normalizers", [&](const nlohmann::json& component, std::string_view component_where,
                                   const std::string& type) {
        return add_step(component, component_where, type, normalizer.steps_);
      }));
  return normalizer;
}

void Normalizer::normalize(std::string& text) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kNfc:
        text = nfc_by_stretches(text);
        break;
      case Kind::kNfd:
        text = utf8proc_normalize(text, UTF8PROC_DECOMPOSE);
        break;
      case Kind::kNfkc:
        text = utf8proc_normalize(text, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        break;
      case Kind::kNfkd:
        text = utf8proc_normalize(text, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
        break;
      case Kind::kLowercase:
        text = to_lowercase(text);
        break;
      case Kind::kPrepend:
        // HF prepends only to non-empty text.
        if (!text.empty()) text.insert(0, step.text);
        break;
      case Kind::kStrip:
        strip_whitespace(text, step.strip_left, step.strip_right);
        break;
      case Kind::kReplace: {
        if (!step.literal.empty()) {
          if (text.find(step.literal) == std::string::npos) break;
          std::string out;
          out.reserve(text.size() + text.size() / 4);
          size_t pos = 0;
          for (size_t hit; (hit = text.find(step.literal, pos)) != std::string::npos;) {
            out.append(text, pos, hit - pos).append(step.text);
            pos = hit + step.literal.size();
          }
          out.append(text, pos, std::string::npos);
          text = std::move(out);
          break;
        }
        std::string out;
        size_t pos = 0, begin = 0, end = 0;
        bool changed = false;
        while (pos <= text.size() && step.pattern->find(text, pos, begin, end)) {
          if (end == begin) {  // an empty match replaces nothing; step over one character
            if (begin >= text.size()) break;
            const size_t length = std::max<size_t>(1, utf8_char_length(text, begin));
            out.append(text, pos, begin + length - pos);
            pos = begin + length;
            changed = true;
            continue;
          }
          out.append(text, pos, begin - pos);
          out.append(step.text);
          pos = end;
          changed = true;
        }
        if (changed) {
          out.append(text, std::min(pos, text.size()), std::string::npos);
          text = std::move(out);
        }
        break;
      }
    }
  }
}

}  // namespace pagoda::tokenizer
