#pragma once
// Isolation inside a tenant: the KV namespace of one request, from its key's
// identity and its X-Pagoda-User header (api_keys.h, UserSalt).
//
//  - A key with "user_salt": true (or "required") may name the end user the
//    request is for; the id is mixed into the namespace, so two users of one
//    tenant never share a KV block (device or host tier: the prefix cache
//    compares whole namespaces on every match).
//  - A key without the right that sends the header gets 403
//    user_salt_not_allowed naming the header: a client cannot move itself into
//    another user's namespace, nor learn anything from trying.
//  - A malformed id (empty, over kMaxUserIdBytes, bytes outside visible ASCII)
//    is 400 naming the header; a "required" key without the header is 400
//    user_required.
// Without api keys every caller is one trust domain and may salt.
//
// Thread safety: pure functions.

#include <string>
#include <variant>

#include "pagoda/server/api_error.h"
#include "pagoda/server/api_keys.h"
#include "pagoda/server/http_message.h"

namespace pagoda::server {

struct RequestNamespace {
  std::string cache_namespace;  // ApiKeyStore::cache_namespace(tenant, user)
  std::string user;             // empty: the tenant's own namespace
};

std::variant<RequestNamespace, ApiError> request_namespace(const KeyIdentity& identity, const HttpRequest& request);

}  // namespace pagoda::server
