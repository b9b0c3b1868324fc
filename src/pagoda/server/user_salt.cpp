#include "pagoda/server/user_salt.h"

#include <fmt/format.h>

namespace pagoda::server {

std::variant<RequestNamespace, ApiError> request_namespace(const KeyIdentity& identity, const HttpRequest& request) {
  const std::string param(kUserSaltHeader);
  if (!request.has_header(kUserSaltHeader)) {
    if (identity.user_salt == UserSalt::kRequired)
      return invalid_request(fmt::format("this api key must name the end user of every request in the {} header",
                                         kUserSaltHeader),
                             param, "user_required");
    return RequestNamespace{ApiKeyStore::cache_namespace(identity.tenant), {}};
  }
  if (identity.user_salt == UserSalt::kNotAllowed) {
    ApiError e;
    e.http_status = 403;
    e.type = "permission_error";
    e.code = "user_salt_not_allowed";
    e.param = param;
    e.message = fmt::format("this api key may not set the {} header (its api-keys entry lacks \"user_salt\")",
                            kUserSaltHeader);
    return e;
  }
  const std::string_view user = request.header(kUserSaltHeader);
  if (user.empty() || user.size() > kMaxUserIdBytes)
    return invalid_request(fmt::format("the {} header must hold 1 to {} bytes", kUserSaltHeader, kMaxUserIdBytes),
                           param, "invalid_user");
  for (char c : user)
    if (c < 0x21 || c > 0x7e)
      return invalid_request(
          fmt::format("the {} header may hold only visible ASCII characters (no spaces)", kUserSaltHeader), param,
          "invalid_user");
  return RequestNamespace{ApiKeyStore::cache_namespace(identity.tenant, user), std::string(user)};
}

}  // namespace pagoda::server
