#include "pagoda/router/backend_url.h"

#include <charconv>

#include <fmt/format.h>

namespace pagoda::router {

StatusOr<BackendUrl> parse_backend_url(std::string_view url) {
  const std::string shown(url.substr(0, 200));
  std::string_view rest = url;
  if (rest.starts_with("https://"))
    return invalid_argument_error("backend '{}': https is not supported; give the replica's plain http:// address",
                                  shown);
  if (rest.starts_with("http://")) rest.remove_prefix(7);
  else if (rest.find("://") != std::string_view::npos)
    return invalid_argument_error("backend '{}': only http:// URLs are supported", shown);
  if (rest.ends_with("/")) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos)
    return invalid_argument_error("backend '{}': a backend URL takes no path (the router adds /v1/...)", shown);

  BackendUrl out;
  std::string_view port_text;
  if (rest.starts_with("[")) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return invalid_argument_error("backend '{}': unclosed '[' in the host", shown);
    out.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return invalid_argument_error("backend '{}': expected ':PORT' after ']'", shown);
      port_text = after.substr(1);
      if (port_text.empty()) return invalid_argument_error("backend '{}': empty port", shown);
    }
  } else {
    const size_t colon = rest.rfind(':');
    if (colon != std::string_view::npos) {
      if (rest.find(':') != colon)
        return invalid_argument_error("backend '{}': write an IPv6 host in brackets, e.g. http://[::1]:8000", shown);
      port_text = rest.substr(colon + 1);
      rest = rest.substr(0, colon);
      if (port_text.empty()) return invalid_argument_error("backend '{}': empty port", shown);
    }
    out.host = std::string(rest);
  }
  if (out.host.empty()) return invalid_argument_error("backend '{}': no host", shown);
  if (!port_text.empty()) {
    int port = 0;
    const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 || port > 65535)
      return invalid_argument_error("backend '{}': port must be an integer in [1, 65535]", shown);
    out.port = port;
  }
  const bool v6 = out.host.find(':') != std::string::npos;
  out.text = v6 ? fmt::format("http://[{}]:{}", out.host, out.port) : fmt::format("http://{}:{}", out.host, out.port);
  return out;
}

}  // namespace pagoda::router
