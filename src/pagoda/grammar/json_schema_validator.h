#pragma once
// A small JSON Schema (draft 2020-12) validator: the referee for constrained decoding's tests
// (every output must validate) and a check a caller can run on any output. No Debian package
// provides one for C++.
//
// Keywords: type, enum, const, anyOf, oneOf, allOf, not, $ref (inside the schema: "#",
// "#/$defs/...", "#/definitions/..."), properties, required, additionalProperties,
// minProperties, maxProperties, items, prefixItems, minItems, maxItems, uniqueItems,
// minLength, maxLength (in code points), pattern (searched, through PCRE2), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, multipleOf, and boolean schemas. format and other
// annotations are not assertions (the standard's default). Unknown keywords are ignored.
// Keywords this validator does not know but that assert (if/then/else, dependent*, contains,
// unevaluated*, propertyNames, patternProperties) make validate() fail with UNIMPLEMENTED, so a
// test never passes by ignoring them.
//
// Numbers: 1.0 is an integer (the standard says so); comparisons are in double precision.
//
// Thread safety: stateless functions.

#include <string>

#include <nlohmann/json.hpp>

#include "pagoda/core/status.h"

namespace pagoda::grammar {

// OK when `instance` is valid; INVALID_ARGUMENT naming the first failing instance path and
// keyword otherwise (e.g. "$.age: 17 is below minimum 18 (schema #/properties/age/minimum)").
Status validate_json_schema(const nlohmann::json& instance, const nlohmann::json& schema);

}  // namespace pagoda::grammar
