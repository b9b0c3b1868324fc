#include "pagoda/cli/http_front_flags.h"

#include <algorithm>
#include <cstdint>

namespace pagoda::cli {

void add_http_front_flags(CLI::App& cmd, HttpFrontFlags& flags, const std::string& max_connections_flag) {
  cmd.add_option(max_connections_flag, flags.max_connections,
                 "Most open client connections; past it, 503 and close (0: 90% of the open-file limit)")
      ->capture_default_str();
  cmd.add_option("--http-header-timeout", flags.header_timeout_s,
                 "Seconds for a whole request line + headers to arrive (not per read)")
      ->capture_default_str();
  cmd.add_option("--http-body-timeout", flags.body_timeout_s, "Seconds for a whole request body to arrive")
      ->capture_default_str();
  cmd.add_option("--http-keep-alive", flags.keep_alive_s, "Seconds an idle keep-alive connection stays open")
      ->capture_default_str();
  cmd.add_option("--shutdown-grace", flags.shutdown_grace_s,
                 "Seconds in-flight requests get on SIGTERM; then every connection closes and the process exits")
      ->capture_default_str();
}

namespace {

// A deadline flag: more than 0 (a zero deadline would close every connection at once), at most a day.
StatusOr<std::chrono::milliseconds> deadline(double seconds, const char* flag) {
  if (!(seconds > 0.0) || seconds > 86400.0)
    return invalid_argument_error("{} {}: must be in (0, 86400] seconds", flag, seconds);
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000.0)));
}

}  // namespace

Status apply_http_front_flags(const HttpFrontFlags& flags, const std::string& max_connections_flag,
                              server::HttpFrontConfig& front, std::chrono::milliseconds* shutdown_grace) {
  if (flags.max_connections < 0)
    return invalid_argument_error("{} {}: must be >= 0", max_connections_flag, flags.max_connections);
  if (!(flags.shutdown_grace_s >= 0.0) || flags.shutdown_grace_s > 86400.0)
    return invalid_argument_error("--shutdown-grace {}: must be in [0, 86400] seconds", flags.shutdown_grace_s);
  PAGODA_ASSIGN_OR_RETURN(front.header_timeout, deadline(flags.header_timeout_s, "--http-header-timeout"));
  PAGODA_ASSIGN_OR_RETURN(front.body_timeout, deadline(flags.body_timeout_s, "--http-body-timeout"));
  PAGODA_ASSIGN_OR_RETURN(front.keep_alive_timeout, deadline(flags.keep_alive_s, "--http-keep-alive"));
  front.max_connections = flags.max_connections;
  *shutdown_grace = std::chrono::milliseconds(static_cast<int64_t>(flags.shutdown_grace_s * 1000.0));
  return ok_status();
}

}  // namespace pagoda::cli
