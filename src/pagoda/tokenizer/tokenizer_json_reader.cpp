#include "pagoda/tokenizer/tokenizer_json_reader.h"

#include <charconv>
#include <cstring>

#include "pagoda/tokenizer/utf8.h"

namespace pagoda::tokenizer {
namespace {

class Reader {
 public:
  Reader(std::string_view text, std::string_view name, TokenizerJson& out)
      : text_(text), name_(name), out_(out) {}

  Status read_document() {
    skip_space();
    PAGODA_RETURN_IF_ERROR(read_value(out_.document, Path::kRoot));
    skip_space();
    if (pos_ != text_.size()) return error("unexpected data after the JSON value");
    return ok_status();
  }

 private:
  // Where the value being read sits: only model.vocab / model.merges are special.
  enum class Path { kRoot, kModel, kOther };

  Status error(std::string_view what) const {
    return data_loss_error("{}: invalid JSON at byte {}: {}", name_, pos_, what);
  }

  void skip_space() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
      ++pos_;
    }
  }

  bool consume(char expected) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == expected) {
      ++pos_;
      return true;
    }
    return false;
  }

  Status read_hex4(uint32_t& value) {
    if (pos_ + 4 > text_.size()) return error("truncated \\u escape");
    value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') value |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') value |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') value |= static_cast<uint32_t>(c - 'A' + 10);
      else return error("bad hex digit in \\u escape");
    }
    return ok_status();
  }

  // Reads a string (pos_ at the opening quote) into `out`.
  Status read_string(std::string& out) {
    if (pos_ >= text_.size() || text_[pos_] != '"') return error("expected a string");
    ++pos_;
    out.clear();
    while (true) {
      // Copy the plain run up to the next quote or backslash in one go.
      size_t run_end = pos_;
      while (run_end < text_.size() && text_[run_end] != '"' && text_[run_end] != '\\') {
        if (static_cast<uint8_t>(text_[run_end]) < 0x20) {
          pos_ = run_end;
          return error("control character inside a string");
        }
        ++run_end;
      }
      out.append(text_.data() + pos_, run_end - pos_);
      pos_ = run_end;
      if (pos_ >= text_.size()) return error("unterminated string");
      if (text_[pos_] == '"') {
        ++pos_;
        if (!is_valid_utf8(out)) return error("string is not valid UTF-8");
        return ok_status();
      }
      ++pos_;  // backslash
      if (pos_ >= text_.size()) return error("unterminated escape");
      const char escape = text_[pos_++];
      switch (escape) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t unit = 0;
          PAGODA_RETURN_IF_ERROR(read_hex4(unit));
          if (unit >= 0xD800 && unit <= 0xDBFF) {
            if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
              return error("lone high surrogate in \\u escape");
            }
            pos_ += 2;
            uint32_t low = 0;
            PAGODA_RETURN_IF_ERROR(read_hex4(low));
            if (low < 0xDC00 || low > 0xDFFF) return error("bad low surrogate in \\u escape");
            unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
          } else if (unit >= 0xDC00 && unit <= 0xDFFF) {
            return error("lone low surrogate in \\u escape");
          }
          append_utf8(out, unit);
          break;
        }
        default:
          return error("unknown escape");
      }
    }
  }

  Status read_number(nlohmann::json& value) {
    const size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    bool is_integer = true;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        is_integer = false;
        ++pos_;
      } else {
        break;
      }
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (first == last) return error("expected a value");
    if (is_integer) {
      int64_t integer = 0;
      auto [ptr, ec] = std::from_chars(first, last, integer);
      if (ec == std::errc() && ptr == last) {
        value = integer;
        return ok_status();
      }
      uint64_t unsigned_integer = 0;
      auto [uptr, uec] = std::from_chars(first, last, unsigned_integer);
      if (uec == std::errc() && uptr == last) {
        value = unsigned_integer;
        return ok_status();
      }
      // Too large for 64 bits (e.g. model_max_length 1e30 written as digits): keep as double.
    }
    double real = 0;
    auto [ptr, ec] = std::from_chars(first, last, real);
    if (ptr != last || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
      pos_ = start;
      return error("bad number");
    }
    value = real;
    return ok_status();
  }

  bool read_literal(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  Status read_value(nlohmann::json& value, Path path) {
    skip_space();
    if (pos_ >= text_.size()) return error("unexpected end of input");
    if (++depth_ > 512) return error("nested too deeply");
    Status status;
    const char c = text_[pos_];
    if (c == '{') {
      status = read_object(value, path);
    } else if (c == '[') {
      status = read_array(value);
    } else if (c == '"') {
      std::string s;
      status = read_string(s);
      value = std::move(s);
    } else if (read_literal("true")) {
      value = true;
    } else if (read_literal("false")) {
      value = false;
    } else if (read_literal("null")) {
      value = nullptr;
    } else {
      status = read_number(value);
    }
    --depth_;
    return status;
  }

  Status read_object(nlohmann::json& value, Path path) {
    ++pos_;  // '{'
    value = nlohmann::json::object();
    if (consume('}')) return ok_status();
    std::string key;
    while (true) {
      skip_space();
      PAGODA_RETURN_IF_ERROR(read_string(key));
      if (!consume(':')) return error("expected ':' after an object key");
      if (path == Path::kModel && key == "vocab") {
        skip_space();
        PAGODA_RETURN_IF_ERROR(read_vocab());
        out_.has_vocab = true;
      } else if (path == Path::kModel && key == "merges") {
        skip_space();
        PAGODA_RETURN_IF_ERROR(read_merges());
        out_.has_merges = true;
      } else {
        nlohmann::json member;
        const Path child = path == Path::kRoot && key == "model" ? Path::kModel : Path::kOther;
        PAGODA_RETURN_IF_ERROR(read_value(member, child));
        value[key] = std::move(member);  // a repeated key keeps the last value, like nlohmann
      }
      if (consume(',')) continue;
      if (consume('}')) return ok_status();
      return error("expected ',' or '}' in an object");
    }
  }

  Status read_array(nlohmann::json& value) {
    ++pos_;  // '['
    value = nlohmann::json::array();
    if (consume(']')) return ok_status();
    while (true) {
      nlohmann::json element;
      PAGODA_RETURN_IF_ERROR(read_value(element, Path::kOther));
      value.push_back(std::move(element));
      if (consume(',')) continue;
      if (consume(']')) return ok_status();
      return error("expected ',' or ']' in an array");
    }
  }

  Status read_vocab() {
    if (!consume('{')) return error("model.vocab: expected an object");
    out_.vocab.reserve(text_.size() / 24);
    if (consume('}')) return ok_status();
    std::string key;
    while (true) {
      skip_space();
      PAGODA_RETURN_IF_ERROR(read_string(key));
      if (!consume(':')) return error("expected ':' after a vocab token");
      skip_space();
      nlohmann::json id;
      PAGODA_RETURN_IF_ERROR(read_number(id));
      if (!id.is_number_integer()) return error("model.vocab: ids must be integers");
      out_.vocab.emplace_back(key, id.get<int64_t>());
      if (consume(',')) continue;
      if (consume('}')) return ok_status();
      return error("expected ',' or '}' in model.vocab");
    }
  }

  Status read_merges() {
    if (!consume('[')) return error("model.merges: expected an array");
    if (consume(']')) return ok_status();
    std::string left, right;
    while (true) {
      skip_space();
      if (pos_ < text_.size() && text_[pos_] == '"') {
        // "left right": exactly one space, as HF requires.
        PAGODA_RETURN_IF_ERROR(read_string(left));
        const size_t space = left.find(' ');
        if (space == std::string::npos || left.find(' ', space + 1) != std::string::npos) {
          return error(fmt::format("model.merges[{}]: \"{}\" is not \"<left> <right>\"",
                                   out_.merges.size(), left));
        }
        out_.merges.emplace_back(left.substr(0, space), left.substr(space + 1));
      } else if (consume('[')) {
        skip_space();
        PAGODA_RETURN_IF_ERROR(read_string(left));
        if (!consume(',')) return error("model.merges: expected [\"left\", \"right\"]");
        skip_space();
        PAGODA_RETURN_IF_ERROR(read_string(right));
        if (!consume(']')) return error("model.merges: expected [\"left\", \"right\"]");
        out_.merges.emplace_back(left, right);
      } else {
        return error(fmt::format("model.merges[{}]: expected \"a b\" or [\"a\", \"b\"]",
                                 out_.merges.size()));
      }
      if (consume(',')) continue;
      if (consume(']')) return ok_status();
      return error("expected ',' or ']' in model.merges");
    }
  }

  std::string_view text_;
  std::string_view name_;
  TokenizerJson& out_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<TokenizerJson> read_tokenizer_json(std::string_view text, std::string_view name) {
  TokenizerJson out;
  Reader reader(text, name, out);
  PAGODA_RETURN_IF_ERROR(reader.read_document());
  if (!out.document.is_object()) return data_loss_error("{}: expected a JSON object", name);
  return out;
}

Status for_each_component(const nlohmann::json& spec, std::string_view where, std::string_view list_field,
                          const ComponentVisitor& add_one) {
  if (spec.is_null()) return ok_status();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return data_loss_error("{}: expected an object with a string \"type\"", where);
  }
  const std::string type = spec["type"].get<std::string>();
  if (type != "Sequence") return add_one(spec, where, type);
  auto list = spec.find(list_field);
  if (list == spec.end() || !list->is_array()) {
    return data_loss_error("{}.{}: expected an array", where, list_field);
  }
  for (size_t i = 0; i < list->size(); ++i) {
    PAGODA_RETURN_IF_ERROR(
        for_each_component((*list)[i], fmt::format("{}.{}[{}]", where, list_field, i), list_field, add_one));
  }
  return ok_status();
}

}  // namespace pagoda::tokenizer
