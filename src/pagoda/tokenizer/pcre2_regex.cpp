#include "pagoda/tokenizer/pcre2_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace pagoda::tokenizer {
namespace {

// Oniguruma's Unicode \s: the White_Space property (no U+180E, unlike PCRE2's \s).
constexpr std::string_view kWhiteSpaceRanges =
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"
    "\\x{205f}\\x{3000}";

// Match data and a JIT stack per thread: creating them per call would cost more than a match.
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* match_context = nullptr;
  ThreadMatchState() {
    match_data = pcre2_match_data_create(1, nullptr);
    // Big enough for long runs under backtracking alternatives (\s+(?!\S) on megabytes of
    // spaces); grows on demand up to the max.
    jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    match_context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_match_context_free(match_context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(match_data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Pcre2Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

std::string rewrite_oniguruma_whitespace(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 's') {
        if (in_class) {
          out.append(kWhiteSpaceRanges);
        } else {
          out.append("[").append(kWhiteSpaceRanges).append("]");
        }
        ++i;
        continue;
      }
      if (next == 'S' && !in_class) {
        out.append("[^").append(kWhiteSpaceRanges).append("]");
        ++i;
        continue;
      }
      // Any other escape (including \S inside a class, left to PCRE2) is copied as is.
      out.push_back(c);
      out.push_back(next);
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out.push_back('^');
        ++i;
      }
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') {
        out.push_back(']');
        ++i;
      }
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
  }
  return out;
}

StatusOr<Pcre2Regex> Pcre2Regex::compile(std::string_view pattern) {
  const std::string rewritten = rewrite_oniguruma_whitespace(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return invalid_argument_error("regex '{}' does not compile: {} (at offset {} of '{}')", pattern,
                                  reinterpret_cast<const char*>(message), error_offset, rewritten);
  }
  auto holder = std::make_shared<Code>();
  holder->code = code;
  holder->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return Pcre2Regex(std::move(holder), std::string(pattern));
}

StatusOr<Pcre2Regex> Pcre2Regex::compile_literal(std::string_view literal) {
  std::string quoted = "\\Q";
  // \E inside \Q...\E would end the quote early: split it.
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal[i] == '\\' && i + 1 < literal.size() && literal[i + 1] == 'E') {
      quoted.append("\\E\\\\\\QE");
      ++i;
    } else {
      quoted.push_back(literal[i]);
    }
  }
  quoted.append("\\E");
  auto compiled = compile(quoted);
  if (!compiled.ok()) return compiled.status();
  compiled->pattern_ = std::string(literal);
  return compiled;
}

bool Pcre2Regex::find(std::string_view subject, size_t start, size_t& match_begin,
                      size_t& match_end) const {
  if (start > subject.size()) return false;
  ThreadMatchState& state = thread_match_state();
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (code_->jit) {
    rc = pcre2_jit_match(code_->code, data, subject.size(), start, PCRE2_NO_UTF_CHECK,
                         state.match_data, state.match_context);
  } else {
    rc = pcre2_match(code_->code, data, subject.size(), start, PCRE2_NO_UTF_CHECK,
                     state.match_data, state.match_context);
  }
  if (rc < 0) return false;  // no match (or a resource limit: treated as no match)
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
  match_begin = ovector[0];
  match_end = ovector[1];
  return true;
}

}  // namespace pagoda::tokenizer
