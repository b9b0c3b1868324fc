#include "pagoda/tokenizer/post_processor.h"

#include <nlohmann/json.hpp>

namespace pagoda::tokenizer {
namespace {

struct Template {
  std::vector<int32_t> prefix, suffix;
};

Status add_template(const nlohmann::json& spec, std::string_view where, Template& out) {
  if (spec.is_null()) return ok_status();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return data_loss_error("{}: expected an object with a string \"type\"", where);
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    if (!spec.contains("processors") || !spec["processors"].is_array()) {
      return data_loss_error("{}.processors: expected an array", where);
    }
    // Each processor wraps the result of the previous one.
    for (size_t i = 0; i < spec["processors"].size(); ++i) {
      Template inner;
      PAGODA_RETURN_IF_ERROR(
          add_template(spec["processors"][i], fmt::format("{}.processors[{}]", where, i), inner));
      out.prefix.insert(out.prefix.begin(), inner.prefix.begin(), inner.prefix.end());
      out.suffix.insert(out.suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
    return ok_status();
  }
  if (type == "ByteLevel") return ok_status();
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]
    for (const char* field : {"cls", "sep"}) {
      if (!spec.contains(field) || !spec[field].is_array() || spec[field].size() != 2 ||
          !spec[field][1].is_number_integer()) {
        return data_loss_error("{}.{}: expected [token, id]", where, field);
      }
    }
    out.prefix.insert(out.prefix.begin(), spec["cls"][1].get<int32_t>());
    out.suffix.push_back(spec["sep"][1].get<int32_t>());
    return ok_status();
  }
  if (type == "TemplateProcessing") {
    if (!spec.contains("single") || !spec["single"].is_array()) {
      return data_loss_error("{}.single: expected an array", where);
    }
    const auto& special_tokens = spec.value("special_tokens", nlohmann::json::object());
    Template local;
    bool seen_sequence = false;
    for (size_t i = 0; i < spec["single"].size(); ++i) {
      const auto& item = spec["single"][i];
      const std::string item_where = fmt::format("{}.single[{}]", where, i);
      if (item.contains("Sequence")) {
        if (seen_sequence) return unimplemented_error("{}: a second Sequence item", item_where);
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string()) {
        return data_loss_error("{}: expected {{\"SpecialToken\": {{\"id\": ...}}}} or Sequence",
                               item_where);
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!special_tokens.contains(name) || !special_tokens[name].contains("ids") ||
          !special_tokens[name]["ids"].is_array()) {
        return data_loss_error("{}.special_tokens: no ids for \"{}\" used by {}", where, name,
                               item_where);
      }
      auto& target = seen_sequence ? local.suffix : local.prefix;
      for (const auto& id : special_tokens[name]["ids"]) {
        if (!id.is_number_integer()) {
          return data_loss_error("{}.special_tokens[\"{}\"].ids: expected integers", where, name);
        }
        target.push_back(id.get<int32_t>());
      }
    }
    if (!seen_sequence) return data_loss_error("{}.single: no {{\"Sequence\": ...}} item", where);
    out.prefix.insert(out.prefix.begin(), local.prefix.begin(), local.prefix.end());
    out.suffix.insert(out.suffix.end(), local.suffix.begin(), local.suffix.end());
    return ok_status();
  }
  return unimplemented_error("{}: post_processor type \"{}\" is not supported", where, type);
}

}  // namespace

StatusOr<PostProcessor> PostProcessor::from_json(const nlohmann::json& spec,
                                                 std::string_view where) {
  Template wrap;
  PAGODA_RETURN_IF_ERROR(add_template(spec, where, wrap));
  PostProcessor processor;
  processor.prefix_ = std::move(wrap.prefix);
  processor.suffix_ = std::move(wrap.suffix);
  return processor;
}

void PostProcessor::apply(std::vector<int32_t>& ids) const {
  if (!prefix_.empty()) ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
}

}  // namespace pagoda::tokenizer
