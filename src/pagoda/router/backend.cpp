#include "pagoda/router/backend.h"

namespace pagoda::router {

Backend::Backend(BackendUrl url, const BackendOptions& options)
    : url_(std::move(url)), pool_(url_.host, url_.port, options.max_connections, options.connect_timeout) {}

std::optional<BackendLoad> Backend::reported_load() const {
  std::lock_guard lock(load_mutex_);
  return load_;
}

void Backend::set_reported_load(std::optional<BackendLoad> load) {
  std::lock_guard lock(load_mutex_);
  load_ = load;
}

}  // namespace pagoda::router
