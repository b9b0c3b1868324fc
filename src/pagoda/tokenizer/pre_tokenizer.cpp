#include "pagoda/tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "pagoda/tokenizer/tokenizer_json_reader.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

// GPT-2's pattern, used by ByteLevel with use_regex: true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Span {
  size_t begin, end;
  bool is_match;
};

StatusOr<std::shared_ptr<const Pcre2Regex>> compile_pattern(const nlohmann::json& pattern,
                                                            std::string_view where) {
  StatusOr<Pcre2Regex> regex = invalid_argument_error("unset");
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    regex = Pcre2Regex::compile(pattern["Regex"].get<std::string>());
  } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    regex = Pcre2Regex::compile_literal(pattern["String"].get<std::string>());
  } else {
    return data_loss_error("{}: expected {{\"Regex\": ...}} or {{\"String\": ...}}", where);
  }
  if (!regex.ok()) return regex.status().with_context(where);
  return std::make_shared<const Pcre2Regex>(std::move(regex).value());
}

}  // namespace

Status PreTokenizer::add_step(const nlohmann::json& spec, std::string_view where, const std::string& type,
                              std::vector<Step>& steps) {
  Step step;
  if (type == "Split") {
    if (!spec.contains("pattern")) return data_loss_error("{}.pattern: missing", where);
    PAGODA_ASSIGN_OR_RETURN(step.regex,
                            compile_pattern(spec["pattern"], fmt::format("{}.pattern", where)));
    const std::string behavior = spec.value("behavior", std::string("Isolated"));
    if (behavior == "Isolated") step.behavior = Behavior::kIsolated;
    else if (behavior == "Removed") step.behavior = Behavior::kRemoved;
    else if (behavior == "MergedWithPrevious") step.behavior = Behavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = Behavior::kMergedWithNext;
    else if (behavior == "Contiguous") step.behavior = Behavior::kContiguous;
    else return data_loss_error("{}.behavior: unknown value \"{}\"", where, behavior);
    step.invert = spec.value("invert", false);
    steps.push_back(std::move(step));
    return ok_status();
  }
  if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    step.add_prefix_space = spec.value("add_prefix_space", true);
    if (spec.value("use_regex", true)) {
      PAGODA_ASSIGN_OR_RETURN(step.regex,
                              compile_pattern({{"Regex", kGpt2Pattern}}, fmt::format("{}", where)));
    }
    steps.push_back(std::move(step));
    return ok_status();
  }
  if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = spec.value("replacement", std::string("\u2581"));
    if (!is_valid_utf8(step.replacement) || utf8_char_length(step.replacement, 0) != step.replacement.size()) {
      return data_loss_error("{}.replacement: expected one character", where);
    }
    std::string scheme = spec.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = spec.value("add_prefix_space", true) ? "always" : "never";
    if (scheme == "always") step.prepend = Step::Prepend::kAlways;
    else if (scheme == "first") step.prepend = Step::Prepend::kFirst;
    else if (scheme == "never") step.prepend = Step::Prepend::kNever;
    else return data_loss_error("{}.prepend_scheme: unknown value \"{}\"", where, scheme);
    step.split_on_replacement = spec.value("split", true);
    if (step.split_on_replacement) {
      PAGODA_ASSIGN_OR_RETURN(step.regex,
                              compile_pattern({{"String", step.replacement}}, where));
      step.behavior = Behavior::kMergedWithNext;
    }
    steps.push_back(std::move(step));
    return ok_status();
  }
  if (type == "Whitespace") {
    // HF: keep runs of word characters and runs of other non-space characters.
    PAGODA_ASSIGN_OR_RETURN(step.regex, compile_pattern({{"Regex", R"(\w+|[^\w\s]+)"}}, where));
    step.behavior = Behavior::kRemoved;
    step.invert = true;
    steps.push_back(std::move(step));
    return ok_status();
  }
  if (type == "WhitespaceSplit") {
    PAGODA_ASSIGN_OR_RETURN(step.regex, compile_pattern({{"Regex", R"(\s+)"}}, where));
    step.behavior = Behavior::kRemoved;
    steps.push_back(std::move(step));
    return ok_status();
  }
  if (type == "Digits") {
    const bool individual = spec.value("individual_digits", false);
    PAGODA_ASSIGN_OR_RETURN(step.regex, compile_pattern({{"Regex", R"(\p{N})"}}, where));
    step.behavior = individual ? Behavior::kIsolated : Behavior::kContiguous;
    steps.push_back(std::move(step));
    return ok_status();
  }
  return unimplemented_error("{}: pre_tokenizer type \"{}\" is not supported", where, type);
}

StatusOr<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& spec, std::string_view where) {
  PreTokenizer pre_tokenizer;
  PAGODA_RETURN_IF_ERROR(for_each_component(
      spec, where, "pretokenizers", [&](const nlohmann::json& component, std::string_view component_where,
                                   const std::string& type) {
        return add_step(component, component_where, type, pre_tokenizer.steps_);
      }));
  // A ByteLevel step without regex and prefix space changes nothing at the byte level.
  std::erase_if(pre_tokenizer.steps_, [](const Step& step) {
    return step.kind == Kind::kByteLevel && !step.regex && !step.add_prefix_space;
  });
  return pre_tokenizer;
}

void PreTokenizer::pre_tokenize(std::string_view text, bool at_text_start, PieceSink sink) const {
  if (text.empty()) return;
  run_step(0, text, at_text_start, sink);
}

void PreTokenizer::run_step(size_t index, std::string_view piece, bool at_text_start,
                            PieceSink sink) const {
  if (piece.empty()) return;
  if (index == steps_.size()) {
    sink(piece);
    return;
  }
  const Step& step = steps_[index];
  switch (step.kind) {
    case Kind::kSplit:
      run_split(index, step, piece, at_text_start, sink);
      return;
    case Kind::kByteLevel: {
      if (step.add_prefix_space && piece.front() != ' ') {
        std::string prefixed = " ";
        prefixed.append(piece);
        if (step.regex) {
          run_split(index, step, prefixed, at_text_start, sink);
        } else {
          run_step(index + 1, prefixed, at_text_start, sink);
        }
        return;
      }
      if (step.regex) {
        run_split(index, step, piece, at_text_start, sink);
      } else {
        run_step(index + 1, piece, at_text_start, sink);
      }
      return;
    }
    case Kind::kMetaspace: {
      std::string replaced;
      replaced.reserve(piece.size() + 8);
      for (char c : piece) {
        if (c == ' ') replaced.append(step.replacement);
        else replaced.push_back(c);
      }
      const bool starts_with_replacement = replaced.starts_with(step.replacement);
      if (!starts_with_replacement &&
          (step.prepend == Step::Prepend::kAlways ||
           (step.prepend == Step::Prepend::kFirst && at_text_start))) {
        replaced.insert(0, step.replacement);
      }
      if (step.regex) {
        run_split(index, step, replaced, at_text_start, sink);
      } else {
        run_step(index + 1, replaced, at_text_start, sink);
      }
      return;
    }
  }
}

void PreTokenizer::run_split(size_t index, const Step& step, std::string_view piece,
                             bool at_text_start, PieceSink sink) const {
  // Only the first sub-piece still starts at the original text's offset 0.
  bool first = at_text_start;
  auto emit = [&](size_t begin, size_t end) {
    if (end <= begin) return;
    run_step(index + 1, piece.substr(begin, end - begin), first && begin == 0, sink);
  };

  // Fast path (the Llama 3 / Qwen / GPT-2 case): matches and gaps each become a piece.
  if (step.behavior == Behavior::kIsolated ||
      (step.behavior == Behavior::kRemoved)) {
    const bool keep_matches = step.behavior == Behavior::kIsolated || step.invert;
    const bool keep_gaps = step.behavior == Behavior::kIsolated || !step.invert;
    size_t pos = 0, previous_end = 0, begin = 0, end = 0;
    while (pos <= piece.size() && step.regex->find(piece, pos, begin, end)) {
      if (end == begin) {  // empty matches split nothing
        if (begin >= piece.size()) break;
        pos = begin + std::max<size_t>(1, utf8_char_length(piece, begin));
        continue;
      }
      if (keep_gaps) emit(previous_end, begin);
      if (keep_matches) emit(begin, end);
      previous_end = pos = end;
    }
    if (keep_gaps) emit(previous_end, piece.size());
    return;
  }

  std::vector<Span> spans;
  {
    size_t pos = 0, previous_end = 0, begin = 0, end = 0;
    while (pos <= piece.size() && step.regex->find(piece, pos, begin, end)) {
      if (end == begin) {
        if (begin >= piece.size()) break;
        pos = begin + std::max<size_t>(1, utf8_char_length(piece, begin));
        continue;
      }
      if (begin > previous_end) spans.push_back({previous_end, begin, false});
      spans.push_back({begin, end, true});
      previous_end = pos = end;
    }
    if (previous_end < piece.size()) spans.push_back({previous_end, piece.size(), false});
  }
  if (step.invert) {
    for (Span& span : spans) span.is_match = !span.is_match;
  }

  std::vector<Span> merged;
  merged.reserve(spans.size());
  bool previous_match = false;
  switch (step.behavior) {
    case Behavior::kMergedWithPrevious:
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !merged.empty()) {
          merged.back().end = span.end;
        } else {
          merged.push_back(span);
        }
        previous_match = span.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case Behavior::kContiguous:
      for (const Span& span : spans) {
        if (!merged.empty() && span.is_match && previous_match) {
          merged.back().end = span.end;
        } else {
          merged.push_back(span);
        }
        previous_match = span.is_match;
      }
      break;
    case Behavior::kIsolated:
    case Behavior::kRemoved:
      merged = spans;
      break;
  }
  for (const Span& span : merged) emit(span.begin, span.end);
}

}  // namespace pagoda::tokenizer
