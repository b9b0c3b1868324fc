#pragma once
// The address of one backend (a `pagoda serve` replica) as given to
// `pagoda route --backend`: "http://HOST:PORT", "http://HOST" (port 80) or
// "HOST:PORT"; IPv6 hosts in brackets ("http://[::1]:8000"); a trailing "/" is
// allowed, any other path is not (the router appends the request's path).
// https is refused: the router talks plain HTTP to replicas beside it.
//
// Thread safety: values and a pure function.

#include <string>
#include <string_view>

#include "pagoda/core/status.h"

namespace pagoda::router {

struct BackendUrl {
  std::string host;  // without brackets
  int port = 80;
  std::string text;  // normalized "http://host:port", for logs and metric labels
};

// kInvalidArgument naming the URL and what is wrong with it.
StatusOr<BackendUrl> parse_backend_url(std::string_view url);

}  // namespace pagoda::router
