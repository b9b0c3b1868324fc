#pragma once
// JSON Schema -> grammar for `response_format: {type: "json_schema"}` and for tool arguments.
// Every output the grammar admits is a JSON value that validates against the schema (the tests
// check that with json_schema_validator.h); it admits a useful subset of the valid outputs.
//
// Supported: type (one or a list), enum, const, anyOf, oneOf (read as anyOf: keep its branches
// disjoint), allOf with one schema, $ref to "#", "#/$defs/..." and "#/definitions/..." (recursion
// included); objects: properties, required, additionalProperties (false, or a schema when there
// are no properties); arrays: items, prefixItems, minItems, maxItems; strings: minLength,
// maxLength, pattern, format date / time / date-time / uuid (other formats are annotations, as
// the standard says); integers: minimum 0 or 1 (no maximum); numbers: minimum 0. Annotations
// (title, description, default, examples, $schema, $id, $comment, ...) and unknown keywords are
// ignored, as validators ignore them.
//
// Shape of the output: properties in the order the schema lists them, required ones always,
// optional ones maybe; no properties beyond those listed (a valid subset when
// additionalProperties is absent or true); whitespace is at most one space or one newline with
// indentation between tokens; numbers have at most 16 digits before and after the point.
//
// Validation keywords the grammar cannot enforce (minimum/maximum in general, multipleOf,
// uniqueItems, contains, patternProperties, propertyNames, not, if/then/else, dependent*,
// unevaluated*, minProperties/maxProperties beyond the required count, a pattern together with a
// length) are INVALID_ARGUMENT naming the schema path, e.g.
// "response_format.json_schema.schema.properties.age.maximum: not supported ...".
//
// Thread safety: stateless functions.

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pagoda/core/status.h"
#include "pagoda/grammar/grammar.h"

namespace pagoda::grammar {

// `where` prefixes every error path (the request field holding the schema). Properties come out in
// the order of the schema's "properties" object, which an ordered_json keeps (parse the request
// with nlohmann::ordered_json); a plain json sorts them by name.
StatusOr<std::shared_ptr<const Grammar>> json_schema_to_grammar(const nlohmann::ordered_json& schema,
                                                                std::string_view where);
StatusOr<std::shared_ptr<const Grammar>> json_schema_to_grammar(const nlohmann::json& schema,
                                                                std::string_view where);

// Values of a schema inside literal text, for tool calls in a chat template's syntax:
//   open item (separator item){min_items - 1, max_items - 1} close,  item = item_prefix VALUE item_suffix
// e.g. Hermes blocks: item_prefix "<tool_call>\n", item_suffix "\n</tool_call>", separator "\n".
struct JsonFraming {
  std::string open, close, item_prefix, item_suffix, separator;
  uint32_t min_items = 1;
  uint32_t max_items = 1;  // kUnbounded for no limit
};
StatusOr<std::shared_ptr<const Grammar>> framed_json_schema_grammar(const nlohmann::ordered_json& schema,
                                                                    std::string_view where,
                                                                    const JsonFraming& framing);

// Any JSON object (`response_format: {type: "json_object"}`).
std::shared_ptr<const Grammar> json_object_grammar();

}  // namespace pagoda::grammar
