#pragma once
// The flags of the hardened HTTP front (server/http_front.h) that `pagoda
// serve` and `pagoda route` share, with one help text and one check:
//
//   --max-connections N (route: --max-client-connections; 0: 90% of the open-file limit)
//   --http-header-timeout S  --http-body-timeout S  --http-keep-alive S   (each in (0, 86400])
//   --shutdown-grace S                                                   (in [0, 86400])
//
// Thread safety: plain functions; call from one thread at start-up.

#include <chrono>
#include <string>

#include <CLI/CLI.hpp>

#include "pagoda/core/status.h"
#include "pagoda/server/http_front.h"

namespace pagoda::cli {

struct HttpFrontFlags {
  int max_connections = 0;
  double header_timeout_s = 10.0;
  double body_timeout_s = 30.0;
  double keep_alive_s = 75.0;
  double shutdown_grace_s = 10.0;
};

// Adds the flags to `cmd`; the connection cap is named `max_connections_flag`
// (route's own --max-connections is its cap per replica).
void add_http_front_flags(CLI::App& cmd, HttpFrontFlags& flags, const std::string& max_connections_flag);

// Checks the flags (kInvalidArgument naming the flag) and writes them into the
// front's config (connection cap and deadlines; the rest is left alone) and
// *shutdown_grace.
Status apply_http_front_flags(const HttpFrontFlags& flags, const std::string& max_connections_flag,
                              server::HttpFrontConfig& front, std::chrono::milliseconds* shutdown_grace);

}  // namespace pagoda::cli
